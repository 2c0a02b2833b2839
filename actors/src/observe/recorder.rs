//! RecorderActor: writes one session's recording, off the session's hot path.
//!
//! Every recorder lives on the recording thread (an arbiter of its own, so a slow disk
//! never delays a step) and writes `DIR/YYYY-MM-DD/SESSION_ID/`: `events.jsonl` (every
//! frame both ways, in order, with a monotonic timestamp; media replaced by references),
//! `input.wav` (16 kHz input), `output.wav` (24 kHz model audio as sent), both 24-bit PCM,
//! `frames/NNNNNN.jpg`, `attachments/NNNNNN.b64`, and last, atomically, `meta.json`. WAV
//! headers are rewritten after every write, so the files are valid at any moment.
//! Directories are created 0700 and files 0600: recordings hold voices, faces and
//! transcripts, readable by the server's user only.
//!
//! What goes into a line of `events.jsonl` is decided by the session's dialect (its
//! [`Redact`]); the recorder only writes the media it is handed and the lines.

use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

use actix::prelude::*;
use serde::Serialize;
use serde_json::value::RawValue;

use crate::audio::{to_i24, wav_spec};
use crate::edge::redact::RecordedMedia;
use crate::edge::redact::{Direction, MediaRef, MediaSink, Recorded, Redact};
use crate::observe::messages::Record;
use crate::observe::meta::{INPUT_RATE, OUTPUT_RATE, RecordingSummary, SessionMeta};

/// Creates a directory (and its parents) readable by this user only.
pub(super) fn private_dir(path: &Path) -> io::Result<()> {
    DirBuilder::new().recursive(true).mode(0o700).create(path)
}

/// Creates (or truncates) a file readable by this user only.
pub(super) fn private_file(path: &Path) -> io::Result<File> {
    OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(path)
}

type Wav = hound::WavWriter<BufWriter<File>>;

struct Files {
    events: BufWriter<File>,
    input: Wav,
    output: Wav,
}

/// The recording's files and counters, as a [`MediaSink`].
struct Sink<'a> {
    dir: &'a Path,
    files: &'a mut Files,
    summary: &'a mut RecordingSummary,
}

fn append_audio(writer: &mut Wav, counter: &mut u64, name: &str, samples: &[f32]) -> io::Result<MediaRef> {
    let offset = *counter;
    for &s in samples {
        writer.write_sample(to_i24(s)).map_err(io::Error::other)?;
    }
    // Rewrites the header: the file is a valid WAV after every write.
    writer.flush().map_err(io::Error::other)?;
    *counter += samples.len() as u64;
    Ok(MediaRef { file: name.into(), offset: Some(offset), samples: Some(samples.len() as u64), chars: None })
}

impl MediaSink for Sink<'_> {
    fn input_audio(&mut self, samples: &[f32]) -> io::Result<MediaRef> {
        append_audio(&mut self.files.input, &mut self.summary.input_samples, "input.wav", samples)
    }

    fn output_audio(&mut self, samples: &[f32]) -> io::Result<MediaRef> {
        append_audio(&mut self.files.output, &mut self.summary.output_samples, "output.wav", samples)
    }

    fn frame(&mut self, image: &[u8]) -> io::Result<MediaRef> {
        self.summary.frames += 1;
        let name = format!("frames/{:06}.jpg", self.summary.frames);
        private_file(&self.dir.join(&name))?.write_all(image)?;
        Ok(MediaRef { file: name, offset: None, samples: None, chars: None })
    }

    fn attachment(&mut self, text: &str) -> io::Result<MediaRef> {
        self.summary.attachments += 1;
        private_dir(&self.dir.join("attachments"))?;
        let name = format!("attachments/{:06}.b64", self.summary.attachments);
        private_file(&self.dir.join(&name))?.write_all(text.as_bytes())?;
        Ok(MediaRef { file: name, offset: None, samples: None, chars: Some(text.len() as u64) })
    }
}

/// One line of `events.jsonl`.
#[derive(Serialize)]
struct Line<'a> {
    t: f64,
    dir: Direction,
    #[serde(skip_serializing_if = "Option::is_none")]
    event: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    raw: Option<&'a str>,
}

pub(super) struct RecorderActor {
    dir: PathBuf,
    root: PathBuf,
    redactor: Arc<dyn Redact>,
    files: Option<Files>,
    unfinished: Arc<watch::Sender<usize>>,
    summary: RecordingSummary,
    /// Its own address, held until `Finish` is handled. The session drops its address right
    /// after sending `Finish`; without this one, actix may find no sender left between two
    /// polls of the mailbox and stop the actor with `Finish` still queued (the soak found
    /// 2 such recordings in 30,820).
    keep_alive: Option<Addr<RecorderActor>>,
}

