//! Client secrets: short-lived keys a server holding a real API key mints for a browser
//! (`POST /v1/realtime/client_secrets`), so that the page never holds the real one.
//!
//! A secret is accepted once, within its lifetime, in place of an API key, on a WebRTC call or
//! a WebSocket alike; the session it opens is accounted to the key that minted it, and starts
//! with the session settings given when it was minted (its model, if it names one, is the only
//! one it opens). A call that fails (a bad offer, no free port) does not use it up: it is
//! checked first ([`ClientSecrets::peek`]) and taken once the call is answered
//! ([`ClientSecrets::redeem`]). Only a secret's SHA-256 is kept, so a lookup reveals nothing
//! about the secrets held; the secret itself is never logged.

use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime};

use sha2::Digest;

/// What a secret stands for.
#[derive(Debug, Clone, PartialEq)]
pub struct Grant {
    /// The id of the API key that minted it (none: no keys are configured).
    pub key_id: Option<String>,
    /// The session settings to start with (an OpenAI `session` object), if any were given.
    pub session: Option<serde_json::Value>,
}

/// A freshly minted secret.
#[derive(Debug, Clone)]
pub struct Minted {
    pub value: String,
    /// Seconds since the Unix epoch.
    pub expires_at: u64,
}

/// Why a secret was not minted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MintRefusal {
    /// `max` secrets are outstanding.
    Full { max: usize },
    /// The minting key has `max` secrets outstanding.
    FullForKey { max: usize },
}

/// The secrets minted and not yet used or expired, as a plain struct (the routes hold it
/// behind a lock).
#[derive(Debug)]
pub struct ClientSecrets {
    held: HashMap<[u8; 32], (Instant, Grant)>,
    max: usize,
    /// Outstanding secrets per minting key, and the bound on each.
    per_key: HashMap<Option<String>, usize>,
    max_per_key: usize,
}

/// The prefix of every client secret: it tells one from an API key without a lookup.
pub(crate) const PREFIX: &str = "ek_";

fn digest(value: &str) -> [u8; 32] {
    sha2::Sha256::digest(value.as_bytes()).into()
}

impl Default for ClientSecrets {
    fn default() -> Self {
        ClientSecrets::new(DEFAULT_MAX, DEFAULT_MAX_PER_KEY)
    }
}

/// Secrets held at most, and per minting key, unless `[webrtc]` says otherwise.
pub(crate) const DEFAULT_MAX: usize = 10_000;
pub(crate) const DEFAULT_MAX_PER_KEY: usize = 1_000;

impl ClientSecrets {
    pub fn new(max: usize, max_per_key: usize) -> ClientSecrets {
        ClientSecrets { held: HashMap::new(), max, per_key: HashMap::new(), max_per_key }
    }

    /// Forgets the expired secrets (and recounts the keys' shares).
    fn sweep(&mut self, now: Instant) {
        self.held.retain(|_, (expires, _)| *expires > now);
        self.per_key.clear();
        for (_, grant) in self.held.values() {
            *self.per_key.entry(grant.key_id.clone()).or_default() += 1;
        }
    }

    fn forget(&mut self, grant: &Grant) {
        if let Some(n) = self.per_key.get_mut(&grant.key_id) {
            *n = n.saturating_sub(1);
        }
    }

    /// Mints a secret valid for `ttl` from `now`.
    pub fn mint(&mut self, grant: Grant, ttl: Duration, now: Instant) -> Result<Minted, MintRefusal> {
        let key_full = |s: &Self| s.per_key.get(&grant.key_id).copied().unwrap_or(0) >= s.max_per_key;
        if self.held.len() >= self.max || key_full(self) {
            self.sweep(now);
            if self.held.len() >= self.max {
                return Err(MintRefusal::Full { max: self.max });
            }
            if key_full(self) {
                return Err(MintRefusal::FullForKey { max: self.max_per_key });
            }
        }
        *self.per_key.entry(grant.key_id.clone()).or_default() += 1;
        // 244 random bits from the system's generator (two v4 UUIDs).
        let value = format!("{PREFIX}{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple());
        self.held.insert(digest(&value), (now + ttl, grant));
        let expires_at = SystemTime::now()
            .checked_add(ttl)
            .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_secs());
        Ok(Minted { value, expires_at })
    }

    /// A secret's grant when it is held and unexpired, leaving it held.
    pub fn peek(&mut self, value: &str, now: Instant) -> Option<Grant> {
        let key = digest(value);
        let (expires, grant) = self.held.get(&key)?;
        if *expires > now {
            return Some(grant.clone());
        }
        let (_, grant) = self.held.remove(&key)?;
        self.forget(&grant);
        None
    }

    /// Takes a secret: its grant when it is held and unexpired. It is gone afterwards either way.
    pub fn redeem(&mut self, value: &str, now: Instant) -> Option<Grant> {
        let (expires, grant) = self.held.remove(&digest(value))?;
        self.forget(&grant);
        (expires > now).then_some(grant)
    }

