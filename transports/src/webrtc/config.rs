//! `[webrtc]`: calls at `POST /v1/realtime/calls` (see `crate::webrtc`). Each call
//! has its own UDP port from `ports`, bound on `bind`; the answer advertises one host candidate
//! per address of `public_ips` (default: `bind` itself), so behind NAT list the addresses
//! clients reach and forward the port range to this host.

use std::net::IpAddr;
use std::time::Duration;

use serde::Deserialize;

use omni_actors::settings::Invalid;

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct WebRtcConfig {
    /// Whether `POST /v1/realtime/calls` answers (404 when off).
    pub enabled: bool,
    /// The address the calls' UDP sockets bind: one address, not a wildcard (the candidates
    /// advertised must name an address).
    pub bind: String,
    /// The UDP ports calls take, first and last, both included: one port a call.
    pub ports: [u16; 2],
    /// The addresses advertised to clients; empty: `bind`.
    pub public_ips: Vec<String>,
    /// A call that has not finished ICE and DTLS this long after its answer is dropped.
    pub connect_timeout_s: f64,
    /// Lifetime of a key minted by `POST /v1/realtime/client_secrets`, unless the request asks
    /// for another (10 s to 2 h).
    pub client_secret_ttl_s: u64,
    /// Client secrets minted and not yet used, at most (past it minting answers 429).
    pub max_client_secrets: usize,
    /// ... of them minted by one API key.
    pub max_client_secrets_per_key: usize,
    /// Calls answered and not yet through ICE and DTLS, at most per client address (an IPv6
    /// /64 as one) and per API key (0: a quarter of the port range): past it a call gets 429,
    /// so one key or one address cannot hold every port.
    pub max_unconnected_calls_per_ip: usize,
    pub max_unconnected_calls_per_key: usize,
}

impl Default for WebRtcConfig {
    fn default() -> Self {
        WebRtcConfig {
            enabled: true,
            bind: "127.0.0.1".into(),
            ports: [50000, 50999],
            public_ips: Vec::new(),
            connect_timeout_s: 5.0,
            client_secret_ttl_s: 60,
            max_client_secrets: 10_000,
            max_client_secrets_per_key: 1_000,
            max_unconnected_calls_per_ip: 8,
            max_unconnected_calls_per_key: 0,
        }
    }
}

/// `[webrtc]` resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct WebRtcSpec {
    pub enabled: bool,
    pub bind: IpAddr,
    pub ports: std::ops::RangeInclusive<u16>,
    pub public_ips: Vec<IpAddr>,
    pub connect_timeout: Duration,
    pub client_secret_ttl: Duration,
    pub max_client_secrets: usize,
    pub max_client_secrets_per_key: usize,
    pub max_unconnected_calls_per_ip: usize,
    pub max_unconnected_calls_per_key: usize,
}

/// Limits of a client secret's lifetime, as the OpenAI Realtime API has them.
pub const CLIENT_SECRET_TTL: std::ops::RangeInclusive<u64> = 10..=7200;

impl WebRtcConfig {
    pub fn validate(&self) -> Result<WebRtcSpec, Invalid> {
        let bind: IpAddr =
            self.bind.parse().map_err(|_| Invalid::new("bind", format!("'{}' is not an IP address", self.bind)))?;
        if bind.is_unspecified() {
            return Err(Invalid::new(
                "bind",
                "must name one address, not a wildcard: the answer advertises it (list other addresses in public_ips)",
            ));
        }
        let [first, last] = self.ports;
        if first == 0 || first > last {
            return Err(Invalid::new("ports", "must be [first, last] with 0 < first <= last"));
        }
        let public_ips =
            self.public_ips
                .iter()
                .map(|ip| {
                    ip.parse::<IpAddr>().ok().filter(|ip| !ip.is_unspecified()).ok_or_else(|| {
                        Invalid::new("public_ips", format!("'{ip}' is not an address clients can reach"))
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
        if !(self.connect_timeout_s > 0.0 && self.connect_timeout_s <= 60.0) {
            return Err(Invalid::new("connect_timeout_s", "must be above 0 and at most 60"));
        }
        if !CLIENT_SECRET_TTL.contains(&self.client_secret_ttl_s) {
            return Err(Invalid::new("client_secret_ttl_s", "must be from 10 to 7200"));
        }
        if self.max_client_secrets == 0 {
            return Err(Invalid::new("max_client_secrets", "must be at least 1"));
        }
        if self.max_client_secrets_per_key == 0 {
            return Err(Invalid::new("max_client_secrets_per_key", "must be at least 1"));
        }
        if self.max_unconnected_calls_per_ip == 0 {
            return Err(Invalid::new("max_unconnected_calls_per_ip", "must be at least 1"));
        }
        let range = usize::from(last - first) + 1;
        let per_key = match self.max_unconnected_calls_per_key {
            0 => (range / 4).max(1),
            n => n,
        };
        Ok(WebRtcSpec {
            enabled: self.enabled,
            bind,
            ports: first..=last,
            public_ips: if public_ips.is_empty() { vec![bind] } else { public_ips },
            connect_timeout: Duration::from_secs_f64(self.connect_timeout_s),
            client_secret_ttl: Duration::from_secs(self.client_secret_ttl_s),
            max_client_secrets: self.max_client_secrets,
            max_client_secrets_per_key: self.max_client_secrets_per_key,
            max_unconnected_calls_per_ip: self.max_unconnected_calls_per_ip,
            max_unconnected_calls_per_key: per_key,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(edit: impl FnOnce(&mut WebRtcConfig)) -> Result<WebRtcSpec, Invalid> {
        let mut c = WebRtcConfig::default();
        edit(&mut c);
        c.validate()
    }

    #[test]
    fn the_default_advertises_the_bound_address() {
        let spec = with(|_| {}).unwrap();
        assert_eq!(spec.public_ips, vec!["127.0.0.1".parse::<IpAddr>().unwrap()]);
        assert_eq!(spec.ports, 50000..=50999);
    }

    #[test]
    fn each_bad_value_names_its_key() {
        assert_eq!(with(|c| c.bind = "0.0.0.0".into()).unwrap_err().key, "bind");
        assert_eq!(with(|c| c.bind = "here".into()).unwrap_err().key, "bind");
        assert_eq!(with(|c| c.ports = [6000, 5000]).unwrap_err().key, "ports");
        assert_eq!(with(|c| c.public_ips = vec!["::".into()]).unwrap_err().key, "public_ips");
        assert_eq!(with(|c| c.connect_timeout_s = 0.0).unwrap_err().key, "connect_timeout_s");
        assert_eq!(with(|c| c.client_secret_ttl_s = 5).unwrap_err().key, "client_secret_ttl_s");
    }
}
