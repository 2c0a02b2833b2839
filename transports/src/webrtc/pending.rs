//! Calls answered and not yet connected (ICE and DTLS not done), by who opened them, as a plain
//! struct: each holds a UDP port, a place in the queue and a session until it connects or its
//! `connect_timeout_s` passes, without a datagram. Caps per client address and per API key keep
//! one address or one key from holding every port of the range.

use std::collections::HashMap;
use std::net::IpAddr;

/// The caps: calls not yet connected per address (an IPv6 /64 as one) and per API key.
#[derive(Debug, Clone, Copy)]
pub struct Caps {
    pub per_address: usize,
    pub per_key: usize,
}

/// Why a call is not answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CallRefused {
    #[error("this address has {0} calls not yet connected (webrtc.max_unconnected_calls_per_ip)")]
    Address(usize),
    #[error("this API key has {0} calls not yet connected (webrtc.max_unconnected_calls_per_key)")]
    Key(usize),
}

/// Who opened a call: its address (counted as) and its key (none on an open gateway).
type Opener = (Option<IpAddr>, Option<String>);

#[derive(Debug, Default)]
pub struct Pending {
    calls: HashMap<String, Opener>,
}

impl Pending {
    /// Counts call `id` as not yet connected, unless its address or its key is at its cap.
    pub fn admit(&mut self, id: &str, ip: Option<IpAddr>, key: Option<&str>, caps: Caps) -> Result<(), CallRefused> {
        let ip = ip.map(omni_actors::net::counted_as);
        if ip.is_some() && self.calls.values().filter(|(a, _)| *a == ip).count() >= caps.per_address {
            return Err(CallRefused::Address(caps.per_address));
        }
        if key.is_some() && self.calls.values().filter(|(_, k)| k.as_deref() == key).count() >= caps.per_key {
            return Err(CallRefused::Key(caps.per_key));
        }
        self.calls.insert(id.to_string(), (ip, key.map(String::from)));
        Ok(())
    }

    /// Call `id` connected, or ended: it no longer counts.
    pub fn settle(&mut self, id: &str) {
        self.calls.remove(id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_or_a_key_holds_at_most_its_cap_until_its_calls_connect() {
        let caps = Caps { per_address: 2, per_key: 3 };
        let (a, b, c): (IpAddr, IpAddr, IpAddr) =
            ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap(), "2001:db8::1".parse().unwrap());
        let mut p = Pending::default();
        p.admit("1", Some(a), Some("k"), caps).unwrap();
        p.admit("2", Some(a), Some("k"), caps).unwrap();
        assert_eq!(p.admit("3", Some(a), Some("j"), caps), Err(CallRefused::Address(2)));
        p.admit("3", Some(b), Some("k"), caps).unwrap();
        assert_eq!(p.admit("4", Some(c), Some("k"), caps), Err(CallRefused::Key(3)), "another address, the same key");
        p.admit("4", Some(c), Some("j"), caps).unwrap();
        // Another address of the same /64 counts as the same.
        assert!(p.admit("5", Some("2001:db8::2".parse().unwrap()), None, caps).is_ok());
        assert!(p.admit("6", Some("2001:db8::3".parse().unwrap()), None, caps).is_err());
        p.settle("1");
        p.admit("7", Some(a), Some("k"), caps).expect("a connected call frees its place");
        assert_eq!(p.calls.len(), 5);
    }
}
