//! `[sip]`: telephone calls from a SIP trunk (see `crate::transport::sip`). SIP over UDP on
//! `bind`; each call's RTP on its own UDP port of `rtp_ports`, bound on `rtp_bind` and
//! advertised in the SDP answer as `public_ip` (default: `rtp_bind`). Only INVITEs from
//! `allowed_networks` (the trunk's addresses) are answered; others get 403. Which session a call
//! opens is chosen by the number it called (`[[sip.routes]]`).

use std::net::{IpAddr, SocketAddr};

use serde::Deserialize;

use super::check::Invalid;

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct SipConfig {
    /// Whether the gateway answers SIP at all.
    pub enabled: bool,
    /// Where SIP is heard (UDP).
    pub bind: String,
    /// The address the calls' RTP sockets bind: one address, not a wildcard (the SDP answer
    /// names it unless `public_ip` is set).
    pub rtp_bind: String,
    /// The UDP ports calls take for RTP, first and last, both included: an even port a call
    /// (the odd one above is RTCP's).
    pub rtp_ports: [u16; 2],
    /// The address trunks reach the gateway at (behind NAT): put in the SDP answer and in the
    /// SIP Contact (where in-dialog requests go); empty: `rtp_bind`.
    pub public_ip: String,
    /// The networks INVITEs may come from (CIDR; a bare address is one host). Others: 403.
    pub allowed_networks: Vec<String>,
    /// Which session each called number opens; the first that matches is taken.
    pub routes: Vec<SipRouteEntry>,
    /// How long a call offered to the app (a route's `accept = "webhook"`) rings for its
    /// accept or reject; then it is refused (480).
    pub accept_timeout_s: f64,
}

/// Who accepts a call to a route's number.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum Accept {
    /// The gateway, at once, with the route's model, instructions and voice.
    #[default]
    Route,
    /// The app: the call rings while `realtime.call.incoming` goes to the `[[webhooks]]` that
    /// take it, and the app accepts it (with the session's settings) or rejects it through
    /// `POST /v1/realtime/calls/{call_id}/accept` or `/reject`, as with OpenAI's SIP.
    Webhook,
}

/// `[[sip.routes]]`: the session a called number opens.
#[derive(Debug, Clone, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields, default)]
pub struct SipRouteEntry {
    /// The number called (the user part of the INVITE's Request-URI, e.g. `+15551230000`);
    /// `*`: any number.
    pub number: String,
    /// The model the session speaks as (`[[models]]`); empty: the first model.
    pub model: String,
    /// The session's instructions.
    pub instructions: String,
    /// The model's voice.
    pub voice: String,
    /// Who accepts the call: `"route"` (this entry's settings, at once) or `"webhook"` (the
    /// app, told by `realtime.call.incoming`; this entry's model, instructions and voice are
    /// the defaults of what its accept does not say).
    pub accept: Accept,
}

impl Default for SipConfig {
    fn default() -> Self {
        SipConfig {
            enabled: false,
            bind: "127.0.0.1:5060".into(),
            rtp_bind: "127.0.0.1".into(),
            rtp_ports: [40000, 40999],
            public_ip: String::new(),
            allowed_networks: vec!["127.0.0.0/8".into(), "::1/128".into()],
            routes: vec![SipRouteEntry { number: "*".into(), ..Default::default() }],
            accept_timeout_s: 20.0,
        }
    }
}

/// `[sip]` resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct SipSpec {
    pub bind: SocketAddr,
    pub rtp_bind: IpAddr,
    pub rtp_ports: std::ops::RangeInclusive<u16>,
    pub public_ip: IpAddr,
    pub allowed_networks: Vec<ipnet::IpNet>,
    pub routes: Vec<SipRouteEntry>,
    pub accept_timeout: std::time::Duration,
}

impl SipSpec {
    /// The route of a call to `number`: the first that names it, or `*`.
    pub fn route(&self, number: &str) -> Option<&SipRouteEntry> {
        self.routes.iter().find(|r| r.number == "*" || r.number == number)
    }

    /// Whether an INVITE from `ip` is answered.
    pub fn allows(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        self.allowed_networks.iter().any(|n| n.contains(&ip))
    }
}