impl RecorderActor {
    /// Starts the recorder of one session on the recording thread.
    pub(crate) fn start_on(
        arbiter: &ArbiterHandle,
        dir: PathBuf,
        redactor: Arc<dyn Redact>,
        root: PathBuf,
        unfinished: &Arc<watch::Sender<usize>>,
    ) -> Addr<RecorderActor> {
        unfinished.send_modify(|n| *n += 1);
        let unfinished = unfinished.clone();
        RecorderActor::start_in_arbiter(arbiter, move |_| RecorderActor {
            dir,
            root,
            redactor,
            files: None,
            unfinished,
            summary: RecordingSummary::default(),
            keep_alive: None,
        })
    }

    fn open(&self) -> io::Result<Files> {
        // The root and the date directory too: every level is private.
        private_dir(&self.root)?;
        if let Some(date) = self.dir.parent() {
            private_dir(date)?;
        }
        private_dir(&self.dir.join("frames"))?;
        let wav = |name: &str, rate| {
            let file = BufWriter::new(private_file(&self.dir.join(name))?);
            hound::WavWriter::new(file, wav_spec(rate)).map_err(io::Error::other)
        };
        Ok(Files {
            events: BufWriter::new(private_file(&self.dir.join("events.jsonl"))?),
            input: wav("input.wav", INPUT_RATE)?,
            output: wav("output.wav", OUTPUT_RATE)?,
        })
    }

    fn write_event(&mut self, at: Duration, dir: Direction, text: &[u8], media: RecordedMedia) -> io::Result<()> {
        let files = self.files.as_mut().ok_or_else(|| io::Error::other("not open"))?;
        let mut sink = Sink { dir: &self.dir, files, summary: &mut self.summary };
        let recorded = self.redactor.redact(dir, text, media, &mut sink)?;
        let t = (at.as_secs_f64() * 1e6).round() / 1e6;
        let line = match &recorded {
            Recorded::Event(event) => Line { t, dir, event: Some(event), raw: None },
            Recorded::Raw(raw) => Line { t, dir, event: None, raw: Some(raw) },
        };
        let files = self.files.as_mut().ok_or_else(|| io::Error::other("not open"))?;
        serde_json::to_writer(&mut files.events, &line)?;
        files.events.write_all(b"\n")?;
        files.events.flush()?;
        self.summary.events += 1;
        Ok(())
    }

    fn finish(&mut self, mut meta: SessionMeta) -> io::Result<()> {
        if let Some(files) = self.files.take() {
            let Files { mut events, input, output } = files;
            events.flush()?;
            input.finalize().map_err(io::Error::other)?;
            output.finalize().map_err(io::Error::other)?;
        }
        let session = &meta.recording;
        meta.recording = RecordingSummary {
            dropped_records: session.dropped_records,
            lagged: session.lagged,
            truncated: session.truncated,
            ..self.summary.clone()
        };
        let tmp = self.dir.join("meta.json.tmp");
        private_file(&tmp)?.write_all(&serde_json::to_vec_pretty(&meta)?)?;
        fs::rename(&tmp, self.dir.join("meta.json"))
    }
}

impl Actor for RecorderActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        self.keep_alive = Some(ctx.address());
        match self.open() {
            Ok(files) => self.files = Some(files),
            Err(e) => {
                log::error!("recording {}: cannot create its files: {e}", self.dir.display());
                self.summary.error = Some(e.to_string());
            }
        }
    }
}

impl Handler<Record> for RecorderActor {
    type Result = ();

