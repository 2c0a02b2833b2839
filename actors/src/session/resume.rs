//! Resumable sessions. A client whose connection drops without a close takes its session back
//! on a new connection with the token it was given: the same session, its place in the queue
//! or its worker, its conversation, and the events it missed.
//!
//! - [`Tokens`]: which token resumes which session, shared by the sessions and the routes.
//!   A session holds one token at a time; a resume uses it up (the session gives the client
//!   the next), and only a caller with the API key that opened the session may use it.
//! - [`Line`]: the rules of a session's line to its client, plain and tested without a
//!   runtime: every message said is numbered and the last ones kept (bounded), so that a
//!   resumed client gets those it did not receive, in order; while the client is away
//!   nothing is sent, and what it missed is counted.
//! - [`Resume`]: what a resumed connection's edge hands the session (its new line).
//!
//! The hold itself is the session's: a lost connection ([`super::messages::FromClient::Lost`])
//! puts its line away, and the grace is one more timer of its own context, which ends it
//! unless the token was taken in the meantime ([`Tokens::revoke`]).

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use actix::prelude::*;
use bytestring::ByteString;
use parking_lot::Mutex;

use super::messages::{ClientLine, FromLine, SessionPort};

/// Messages a line keeps at most for a resume, whatever their size.
pub const REPLAY_FRAMES: usize = 1024;

/// How a session may be resumed, from `[server]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResumeTerms {
    /// How long a session whose connection dropped is held for its client; zero: not at all.
    pub grace: Duration,
    /// The bytes of the last messages a session keeps for a resumed client.
    pub replay_bytes: usize,
}

impl ResumeTerms {
    /// No resumption: a dropped connection ends its session.
    pub const OFF: ResumeTerms = ResumeTerms { grace: Duration::ZERO, replay_bytes: 0 };

    /// Whether sessions are held at all.
    pub fn on(&self) -> bool {
        !self.grace.is_zero()
    }
}

/// A resumed connection's line, for the session it takes back.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Resume {
    /// Where the session now speaks to its client.
    pub line: Box<dyn ClientLine>,
    /// The line's number: what its edge hands the session comes tagged with it
    /// ([`super::messages::FromLine`]); anything from an earlier line is not heard.
    pub line_no: u64,
    /// How many of the session's messages the client received (`?received=`), when it says.
    pub received: Option<u64>,
}

/// Why a token did not resume a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResumeRefusal {
    /// No session holds it: never issued, already used, or its session ended (its grace
    /// passed, its time limit, a close).
    Unknown,
    /// It was issued to a session opened with another API key.
    OtherKey,
}

impl ResumeRefusal {
    /// What the caller is told.
    pub fn message(self) -> &'static str {
        match self {
            ResumeRefusal::Unknown => {
                "this resume token resumes no session: it was already used, or its session ended (the grace, [server] resume_grace_s, passed)"
            }
            ResumeRefusal::OtherKey => "this resume token belongs to a session opened with another API key",
        }
    }

    /// Its label in `omni_resumes_total`.
    pub fn label(self) -> &'static str {
        match self {
            ResumeRefusal::Unknown => "unknown_token",
            ResumeRefusal::OtherKey => "other_key",
        }
    }
}

/// Where a session is resumed: where it takes a new line, and its mailbox for what the
/// client sends.
#[derive(Clone)]
pub struct Resumable {
    /// Where it takes a new line.
    pub resume: Recipient<Resume>,
    /// Where an edge hands it what the client sends.
    pub port: Recipient<FromLine>,
}

/// A session whose token a caller took: it is to be handed the caller's line.
pub struct Taken {
    /// The session's connection number.
    pub conn: u64,
    session: Resumable,
}

impl Taken {
    /// Hands the session the new line `line` (numbered `line_no`, never 0 nor used before),
    /// and answers the port its edge hands the client's messages to.
    pub fn hand(self, line: Box<dyn ClientLine>, line_no: u64, received: Option<u64>) -> SessionPort {
        self.session.resume.do_send(Resume { line, line_no, received });
        SessionPort::new(self.session.port, line_no)
    }

    /// Whether the session is still there to take a line.
    pub fn connected(&self) -> bool {
        self.session.resume.connected()
    }
}

struct Parked {
    conn: u64,
    key_id: Option<String>,
    session: Resumable,
}

#[derive(Default)]
struct Book {
    by_token: HashMap<String, Parked>,
    by_conn: HashMap<u64, String>,
}

