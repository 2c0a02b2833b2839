//! Recorded sessions on disk (`DIR/YYYY-MM-DD/SESSION_ID/`): finding them for the HTTP
//! routes, with every name from a URL validated, and the retention sweep.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde_json::Value;

/// A session id as it may appear in a URL: letters, digits, `_` and `-`.
pub(crate) fn valid_session_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 128 && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// A file of a recording as it may appear in a URL.
pub(crate) fn valid_file(name: &str) -> bool {
    let numbered = |prefix: &str, ext: &str| {
        name.strip_prefix(prefix)
            .and_then(|r| r.strip_suffix(ext))
            .is_some_and(|n| n.len() == 6 && n.bytes().all(|b| b.is_ascii_digit()))
    };
    matches!(name, "meta.json" | "events.jsonl" | "input.wav" | "output.wav")
        || numbered("frames/", ".jpg")
        || numbered("attachments/", ".b64")
}

fn is_date(name: &str) -> bool {
    name.len() == 10
        && name.bytes().enumerate().all(|(i, b)| if i == 4 || i == 7 { b == b'-' } else { b.is_ascii_digit() })
}

/// One recorded session directory.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub id: String,
    pub date: String,
    pub dir: PathBuf,
    /// Finished sessions have a meta.json; its modification time is the session's end.
    pub finished: Option<SystemTime>,
}

/// Every session directory, newest first (by end, then by date and id).
pub(crate) fn entries(root: &Path) -> io::Result<Vec<Entry>> {
    let mut out = Vec::new();
    let dates = match fs::read_dir(root) {
        Ok(d) => d,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e),
    };
    // Only real directories: a symlink (say, a date-named link to elsewhere) is never
    // followed, so the sweep can never delete what it points to.
    let real_dir = |e: &fs::DirEntry| e.file_type().is_ok_and(|t| t.is_dir());
    for date in dates.flatten() {
        let date_name = date.file_name().to_string_lossy().into_owned();
        if !is_date(&date_name) || !real_dir(&date) {
            continue;
        }
        let Ok(sessions) = fs::read_dir(date.path()) else { continue };
        for session in sessions.flatten() {
            let id = session.file_name().to_string_lossy().into_owned();
            if !valid_session_id(&id) || !real_dir(&session) {
                continue;
            }
            let finished = fs::metadata(session.path().join("meta.json")).and_then(|m| m.modified()).ok();
            out.push(Entry { id, date: date_name.clone(), dir: session.path(), finished });
        }
    }
    out.sort_by(|a, b| (b.finished, &b.date, &b.id).cmp(&(a.finished, &a.date, &a.id)));
    Ok(out)
}

/// The directory of a finished session.
pub(crate) fn find(root: &Path, id: &str) -> Option<PathBuf> {
    if !valid_session_id(id) {
        return None;
    }
    let dates = fs::read_dir(root).ok()?;
    dates
        .flatten()
        .filter(|d| is_date(&d.file_name().to_string_lossy()))
        .map(|d| d.path().join(id))
        .find(|dir| dir.join("meta.json").is_file())
}

/// A page of finished sessions with a summary of each.
pub(crate) fn list(root: &Path, page: usize, per_page: usize) -> io::Result<(usize, Vec<Value>)> {
    let finished: Vec<Entry> = entries(root)?.into_iter().filter(|e| e.finished.is_some()).collect();
    let items = finished
        .iter()
        .skip(page.saturating_sub(1) * per_page)
        .take(per_page)
        .map(|e| {
            let meta: Value = fs::read(e.dir.join("meta.json"))
                .ok()
                .and_then(|b| serde_json::from_slice(&b).ok())
                .unwrap_or(Value::Null);
            serde_json::json!({
                "session_id": e.id,
                "date": e.date,
                "mode": meta["mode"],
                "dialect": meta["dialect"],
                "transport": meta["transport"],
                "worker": meta["worker"],
                "start": meta["start"],
                "end": meta["end"],
                "duration_s": meta["duration_s"],
                "close_reason": meta["close_reason"],
            })
        })
        .collect();
    Ok((finished.len(), items))
}

