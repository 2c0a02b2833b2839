//! Peers' addresses as the limits count them, and the networks a config names.
//!
//! One host holds an IPv4 address, or a whole IPv6 /64: caps and throttles per address count
//! an IPv6 peer by its /64, or it would pass any of them by changing its low bits.

use std::net::IpAddr;

use ipnet::IpNet;

/// The address a peer is counted under (by the session registry's caps, the key throttle,
/// every per-address limit): an IPv4 address, or the /64 of an IPv6 one (a
/// host gets a /64 and chooses addresses in it freely). IPv4-mapped IPv6 counts as IPv4.
pub fn counted_as(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6((u128::from(v6) & !((1u128 << 64) - 1)).into()),
        },
    }
}

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