/// Every session's resume token; see the module's documentation.
#[derive(Default)]
pub struct Tokens {
    book: Mutex<Book>,
}

impl Tokens {
    /// A new token for the session on connection `conn`, opened with API key `key_id` (none:
    /// keys are off); the one it held before is no longer good.
    pub fn issue(&self, conn: u64, key_id: Option<String>, session: Resumable) -> String {
        let token = format!("rsm_{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple());
        let mut book = self.book.lock();
        if let Some(old) = book.by_conn.insert(conn, token.clone()) {
            book.by_token.remove(&old);
        }
        book.by_token.insert(token.clone(), Parked { conn, key_id, session });
        token
    }

    /// Uses up `token` for a caller with API key `key_id`: the session it resumes, unless
    /// it is unknown or another key's (which leaves it good for its own).
    pub fn take(&self, token: &str, key_id: Option<&str>) -> Result<Taken, ResumeRefusal> {
        let mut book = self.book.lock();
        let parked = book.by_token.get(token).ok_or(ResumeRefusal::Unknown)?;
        if parked.key_id.as_deref() != key_id {
            return Err(ResumeRefusal::OtherKey);
        }
        let Parked { conn, session, .. } = book.by_token.remove(token).expect("looked up above");
        book.by_conn.remove(&conn);
        Ok(Taken { conn, session })
    }

    /// The session on `conn` ends, or its grace passed: its token is no longer good. `false`
    /// when it had none left: a caller took it, and its resume is on the way.
    pub fn revoke(&self, conn: u64) -> bool {
        let mut book = self.book.lock();
        match book.by_conn.remove(&conn) {
            Some(token) => {
                book.by_token.remove(&token);
                true
            }
            None => false,
        }
    }

    /// The token good now for the session on `conn`, for tests of the session.
    #[cfg(test)]
    pub(crate) fn token_of(&self, conn: u64) -> Option<String> {
        self.book.lock().by_conn.get(&conn).cloned()
    }

    /// Tokens good now (one per session that can be resumed).
    pub fn len(&self) -> usize {
        self.book.lock().by_token.len()
    }

    /// Whether no token is good.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What a resumed client is sent: the messages it did not receive, and what it lost.
#[derive(Debug, Default, PartialEq)]
pub struct Catchup {
    /// The messages it did not receive, in order.
    pub frames: Vec<ByteString>,
    /// Messages it did not receive that were no longer kept (past the line's bound).
    pub lost: u64,
    /// The model's voice produced while it was away, not sent (in ms at 24 kHz).
    pub voice_skipped_ms: u64,
    /// How long it was away (zero: it came back before its connection was noticed lost).
    pub away: Duration,
}

struct Away {
    since: Instant,
    /// Messages said by then (the client got at most those).
    said_by_then: u64,
    voice_samples: u64,
}

/// A session's line to its client; see the module's documentation.
pub struct Line {
    /// The last messages said, with their numbers (1 for the session's first).
    kept: VecDeque<(u64, ByteString)>,
    kept_bytes: usize,
    max_bytes: usize,
    said: u64,
    away: Option<Away>,
}

impl Line {
    /// A line keeping up to `max_bytes` of its last messages (0: none, when sessions are not
    /// resumed).
    pub fn new(max_bytes: usize) -> Line {
        Line { kept: VecDeque::new(), kept_bytes: 0, max_bytes, said: 0, away: None }
    }

    /// One more message for the client: numbered and kept. Answers whether to send it now
    /// (not while the client is away).
    pub fn say(&mut self, frame: &ByteString) -> bool {
        self.said += 1;
        if self.max_bytes > 0 {
            self.kept.push_back((self.said, frame.clone()));
            self.kept_bytes += frame.len();
            while self.kept.len() > REPLAY_FRAMES || (self.kept_bytes > self.max_bytes && self.kept.len() > 1) {
                if let Some((_, old)) = self.kept.pop_front() {
                    self.kept_bytes -= old.len();
                }
            }
        }
        self.away.is_none()
    }

    /// Messages said so far.
    pub fn said(&self) -> u64 {
        self.said
    }

    /// The connection was lost at `now`: nothing more is sent until a resume.
    pub fn lose(&mut self, now: Instant) {
        if self.away.is_none() {
            self.away = Some(Away { since: now, said_by_then: self.said, voice_samples: 0 });
        }
    }

    /// Whether the client is away.
    pub fn away(&self) -> bool {
        self.away.is_some()
    }

    /// How long the client has been away.
    pub fn away_for(&self, now: Instant) -> Option<Duration> {
        self.away.as_ref().map(|a| now.saturating_duration_since(a.since))
    }

    /// The model's voice (`samples` at 24 kHz) was produced while the client is away: not sent.
    pub fn skip_voice(&mut self, samples: usize) {
        if let Some(away) = &mut self.away {
            away.voice_samples += samples as u64;
        }
    }

    /// The client is back, having received `received` messages (when it says; else those
    /// said before its connection was noticed lost, or all when it was not): what it missed.
    pub fn back(&mut self, received: Option<u64>, now: Instant) -> Catchup {
        let away = self.away.take();
        let from = received.or(away.as_ref().map(|a| a.said_by_then)).unwrap_or(self.said).min(self.said);
        let oldest_kept = self.kept.front().map_or(self.said + 1, |(n, _)| *n);
        let lost = oldest_kept.saturating_sub(from + 1);
        let frames = self.kept.iter().filter(|(n, _)| *n > from).map(|(_, f)| f.clone()).collect();
        let (voice_skipped_ms, away_for) = match away {
            Some(a) => (a.voice_samples * 1000 / 24_000, now.saturating_duration_since(a.since)),
            None => (0, Duration::ZERO),
        };
        Catchup { frames, lost, voice_skipped_ms, away: away_for }
    }
}

/// `frame` (a JSON object, as every dialect's messages are) with the session's resume token
/// added as `resume_token`; a frame that is not an object is left as it is.
pub fn with_token(frame: ByteString, token: &str) -> ByteString {
    match serde_json::from_str::<serde_json::Value>(&frame) {
        Ok(serde_json::Value::Object(mut obj)) => {
            obj.insert("resume_token".into(), token.into());
            ByteString::from(serde_json::Value::Object(obj).to_string())
        }
        _ => frame,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(n: u64) -> ByteString {
        ByteString::from(format!("{{\"n\":{n}}}"))
    }

    #[test]
    fn a_client_back_gets_what_it_did_not_receive_in_order() {
        let mut line = Line::new(1 << 20);
        let t0 = Instant::now();
        for n in 1..=5 {
            assert!(line.say(&frame(n)));
        }
        line.lose(t0);
        for n in 6..=8 {
            assert!(!line.say(&frame(n)), "not sent while away");
        }
        line.skip_voice(24_000);
        let back = line.back(Some(3), t0 + Duration::from_secs(2));
        assert_eq!(back.frames, (4..=8).map(frame).collect::<Vec<_>>());
        assert_eq!((back.lost, back.voice_skipped_ms, back.away), (0, 1000, Duration::from_secs(2)));
        assert!(line.say(&frame(9)), "sent again");
    }

    #[test]
    fn without_a_count_what_was_said_while_away_is_sent() {
        let mut line = Line::new(1 << 20);
        let t0 = Instant::now();
        line.say(&frame(1));
        line.say(&frame(2));
        line.lose(t0);
        line.say(&frame(3));
        assert_eq!(line.back(None, t0).frames, vec![frame(3)]);
        // Back before the loss was noticed, with nothing to say: nothing.
        assert_eq!(line.back(None, t0).frames, Vec::<ByteString>::new());
        // A count past what was said is what was said.
        assert_eq!(line.back(Some(99), t0).frames, Vec::<ByteString>::new());
    }

    #[test]
    fn past_its_bound_the_line_tells_how_many_were_lost() {
        let mut line = Line::new(3 * frame(10).len());
        for n in 1..=10 {
            line.say(&frame(n));
        }
        let back = line.back(Some(2), Instant::now());
        assert_eq!(back.frames, (8..=10).map(frame).collect::<Vec<_>>());
        assert_eq!(back.lost, 5, "3..=7");
        let mut off = Line::new(0);
        off.say(&frame(1));
        assert_eq!(off.back(Some(0), Instant::now()).lost, 1);
    }

    #[test]
    fn the_token_is_added_to_a_json_object_only() {
        assert_eq!(&*with_token(frame(1), "rsm_x"), r#"{"n":1,"resume_token":"rsm_x"}"#);
        assert_eq!(&*with_token(ByteString::from("[1]"), "rsm_x"), "[1]");
    }
}
