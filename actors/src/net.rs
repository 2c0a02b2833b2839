//! Peers' addresses as the limits count them, and the networks a config names.
//!
//! One host holds an IPv4 address, or a whole IPv6 /64: caps and throttles per address count
//! an IPv6 peer by its /64, or it would pass any of them by changing its low bits.

use std::net::IpAddr;

use ipnet::IpNet;

/// The address a peer counts under: its IPv4 address (an IPv4-mapped IPv6 one too), or the
/// /64 of its IPv6 address (the rule the session registry's caps follow).
pub use crate::session::address_key as counted_as;

/// Whether `ip` is in any of `networks`.
pub fn in_any(ip: IpAddr, networks: &[IpNet]) -> bool {
    let ip = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    };
    networks.iter().any(|n| n.contains(&ip))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn networks_contain_their_addresses_mapped_or_not() {
        let nets: Vec<IpNet> = vec!["10.0.0.0/8".parse().unwrap(), "fd00::/8".parse().unwrap()];
        assert!(in_any("10.1.2.3".parse().unwrap(), &nets));
        assert!(in_any("::ffff:10.1.2.3".parse().unwrap(), &nets));
        assert!(in_any("fd12::1".parse().unwrap(), &nets));
        assert!(!in_any("11.0.0.1".parse().unwrap(), &nets));
    }
}
