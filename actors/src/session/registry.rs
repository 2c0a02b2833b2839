//! Every open session, shared by the HTTP routes and the sessions themselves: admission
//! under the per-address caps (open connections, connections waiting for a worker),
//! active sessions per mode and each session's labels for status, the sessions held for a
//! client whose connection dropped and their resume tokens ([`super::resume::Tokens`]), and
//! the shutdown broadcast.

use std::collections::HashMap;
use std::net::IpAddr;

use crate::net::counted_as as address_key;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use parking_lot::Mutex;

use super::resume::Tokens;
use crate::domain::Mode;
use crate::messages::session::Shutdown;

/// Why a connection was refused before the upgrade.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The address already has as many connections open as it may.
    TooManyConnections,
    /// The address already has as many connections waiting for a worker as it may.
    TooManyWaiting,
    /// The server is stopping.
    ShuttingDown,
}

/// The caps per client address (0 = none).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AddressCaps {
    /// Connections one address may have open.
    pub connections: usize,
    /// Connections one address may have waiting for a worker.
    pub waiting: usize,
}

#[derive(Debug, Default, Clone, Copy)]
struct PerAddress {
    open: usize,
    waiting: usize,
}

/// What status shows of a session beside its worker: set once, when it initialises.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Labels {
    /// Its id.
    pub session_id: String,
    /// The wire dialect its client speaks.
    pub dialect: &'static str,
    /// How its client reaches the server.
    pub transport: &'static str,
}

struct Open {
    shutdown: Recipient<Shutdown>,
    labels: Option<Labels>,
    /// Its client's connection dropped at this instant; it is held for a resume.
    away_since: Option<Instant>,
}

#[derive(Default)]
struct Inner {
    sessions: HashMap<u64, Open>,
    per_ip: HashMap<IpAddr, PerAddress>,
    active: [usize; 3],
    shutdown: Option<Duration>,
}

/// Every open session and the per-address counts; see the module's documentation.
#[derive(Default)]
pub struct Registry {
    inner: Mutex<Inner>,
    tokens: Tokens,
}

/// A connection's place under its address's caps; counted as waiting until it is given
/// a worker, released when dropped (with the session).
pub struct Admission {
    registry: Arc<Registry>,
    key: Option<IpAddr>,
    waiting: bool,
}

impl Admission {
    /// The connection has a worker: it no longer counts as waiting.
    pub fn assigned(&mut self) {
        if std::mem::take(&mut self.waiting)
            && let Some(key) = self.key
            && let Some(n) = self.registry.inner.lock().per_ip.get_mut(&key)
        {
            n.waiting -= 1;
        }
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        if let Some(key) = self.key {
            let mut inner = self.registry.inner.lock();
            if let Some(n) = inner.per_ip.get_mut(&key) {
                n.open -= 1;
                n.waiting -= self.waiting as usize;
                if n.open == 0 {
                    inner.per_ip.remove(&key);
                }
            }
        }
    }
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Arc<Registry> {
        Arc::new(Registry::default())
    }

    /// Admits one more connection from `ip` (it counts as waiting until it has a worker),
    /// unless its address is at a cap or the server is stopping.
    pub fn admit(self: &Arc<Self>, ip: Option<IpAddr>, caps: AddressCaps) -> Result<Admission, Refusal> {
        let mut inner = self.inner.lock();
        if inner.shutdown.is_some() {
            return Err(Refusal::ShuttingDown);
        }
        let key = ip.map(address_key);
        if let Some(key) = key {
            let n = inner.per_ip.entry(key).or_default();
            if caps.connections > 0 && n.open >= caps.connections {
                return Err(Refusal::TooManyConnections);
            }
            if caps.waiting > 0 && n.waiting >= caps.waiting {
                return Err(Refusal::TooManyWaiting);
            }
            n.open += 1;
            n.waiting += 1;
        }
        Ok(Admission { registry: self.clone(), key, waiting: true })
    }

    /// A session started. When the server is already stopping it is told at once.
    pub fn register(&self, conn: u64, session: Recipient<Shutdown>) {
        let mut inner = self.inner.lock();
        if let Some(grace) = inner.shutdown {
            session.do_send(Shutdown { grace });
        }
        inner.sessions.insert(conn, Open { shutdown: session, labels: None, away_since: None });
    }

    /// The session on connection `conn` initialised: what status shows of it.
    pub fn label(&self, conn: u64, labels: Labels) {
        if let Some(open) = self.inner.lock().sessions.get_mut(&conn) {
            open.labels = Some(labels);
        }
    }

    /// The labels of the session on connection `conn`, once it initialised.
    pub fn labels(&self, conn: u64) -> Option<Labels> {
        self.inner.lock().sessions.get(&conn).and_then(|open| open.labels.clone())
    }