    pub fn outstanding(&self) -> usize {
        self.held.len()
    }

    /// A secret dies with the key that minted it: keeps only the secrets of the keys in
    /// `live` (ids), or, when no keys are configured, those minted without one. Returns how
    /// many were revoked.
    pub fn keep_keys(&mut self, live: &std::collections::HashSet<String>) -> usize {
        let before = self.held.len();
        self.held.retain(|_, (_, grant)| match &grant.key_id {
            Some(id) => live.contains(id),
            None => live.is_empty(),
        });
        let revoked = before - self.held.len();
        if revoked > 0 {
            self.per_key.retain(|key, _| key.as_ref().map_or(live.is_empty(), |id| live.contains(id)));
        }
        revoked
    }
}

/// The `session.update` a session opened with a secret starts with: the secret's settings,
/// less what is not a setting (the model was chosen when the client connected).
pub(crate) fn session_update(session: &serde_json::Value) -> String {
    let mut session = session.clone();
    if let Some(s) = session.as_object_mut() {
        s.remove("model");
        s.remove("type");
    }
    serde_json::json!({"type": "session.update", "session": session}).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_update_drops_what_is_not_a_setting() {
        let text = session_update(&serde_json::json!({"type": "realtime", "model": "m", "instructions": "hi"}));
        let out: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(out, serde_json::json!({"type": "session.update", "session": {"instructions": "hi"}}));
    }

    fn grant() -> Grant {
        Grant { key_id: Some("key_abc".into()), session: None }
    }

    #[test]
    fn a_secret_is_accepted_once() {
        let mut s = ClientSecrets::new(10, 10);
        let now = Instant::now();
        let m = s.mint(grant(), Duration::from_secs(60), now).unwrap();
        assert!(m.value.starts_with(PREFIX) && m.value.len() == PREFIX.len() + 64);
        assert_eq!(s.peek(&m.value, now), Some(grant()), "a look leaves it");
        assert_eq!(s.redeem(&m.value, now), Some(grant()));
        assert_eq!(s.redeem(&m.value, now), None, "the second use is refused");
        assert_eq!(s.peek(&m.value, now), None);
    }

    #[test]
    fn an_expired_secret_is_refused_and_forgotten() {
        let mut s = ClientSecrets::new(10, 10);
        let now = Instant::now();
        let m = s.mint(grant(), Duration::from_secs(60), now).unwrap();
        assert_eq!(s.redeem(&m.value, now + Duration::from_secs(60)), None);
        assert_eq!(s.outstanding(), 0);
        assert_eq!(s.redeem("ek_unknown", now), None);
    }

    #[test]
    fn minting_stops_at_the_bound_until_secrets_expire() {
        let mut s = ClientSecrets::new(2, 10);
        let now = Instant::now();
        for _ in 0..2 {
            s.mint(grant(), Duration::from_secs(10), now).unwrap();
        }
        assert_eq!(s.mint(grant(), Duration::from_secs(10), now).unwrap_err(), MintRefusal::Full { max: 2 });
        assert!(s.mint(grant(), Duration::from_secs(10), now + Duration::from_secs(10)).is_ok());
        assert_eq!(s.outstanding(), 1, "the expired ones were dropped");
    }

    #[test]
    fn one_key_cannot_take_every_place() {
        let mut s = ClientSecrets::new(10, 2);
        let now = Instant::now();
        let other = Grant { key_id: Some("key_other".into()), session: None };
        let first = s.mint(grant(), Duration::from_secs(10), now).unwrap();
        s.mint(grant(), Duration::from_secs(10), now).unwrap();
        assert_eq!(s.mint(grant(), Duration::from_secs(10), now).unwrap_err(), MintRefusal::FullForKey { max: 2 });
        assert!(s.mint(other, Duration::from_secs(10), now).is_ok(), "another key still mints");
        s.redeem(&first.value, now).unwrap();
        assert!(s.mint(grant(), Duration::from_secs(10), now).is_ok(), "a used secret frees its key's place");
    }

    #[test]
    fn a_secret_dies_with_its_key() {
        let mut secrets = ClientSecrets::new(10, 10);
        let now = Instant::now();
        let ttl = Duration::from_secs(60);
        let grant = |id: Option<&str>| Grant { key_id: id.map(String::from), session: None };
        let old = secrets.mint(grant(Some("key_old")), ttl, now).unwrap();
        let kept = secrets.mint(grant(Some("key_kept")), ttl, now).unwrap();
        let keyless = secrets.mint(grant(None), ttl, now).unwrap();
        let live: std::collections::HashSet<String> = ["key_kept".to_string()].into();
        assert_eq!(secrets.keep_keys(&live), 2, "the removed key's, and the one minted with no key");
        assert!(secrets.peek(&old.value, now).is_none());
        assert!(secrets.peek(&keyless.value, now).is_none());
        assert!(secrets.peek(&kept.value, now).is_some());
        assert_eq!(secrets.keep_keys(&live), 0);
    }
}
