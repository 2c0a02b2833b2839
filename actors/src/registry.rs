//! Every open session, shared by the HTTP routes and the sessions themselves: per-IP
//! admission, active sessions per mode for status, and the shutdown broadcast.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use parking_lot::Mutex;

use crate::domain::Mode;

/// Asks a session to end because the server is stopping: at once when it has no step in
/// flight, else when the step has finished, at the latest after `grace`.
#[derive(Message, Clone, Copy)]
#[rtype(result = "()")]
pub struct Shutdown {
    pub grace: Duration,
}

/// Why a connection was refused before the upgrade.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    TooManyConnections,
    ShuttingDown,
}

#[derive(Default)]
struct Inner {
    sessions: HashMap<u64, Recipient<Shutdown>>,
    per_ip: HashMap<IpAddr, usize>,
    active: [usize; 3],
    shutdown: Option<Duration>,
}

#[derive(Default)]
pub struct Registry {
    inner: Mutex<Inner>,
}

/// A connection's place under its IP's cap; released when dropped (with the session).
pub struct Admission {
    registry: Arc<Registry>,
    ip: Option<IpAddr>,
}

impl Drop for Admission {
    fn drop(&mut self) {
        if let Some(ip) = self.ip {
            let mut inner = self.registry.inner.lock();
            if let Some(n) = inner.per_ip.get_mut(&ip) {
                *n -= 1;
                if *n == 0 {
                    inner.per_ip.remove(&ip);
                }
            }
        }
    }
}

impl Registry {
    pub fn new() -> Arc<Registry> {
        Arc::new(Registry::default())
    }

    /// Admits one more connection from `ip`, unless `cap` (0 = none) connections from it
    /// are open or the server is stopping.
    pub fn admit(self: &Arc<Self>, ip: Option<IpAddr>, cap: usize) -> Result<Admission, Refusal> {
        let mut inner = self.inner.lock();
        if inner.shutdown.is_some() {
            return Err(Refusal::ShuttingDown);
        }
        if let Some(ip) = ip {
            let n = inner.per_ip.entry(ip).or_insert(0);
            if cap > 0 && *n >= cap {
                return Err(Refusal::TooManyConnections);
            }
            *n += 1;
        }
        Ok(Admission { registry: self.clone(), ip })
    }

    /// A session started. When the server is already stopping it is told at once.
    pub fn register(&self, conn: u64, session: Recipient<Shutdown>) {
        let mut inner = self.inner.lock();
        if let Some(grace) = inner.shutdown {
            session.do_send(Shutdown { grace });
        }
        inner.sessions.insert(conn, session);
    }

    pub fn unregister(&self, conn: u64) {
        self.inner.lock().sessions.remove(&conn);
    }

    /// A session of `mode` became active (+1) or ended (-1).
    pub fn set_active(&self, mode: Mode, active: bool) {
        let mut inner = self.inner.lock();
        let n = &mut inner.active[mode.index()];
        *n = if active { *n + 1 } else { n.saturating_sub(1) };
    }

    pub fn active(&self, mode: Mode) -> usize {
        self.inner.lock().active[mode.index()]
    }

    /// Open sessions.
    pub fn len(&self) -> usize {
        self.inner.lock().sessions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn shutting_down(&self) -> bool {
        self.inner.lock().shutdown.is_some()
    }

    /// Refuses new connections and tells every open session to end.
    pub fn shutdown(&self, grace: Duration) {
        let mut inner = self.inner.lock();
        inner.shutdown = Some(grace);
        for session in inner.sessions.values() {
            session.do_send(Shutdown { grace });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_per_ip_cap_counts_open_connections() {
        let r = Registry::new();
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let a = r.admit(Some(ip), 2).unwrap();
        let _b = r.admit(Some(ip), 2).unwrap();
        assert_eq!(r.admit(Some(ip), 2).err(), Some(Refusal::TooManyConnections));
        assert!(r.admit(Some("10.0.0.2".parse().unwrap()), 2).is_ok(), "another IP");
        drop(a);
        assert!(r.admit(Some(ip), 2).is_ok(), "a closed connection frees its place");
        for _ in 0..100 {
            std::mem::forget(r.admit(Some(ip), 0).unwrap());
        }
    }

    #[test]
    fn shutdown_refuses_new_connections() {
        let r = Registry::new();
        r.shutdown(Duration::from_secs(1));
        assert_eq!(r.admit(None, 0).err(), Some(Refusal::ShuttingDown));
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