    /// The session on connection `conn` is held for its client since `since` (its connection
    /// dropped), or is not (`None`: it came back).
    pub fn set_away(&self, conn: u64, since: Option<Instant>) {
        if let Some(open) = self.inner.lock().sessions.get_mut(&conn) {
            open.away_since = since;
        }
    }

    /// Since when the session on connection `conn` is held for its client, if it is.
    pub fn away_since(&self, conn: u64) -> Option<Instant> {
        self.inner.lock().sessions.get(&conn).and_then(|open| open.away_since)
    }

    /// Sessions held now for a client whose connection dropped.
    pub fn held(&self) -> usize {
        self.inner.lock().sessions.values().filter(|open| open.away_since.is_some()).count()
    }

    /// The sessions' resume tokens.
    pub fn tokens(&self) -> &Tokens {
        &self.tokens
    }

    /// The session on connection `conn` ended: it no longer counts as open, and is no longer
    /// told of a shutdown.
    pub fn unregister(&self, conn: u64) {
        self.inner.lock().sessions.remove(&conn);
    }

    /// A session of `mode` became active (+1) or ended (-1).
    pub fn set_active(&self, mode: Mode, active: bool) {
        let mut inner = self.inner.lock();
        let n = &mut inner.active[mode.index()];
        *n = if active { *n + 1 } else { n.saturating_sub(1) };
    }

    /// Sessions of `mode` active now (past `session.created`).
    pub fn active(&self, mode: Mode) -> usize {
        self.inner.lock().active[mode.index()]
    }

    /// Open sessions.
    pub fn len(&self) -> usize {
        self.inner.lock().sessions.len()
    }

    /// Whether no session is open.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether [`Registry::shutdown`] was called.
    pub fn shutting_down(&self) -> bool {
        self.inner.lock().shutdown.is_some()
    }

    /// Refuses new connections and tells every open session to end.
    pub fn shutdown(&self, grace: Duration) {
        let mut inner = self.inner.lock();
        inner.shutdown = Some(grace);
        for open in inner.sessions.values() {
            open.shutdown.do_send(Shutdown { grace });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_per_ip_caps_count_open_and_waiting_connections() {
        let r = Registry::new();
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let caps = AddressCaps { connections: 3, waiting: 2 };
        let mut a = r.admit(Some(ip), caps).unwrap();
        let _b = r.admit(Some(ip), caps).unwrap();
        assert_eq!(r.admit(Some(ip), caps).err(), Some(Refusal::TooManyWaiting));
        a.assigned();
        let _c = r.admit(Some(ip), caps).unwrap();
        assert_eq!(r.admit(Some(ip), caps).err(), Some(Refusal::TooManyConnections));
        assert!(r.admit(Some("10.0.0.2".parse().unwrap()), caps).is_ok(), "another address");
        drop(a);
        let _d = r.admit(Some(ip), AddressCaps { connections: 3, waiting: 0 }).unwrap();
        for _ in 0..100 {
            std::mem::forget(r.admit(Some(ip), AddressCaps::default()).unwrap());
        }
    }

    #[test]
    fn an_ipv6_host_counts_as_its_slash_64() {
        let a: IpAddr = "2001:db8:1:2:aaaa::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:ffff:1:2:3".parse().unwrap();
        let other: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert_eq!(address_key(a), address_key(b));
        assert_ne!(address_key(a), address_key(other));
        let mapped: IpAddr = "::ffff:10.1.2.3".parse().unwrap();
        assert_eq!(address_key(mapped), "10.1.2.3".parse::<IpAddr>().unwrap());
        let r = Registry::new();
        let caps = AddressCaps { connections: 1, waiting: 0 };
        let _held = r.admit(Some(a), caps).unwrap();
        assert_eq!(r.admit(Some(b), caps).err(), Some(Refusal::TooManyConnections));
        assert!(r.admit(Some(other), caps).is_ok());
    }

    #[test]
    fn shutdown_refuses_new_connections() {
        let r = Registry::new();
        r.shutdown(Duration::from_secs(1));
        assert_eq!(r.admit(None, AddressCaps::default()).err(), Some(Refusal::ShuttingDown));
        assert!(r.shutting_down());
    }

    #[test]
    fn active_sessions_per_mode() {
        let r = Registry::new();
        r.set_active(Mode::Chat, true);
        r.set_active(Mode::Chat, true);
        r.set_active(Mode::Chat, false);
        r.set_active(Mode::Video, false);
        assert_eq!((r.active(Mode::Chat), r.active(Mode::Video)), (1, 0));
    }
}
