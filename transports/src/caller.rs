//! Who is calling, whatever carries the call: a transport-neutral description of a caller (its
//! address, user agent and Origin), how it reaches its session, and why it may be refused. The
//! server checks every caller the same way on these (its admission), so that an edge that is
//! not HTTP-hosted (a raw socket, a phone line) is checked as the WebSocket and WebRTC routes
//! are.

use std::net::IpAddr;

use omni_actors::observe::metrics::metrics;

/// A caller as every transport can describe it.
#[derive(Debug, Clone, Default)]
pub struct Caller {
    /// Its address as the limits count it (behind a trusted proxy, the one the proxy names),
    /// when known.
    pub ip: Option<IpAddr>,
    /// Its port, for logs.
    pub port: u16,
    pub user_agent: Option<String>,
    pub origin: Origin,
}

/// A browser caller's Origin.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Origin {
    /// None given: not a browser (or a transport without origins).
    #[default]
    Absent,
    Given(String),
    /// Given, but not text: never allowed where there is an allowlist.
    Unreadable,
}

impl Origin {
    /// Whether a request with this origin, sent to `host`, may do what only a site's own pages
    /// may (start a call, mint a secret): one `allowed` lists, or, with none listed, this
    /// server's own (an origin naming the host the request was sent to). No origin: not a
    /// browser, allowed.
    pub fn same_site(&self, allowed: &[String], host: &str) -> bool {
        match self {
            Origin::Absent => true,
            origin if !allowed.is_empty() => origin.allowed(allowed),
            Origin::Given(origin) => {
                let named = origin.split_once("://").map_or("", |(_, rest)| rest);
                !host.is_empty() && named.eq_ignore_ascii_case(host)
            }
            Origin::Unreadable => false,
        }
    }

    /// Whether `allowed` (empty: any) lets this origin in.
    pub fn allowed(&self, allowed: &[String]) -> bool {
        if allowed.is_empty() {
            return true;
        }
        match self {
            Origin::Absent => true,
            Origin::Given(origin) => allowed.iter().any(|a| a.eq_ignore_ascii_case(origin)),
            Origin::Unreadable => false,
        }
    }
}

/// Why a caller is not let in: its reason (the metric's label), the HTTP status an
/// HTTP-hosted edge answers with, the error code and what the caller is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub reason: &'static str,
    pub status: u16,
    pub code: &'static str,
    pub message: String,
}

impl Refusal {
    /// A refusal, counted as it is made.
    pub fn new(reason: &'static str, status: u16, code: &'static str, message: impl Into<String>) -> Refusal {
        metrics().connections_refused.with_label_values(&[reason]).inc();
        Refusal { reason, status, code, message: message.into() }
    }
}

/// How a caller reaches its session: the transport's name (for status, logs and
/// recordings), and whether its edge carries audio itself, as samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transport {
    pub name: &'static str,
    pub carries_audio: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_origin_is_allowed_by_an_empty_list_or_by_name_and_never_when_unreadable() {
        let allowed = vec!["https://app.example".to_string()];
        assert!(Origin::Given("https://APP.example".into()).allowed(&allowed));
        assert!(!Origin::Given("https://evil.example".into()).allowed(&allowed));
        assert!(!Origin::Unreadable.allowed(&allowed));
        assert!(Origin::Absent.allowed(&allowed), "not a browser");
        assert!(Origin::Unreadable.allowed(&[]), "no list: any");
    }
}