impl SipConfig {
    /// `None` when SIP is off.
    pub fn validate(&self) -> Result<Option<SipSpec>, Invalid> {
        if !self.enabled {
            return Ok(None);
        }
        let bind: SocketAddr = self.bind.parse().map_err(|_| {
            Invalid::new("bind", format!("'{}' is not an address and port (\"0.0.0.0:5060\")", self.bind))
        })?;
        let rtp_bind: IpAddr = self
            .rtp_bind
            .parse()
            .map_err(|_| Invalid::new("rtp_bind", format!("'{}' is not an IP address", self.rtp_bind)))?;
        let public_ip = match self.public_ip.as_str() {
            "" if rtp_bind.is_unspecified() => {
                return Err(Invalid::new(
                    "rtp_bind",
                    "is a wildcard: set public_ip to the address the trunk sends RTP to (the SDP answer names it)",
                ));
            }
            "" => rtp_bind,
            ip => ip
                .parse::<IpAddr>()
                .ok()
                .filter(|ip| !ip.is_unspecified())
                .ok_or_else(|| Invalid::new("public_ip", format!("'{ip}' is not an address a trunk can reach")))?,
        };
        if public_ip.is_ipv6() != rtp_bind.is_ipv6() {
            return Err(Invalid::new(
                "public_ip",
                format!(
                    "is {public_ip}, of another family than rtp_bind {rtp_bind}: the RTP sockets could not reach it"
                ),
            ));
        }
        let [first, last] = self.rtp_ports;
        if first == 0 || first > last {
            return Err(Invalid::new("rtp_ports", "must be [first, last] with 0 < first <= last"));
        }
        let allowed_networks = self
            .allowed_networks
            .iter()
            .map(|n| {
                n.parse::<ipnet::IpNet>().or_else(|_| n.parse::<IpAddr>().map(ipnet::IpNet::from)).map_err(|_| {
                    Invalid::new("allowed_networks", format!("'{n}' is not a network (\"203.0.113.0/24\")"))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        if self.routes.is_empty() {
            return Err(Invalid::new("routes", "at least one [[sip.routes]] (number = \"*\" answers any number)"));
        }
        if let Some(r) = self.routes.iter().find(|r| r.number.is_empty()) {
            return Err(Invalid::new(
                "routes",
                format!("a route without a number (model '{}'): use \"*\" for any", r.model),
            ));
        }
        if !(self.accept_timeout_s > 0.0 && self.accept_timeout_s <= 300.0) {
            return Err(Invalid::new("accept_timeout_s", "must be over 0 and at most 300"));
        }
        Ok(Some(SipSpec {
            accept_timeout: std::time::Duration::from_secs_f64(self.accept_timeout_s),
            bind,
            rtp_bind,
            rtp_ports: first..=last,
            public_ip,
            allowed_networks,
            routes: self.routes.clone(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn off_by_default_and_on_with_its_defaults() {
        assert_eq!(SipConfig::default().validate().unwrap(), None);
        let on = SipConfig { enabled: true, ..Default::default() }.validate().unwrap().unwrap();
        assert!(on.allows("127.0.0.1".parse().unwrap()) && on.allows("::ffff:127.0.0.1".parse().unwrap()));
        assert!(!on.allows("203.0.113.9".parse().unwrap()));
        assert_eq!(on.route("+15551230000").map(|r| r.number.as_str()), Some("*"));
    }

    #[test]
    fn a_wildcard_rtp_address_needs_a_public_one_and_networks_must_parse() {
        let wild = SipConfig { enabled: true, rtp_bind: "0.0.0.0".into(), ..Default::default() };
        assert_eq!(wild.validate().unwrap_err().key, "rtp_bind");
        let mixed =
            SipConfig { enabled: true, rtp_bind: "::".into(), public_ip: "203.0.113.1".into(), ..Default::default() };
        assert_eq!(mixed.validate().unwrap_err().key, "public_ip");
        let bad = SipConfig { enabled: true, allowed_networks: vec!["trunk".into()], ..Default::default() };
        assert_eq!(bad.validate().unwrap_err().key, "allowed_networks");
        let host = SipConfig { enabled: true, allowed_networks: vec!["198.51.100.7".into()], ..Default::default() };
        assert!(host.validate().unwrap().unwrap().allows("198.51.100.7".parse().unwrap()));
    }

    #[test]
    fn a_number_routes_to_its_own_entry_before_any() {
        let routes = vec![
            SipRouteEntry { number: "100".into(), model: "a".into(), ..Default::default() },
            SipRouteEntry { number: "*".into(), model: "b".into(), ..Default::default() },
        ];
        let spec = SipConfig { enabled: true, routes, ..Default::default() }.validate().unwrap().unwrap();
        assert_eq!(spec.route("100").unwrap().model, "a");
        assert_eq!(spec.route("200").unwrap().model, "b");
    }
}
