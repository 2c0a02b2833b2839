//! The sessions' resume tokens: which token resumes which session. A token is good once, for a
//! caller with the API key that opened its session, on the transport it was opened on. A taken
//! token that is never handed its session (the caller's connection failed before its edge
//! started) goes back to the book, so that the session can still be resumed or end at its grace.

use std::collections::HashMap;
use std::sync::Arc;

use actix::prelude::*;
use bytestring::ByteString;
use parking_lot::Mutex;

use super::Resume;
use crate::edge::client::{ClientLine, FromLine, SessionPort};

/// Why a token did not resume a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResumeRefusal {
    /// No session holds it: never issued, already used, or its session ended (its grace
    /// passed, its time limit, a close).
    Unknown,
    /// It was issued to a session opened with another API key.
    OtherKey,
    /// Its session was opened over another transport (`websocket`, `webrtc`), which it keeps.
    OtherTransport(&'static str),
}

impl ResumeRefusal {
    /// What the caller is told.
    pub fn message(self) -> String {
        match self {
            ResumeRefusal::Unknown => {
                "this resume token resumes no session: it was already used, or its session ended \
                                       (the grace, [server] resume_grace_s, passed, or its time limit)"
                    .into()
            }
            ResumeRefusal::OtherKey => "this resume token belongs to a session opened with another API key".into(),
            ResumeRefusal::OtherTransport(t) => {
                format!("this resume token belongs to a session opened over {t}: it resumes there")
            }
        }
    }

    /// Its label in `omni_resumes_total`.
    pub fn label(self) -> &'static str {
        match self {
            ResumeRefusal::Unknown => "unknown_token",
            ResumeRefusal::OtherKey => "other_key",
            ResumeRefusal::OtherTransport(_) => "other_transport",
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

struct Parked {
    conn: u64,
    key_id: Option<String>,
    transport: &'static str,
    session: Resumable,
}

#[derive(Default)]
struct Book {
    by_token: HashMap<String, Parked>,
    by_conn: HashMap<u64, String>,
}

impl Book {
    fn insert(&mut self, token: String, parked: Parked) {
        if let Some(old) = self.by_conn.insert(parked.conn, token.clone()) {
            self.by_token.remove(&old);
        }
        self.by_token.insert(token, parked);
    }
}

/// Every session's resume token; see the module's documentation.
#[derive(Default)]
pub struct Tokens {
    book: Arc<Mutex<Book>>,
}

/// A session whose token a caller took: it is to be handed the caller's line
/// ([`Taken::hand`]); dropped unhanded, the token is good again.
pub struct Taken {
    /// The session's connection number.
    pub conn: u64,
    token: String,
    parked: Option<Parked>,
    book: Arc<Mutex<Book>>,
}

impl Taken {
    /// Hands the session the new line `line` (numbered `line_no`, never 0 nor used before),
    /// and answers the port its edge hands the client's messages to.
    pub fn hand(mut self, line: Box<dyn ClientLine>, line_no: u64, received: Option<u64>) -> SessionPort {
        let parked = self.parked.take().expect("a taken token is handed once");
        parked.session.resume.do_send(Resume { line, line_no, received });
        SessionPort::new(parked.session.port, line_no)
    }

    /// Whether the session is still there to take a line.
    pub fn connected(&self) -> bool {
        self.parked.as_ref().is_some_and(|p| p.session.resume.connected())
    }
}

impl Drop for Taken {
    fn drop(&mut self) {
        // Never handed (the caller's connection failed first): the token is good again, unless
        // the session has a newer one.
        if let Some(parked) = self.parked.take() {
            let mut book = self.book.lock();
            if !book.by_conn.contains_key(&parked.conn) {
                book.insert(std::mem::take(&mut self.token), parked);
            }
        }
    }
}

impl Tokens {
    /// A new token for the session on connection `conn`, opened with API key `key_id` (none:
    /// keys are off) over `transport`; the one it held before is no longer good.
    pub fn issue(&self, conn: u64, key_id: Option<String>, transport: &'static str, session: Resumable) -> String {
        let token = format!("rsm_{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple());
        self.book.lock().insert(token.clone(), Parked { conn, key_id, transport, session });
        token
    }

    /// Uses up `token` for a caller with API key `key_id` on `transport`: the session it
    /// resumes, unless it is unknown, another key's or another transport's (which leave it good
    /// for its own).
    pub fn take(&self, token: &str, key_id: Option<&str>, transport: &str) -> Result<Taken, ResumeRefusal> {
        let mut book = self.book.lock();
        let parked = book.by_token.get(token).ok_or(ResumeRefusal::Unknown)?;
        if parked.key_id.as_deref() != key_id {
            return Err(ResumeRefusal::OtherKey);
        }
        if parked.transport != transport {
            return Err(ResumeRefusal::OtherTransport(parked.transport));
        }
        let parked = book.by_token.remove(token).expect("looked up above");
        book.by_conn.remove(&parked.conn);
        Ok(Taken { conn: parked.conn, token: token.to_string(), parked: Some(parked), book: self.book.clone() })
    }

    /// The session on `conn` ends, or its grace passed: its token is no longer good. `false`
    /// when it had none left: a caller took it, and is starting its connection (it hands the
    /// session its line, or puts the token back).
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

/// `frame` (a JSON object, as every dialect's messages are) with the session's resume token
/// added as `resume_token`; a frame that is not an object is left as it is.
pub fn with_token(frame: &ByteString, token: &str) -> ByteString {
    match serde_json::from_str::<serde_json::Value>(frame) {
        Ok(serde_json::Value::Object(mut obj)) => {
            obj.insert("resume_token".into(), token.into());
            ByteString::from(serde_json::Value::Object(obj).to_string())
        }
        _ => frame.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_is_added_to_a_json_object_only() {
        assert_eq!(&*with_token(&ByteString::from(r#"{"n":1}"#), "rsm_x"), r#"{"n":1,"resume_token":"rsm_x"}"#);
        assert_eq!(&*with_token(&ByteString::from("[1]"), "rsm_x"), "[1]");
    }
}