    fn handle(&mut self, record: Record, ctx: &mut Context<Self>) {
        match record {
            Record::Event { at, dir, text, media, reservation } => {
                if self.files.is_some()
                    && let Err(e) = self.write_event(at, dir, &text, media)
                {
                    log::error!("recording {}: write failed: {e}", self.dir.display());
                    self.summary.error.get_or_insert(e.to_string());
                }
                drop(reservation);
            }
            Record::Finish(meta) => {
                if let Err(e) = self.finish(*meta) {
                    log::error!("recording {}: cannot finalize: {e}", self.dir.display());
                }
                self.unfinished.send_modify(|n| *n -= 1);
                self.keep_alive = None;
                ctx.stop();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;
    use std::time::{Instant, SystemTime};

    use super::*;
    use crate::observe::meta::timestamp;
    use crate::observe::recording::{RecorderSpawner, Recording, RecordingLimits};
    use bytes::Bytes;

    /// Records inbound media and keeps the text as a JSON string (a dialect's redactor
    /// decides what a line holds; this one is the simplest that exercises the sink).
    struct Plain;

    impl Redact for Plain {
        fn redact(
            &self,
            dir: Direction,
            text: &[u8],
            decoded: RecordedMedia,
            sink: &mut dyn MediaSink,
        ) -> io::Result<Recorded> {
            let Ok(text) = std::str::from_utf8(text) else {
                return Ok(Recorded::Raw(String::from_utf8_lossy(text).into_owned()));
            };
            if text.starts_with("raw:") {
                return Ok(Recorded::Raw(text.into()));
            }
            let mut refs = Vec::new();
            for audio in &decoded.0 {
                refs.push(match dir {
                    Direction::In => sink.input_audio(audio)?,
                    Direction::Out => sink.output_audio(audio)?,
                });
            }
            for frame in &decoded.1 {
                refs.push(sink.frame(frame)?);
            }
            let event = serde_json::json!({"text": text, "refs": refs});
            Ok(Recorded::Event(serde_json::value::to_raw_value(&event)?))
        }
    }

    fn meta(id: &str) -> SessionMeta {
        SessionMeta {
            session_id: id.into(),
            mode: "video".into(),
            dialect: "minicpm".into(),
            transport: "websocket".into(),
            worker: Some("sim-0".into()),
            client_addr: "127.0.0.1:1".into(),
            user_agent: None,
            start: "s".into(),
            end: "e".into(),
            duration_s: 1.0,
            close_reason: "user_stop".into(),
            chunks_received: 1,
            chunks_dropped: 0,
            chunks_answered: 1,
            turns: 0,
            recording: RecordingSummary::default(),
        }
    }

    fn limits(max_lag: usize, max_total_lag: usize, max_session: u64) -> RecordingLimits {
        RecordingLimits::new(max_lag, max_total_lag, max_session)
    }

    const ROOMY: RecordingLimits = RecordingLimits::new(64 << 20, 256 << 20, 1 << 30);

    async fn finalized(spawner: &RecorderSpawner) {
        let waited = actix::clock::timeout(Duration::from_secs(10), spawner.finalized()).await;
        assert!(waited.is_ok(), "recording never finalized");
    }

    fn session_dir(root: &Path, id: &str) -> PathBuf {
        root.join(timestamp(SystemTime::now()).1).join(id)
    }

    fn read_meta(root: &Path, id: &str) -> serde_json::Value {
        serde_json::from_slice(&fs::read(session_dir(root, id).join("meta.json")).unwrap()).unwrap()
    }

    #[actix::test]
    async fn a_recording_has_every_file_valid_private_and_meta_last() {
        let root = tempfile::tempdir().unwrap();
        let spawner = RecorderSpawner::new(root.path().join("rec"), ROOMY);
        let mut rec = Recording::new(spawner.clone(), Instant::now());
        rec.outbound(Bytes::from_static(b"queue_done"), None);
        rec.inbound(Bytes::from_static(b"init"), (vec![], vec![]));
        rec.start("sess_x", Arc::new(Plain), SystemTime::now());
        rec.inbound(Bytes::from_static(b"append"), (vec![vec![0.25; 16000]], vec![vec![0xFF, 0xD8, 0xFF, 1]]));
        rec.outbound(Bytes::from_static(b"raw: not an event"), None);
        rec.finish(meta("sess_x"));
        finalized(&spawner).await;
        assert_eq!(spawner.total_lag(), 0, "every reservation given back");
        let dir = session_dir(&root.path().join("rec"), "sess_x");
        let lines: Vec<serde_json::Value> = fs::read_to_string(dir.join("events.jsonl"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 4, "the prelude first, then the rest, in order");
        assert_eq!((lines[0]["dir"].as_str(), lines[0]["event"]["text"].as_str()), (Some("out"), Some("queue_done")));
        assert_eq!(
            lines[2]["event"]["refs"][0],
            serde_json::json!({"$ref": "input.wav", "offset": 0, "samples": 16000})
        );
        assert_eq!(lines[2]["event"]["refs"][1], serde_json::json!({"$ref": "frames/000001.jpg"}));
        assert_eq!(lines[3]["raw"], "raw: not an event");
        let ts: Vec<f64> = lines.iter().map(|l| l["t"].as_f64().unwrap()).collect();
        assert!(ts.windows(2).all(|w| w[0] <= w[1]), "ordered: {ts:?}");
        let input_wav = hound::WavReader::open(dir.join("input.wav")).unwrap();
        assert_eq!((input_wav.spec().sample_rate, input_wav.duration()), (16000, 16000));
        assert_eq!(fs::read(dir.join("frames/000001.jpg")).unwrap(), [0xFF, 0xD8, 0xFF, 1]);
        let meta = read_meta(&root.path().join("rec"), "sess_x");
        assert_eq!(
            (meta["recording"]["events"].as_u64(), meta["recording"]["input_samples"].as_u64()),
            (Some(4), Some(16000))
        );
        assert!(!dir.join("meta.json.tmp").exists());
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        for d in [root.path().join("rec"), dir.parent().unwrap().to_path_buf(), dir.clone(), dir.join("frames")] {
            assert_eq!(mode(&d), 0o700, "{}", d.display());
        }
        for f in ["events.jsonl", "input.wav", "output.wav", "meta.json", "frames/000001.jpg"] {
            assert_eq!(mode(&dir.join(f)), 0o600, "{f}");
        }
    }

    #[actix::test]
    async fn a_session_without_an_id_records_nothing_and_gives_its_prelude_back() {
        let root = tempfile::tempdir().unwrap();
        let spawner = RecorderSpawner::new(root.path().to_path_buf(), ROOMY);
        let mut rec = Recording::new(spawner.clone(), Instant::now());
        rec.outbound(Bytes::from_static(b"queued"), None);
        assert!(spawner.total_lag() > 0);
        rec.finish(meta("never"));
        drop(rec);
        assert_eq!(spawner.unfinished(), 0);
        assert_eq!(spawner.total_lag(), 0);
        assert_eq!(fs::read_dir(root.path()).unwrap().count(), 0);
    }

    #[actix::test]
    async fn the_prelude_is_bounded() {
        let root = tempfile::tempdir().unwrap();
        let spawner = RecorderSpawner::new(root.path().to_path_buf(), limits(1000, 1 << 20, 1 << 30));
        let mut rec = Recording::new(spawner.clone(), Instant::now());
        // A queued client streaming audio it may not send yet: at most max_lag is held.
        for _ in 0..100 {
            rec.inbound(Bytes::from_static(b"append"), (vec![vec![0.0; 100]], vec![]));
        }
        assert!(spawner.total_lag() <= 1000, "{}", spawner.total_lag());
        rec.start("sess_p", Arc::new(Plain), SystemTime::now());
        rec.finish(meta("sess_p"));
        finalized(&spawner).await;
        let meta = read_meta(root.path(), "sess_p");
        assert_eq!(meta["recording"]["events"], 2);
        assert_eq!(meta["recording"]["dropped_records"], 98);
    }

    #[actix::test]
    async fn a_recorder_too_far_behind_drops_records_instead_of_blocking() {
        let root = tempfile::tempdir().unwrap();
        let spawner = RecorderSpawner::new(root.path().to_path_buf(), limits(1000, 1 << 20, 1 << 30));
        let mut rec = Recording::new(spawner.clone(), Instant::now());
        rec.start("sess_lag", Arc::new(Plain), SystemTime::now());
        rec.outbound(Bytes::from(vec![b'x'; 600]), None);
        rec.outbound(Bytes::from(vec![b'y'; 1200]), None);
        assert_eq!(rec_dropped(&rec), 1, "a record over the bound is dropped at once, without waiting");
        rec.finish(meta("sess_lag"));
        finalized(&spawner).await;
        let meta = read_meta(root.path(), "sess_lag");
        assert_eq!(
            (meta["recording"]["lagged"].as_bool(), meta["recording"]["dropped_records"].as_u64()),
            (Some(true), Some(1))
        );
    }

    #[actix::test]
    async fn all_recorders_together_are_bounded() {
        let root = tempfile::tempdir().unwrap();
        let spawner = RecorderSpawner::new(root.path().to_path_buf(), limits(1000, 2500, 1 << 30));
        let mut sessions: Vec<Recording> = (0..5).map(|_| Recording::new(spawner.clone(), Instant::now())).collect();
        for rec in &mut sessions {
            rec.outbound(Bytes::from(vec![b'z'; 900]), None);
        }
        assert_eq!(spawner.total_lag(), 1800, "two of five fit under the total bound");
        assert_eq!(sessions.iter().map(rec_dropped).sum::<u64>(), 3);
        drop(sessions);
        assert_eq!(spawner.total_lag(), 0);
    }

    #[actix::test]
    async fn a_recording_past_its_cap_is_truncated() {
        let root = tempfile::tempdir().unwrap();
        let spawner = RecorderSpawner::new(root.path().to_path_buf(), limits(1 << 20, 1 << 20, 2000));
        let mut rec = Recording::new(spawner.clone(), Instant::now());
        rec.start("sess_cap", Arc::new(Plain), SystemTime::now());
        for _ in 0..10 {
            rec.outbound(Bytes::from(vec![b'w'; 500]), None);
        }
        rec.finish(meta("sess_cap"));
        finalized(&spawner).await;
        let meta = read_meta(root.path(), "sess_cap");
        assert_eq!(
            (meta["recording"]["events"].as_u64(), meta["recording"]["truncated"].as_bool()),
            (Some(4), Some(true))
        );
    }

    fn rec_dropped(rec: &Recording) -> u64 {
        rec.dropped()
    }
}