fn size_of_dir(dir: &Path) -> u64 {
    fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| match e.metadata() {
                    Ok(m) if m.is_dir() => size_of_dir(&e.path()),
                    Ok(m) => m.len(),
                    Err(_) => 0,
                })
                .sum()
        })
        .unwrap_or(0)
}

/// The newest modification time of anything in a directory.
fn last_write(dir: &Path) -> Option<SystemTime> {
    fs::read_dir(dir).ok()?.flatten().filter_map(|e| e.metadata().and_then(|m| m.modified()).ok()).max()
}

#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Swept {
    pub deleted: usize,
    pub kept: usize,
    pub bytes: u64,
    /// Sessions that could not be deleted, with why; the sweep goes on past them.
    pub failed: Vec<(PathBuf, String)>,
}

/// A directory without meta.json untouched for this long is left over by a crash.
const ABANDONED: Duration = Duration::from_secs(24 * 3600);

/// Deletes recordings older than `retention` and, beyond `max_total_bytes`, the oldest
/// first. Sessions still being recorded are never deleted.
pub(crate) fn sweep(
    root: &Path,
    retention: Option<Duration>,
    max_total_bytes: Option<u64>,
    now: SystemTime,
) -> io::Result<Swept> {
    let mut candidates: Vec<(SystemTime, PathBuf, u64)> = Vec::new();
    let mut total = 0u64;
    for e in entries(root)? {
        let size = size_of_dir(&e.dir);
        total += size;
        let ended = match e.finished {
            Some(t) => t,
            None => match last_write(&e.dir) {
                Some(t) if now.duration_since(t).unwrap_or_default() > ABANDONED => t,
                _ => continue, // in progress
            },
        };
        candidates.push((ended, e.dir, size));
    }
    candidates.sort_by_key(|(t, _, _)| *t);
    let mut swept = Swept::default();
    for (ended, dir, size) in candidates {
        let expired = retention.is_some_and(|r| now.duration_since(ended).unwrap_or_default() > r);
        let over = max_total_bytes.is_some_and(|cap| total > cap);
        if expired || over {
            if let Err(e) = fs::remove_dir_all(&dir) {
                swept.failed.push((dir, e.to_string()));
                continue;
            }
            total -= size;
            swept.deleted += 1;
            swept.bytes += size;
            if let Some(parent) = dir.parent() {
                let _ = fs::remove_dir(parent); // only succeeds once the date is empty
            }
        } else {
            swept.kept += 1;
        }
    }
    Ok(swept)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_from_urls_are_validated() {
        for ok in ["sess_0a1b", "rt_1714200000000"] {
            assert!(valid_session_id(ok), "{ok}");
        }
        for bad in ["", "..", "../etc", "a/b", "a%2fb", "sess x", "a\\b", &"x".repeat(129)] {
            assert!(!valid_session_id(bad), "{bad}");
        }
        for ok in
            ["meta.json", "events.jsonl", "input.wav", "output.wav", "frames/000001.jpg", "attachments/000003.b64"]
        {
            assert!(valid_file(ok), "{ok}");
        }
        for bad in [
            "../meta.json",
            "frames/../../x",
            "frames/1.jpg",
            "frames/000001.jpg/..",
            "/etc/passwd",
            "meta.json.tmp",
            "",
        ] {
            assert!(!valid_file(bad), "{bad}");
        }
    }

    fn session(root: &Path, date: &str, id: &str, bytes: usize, age: Duration, finished: bool) {
        let dir = root.join(date).join(id);
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("input.wav"), vec![0u8; bytes]).unwrap();
        let when = SystemTime::now() - age;
        let f = fs::File::options().write(true).open(dir.join("input.wav")).unwrap();
        f.set_modified(when).unwrap();
        if finished {
            fs::write(dir.join("meta.json"), "{}").unwrap();
            fs::File::options().write(true).open(dir.join("meta.json")).unwrap().set_modified(when).unwrap();
        }
    }

    #[test]
    fn retention_deletes_what_is_too_old_and_keeps_the_rest() {
        let root = tempfile::tempdir().unwrap();
        let day = Duration::from_secs(86400);
        session(root.path(), "2026-11-01", "old", 10, day * 10, true);
        session(root.path(), "2026-11-24", "new", 10, day / 2, true);
        session(root.path(), "2026-11-25", "live", 10, Duration::from_secs(60), false);
        session(root.path(), "2026-11-20", "crashed", 10, day * 3, false);
        let s = sweep(root.path(), Some(day * 2), None, SystemTime::now()).unwrap();
        assert_eq!((s.deleted, s.kept), (2, 1), "the old one and the one a crash left behind");
        assert!(!root.path().join("2026-11-20").exists());
        assert!(!root.path().join("2026-11-01").exists(), "the emptied date is removed");
        assert!(root.path().join("2026-11-24/new").exists());
        assert!(root.path().join("2026-11-25/live").exists(), "in progress: never deleted");
    }

    #[test]
    fn the_sweep_never_follows_symlinks_and_goes_on_past_what_it_cannot_delete() {
        use std::os::unix::fs::PermissionsExt;
        let root = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        let day = Duration::from_secs(86400);
        // Precious data behind a date-named link, and behind a session-named link.
        session(elsewhere.path(), "2026-01-01", "precious", 10, day * 30, true);
        std::os::unix::fs::symlink(elsewhere.path().join("2026-01-01"), root.path().join("2026-01-01")).unwrap();
        fs::create_dir_all(root.path().join("2026-01-02")).unwrap();
        std::os::unix::fs::symlink(elsewhere.path().join("2026-01-01/precious"), root.path().join("2026-01-02/linked"))
            .unwrap();
        // An old session that cannot be deleted (its date directory is read-only), then one that can.
        session(root.path(), "2026-01-03", "stuck", 10, day * 20, true);
        session(root.path(), "2026-01-04", "gone", 10, day * 10, true);
        fs::set_permissions(root.path().join("2026-01-03"), fs::Permissions::from_mode(0o500)).unwrap();
        let s = sweep(root.path(), Some(day), None, SystemTime::now()).unwrap();
        let _ = fs::set_permissions(root.path().join("2026-01-03"), fs::Permissions::from_mode(0o700));
        assert!(elsewhere.path().join("2026-01-01/precious/meta.json").exists(), "nothing behind a link is touched");
        let running_as_root = unsafe { libc::geteuid() } == 0;
        if running_as_root {
            // root ignores the read-only directory: both go.
            assert_eq!(s.deleted, 2);
        } else {
            assert_eq!(s.deleted, 1, "the sweep went on past the stuck one");
            assert_eq!(s.failed.len(), 1);
            assert!(s.failed[0].0.ends_with("2026-01-03/stuck"), "{:?}", s.failed);
        }
        assert!(!root.path().join("2026-01-04/gone").exists());
    }

    #[test]
    fn the_size_cap_deletes_the_oldest_first() {
        let root = tempfile::tempdir().unwrap();
        let hour = Duration::from_secs(3600);
        session(root.path(), "2026-11-25", "a", 1000, hour * 3, true);
        session(root.path(), "2026-11-25", "b", 1000, hour * 2, true);
        session(root.path(), "2026-11-25", "c", 1000, hour, true);
        let s = sweep(root.path(), None, Some(2100), SystemTime::now()).unwrap();
        assert_eq!(s.deleted, 1);
        assert!(!root.path().join("2026-11-25/a").exists());
        assert!(root.path().join("2026-11-25/b").exists() && root.path().join("2026-11-25/c").exists());
        let (total, page) = list(root.path(), 1, 1).unwrap();
        assert_eq!((total, page.len()), (2, 1));
        assert_eq!(page[0]["session_id"], "c", "newest first");
        assert_eq!(find(root.path(), "b"), Some(root.path().join("2026-11-25/b")));
        assert_eq!(find(root.path(), "../b"), None);
    }
}
