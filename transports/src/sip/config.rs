//! `[sip]`: telephone calls from a SIP trunk (see `crate::sip`). SIP over UDP on
//! `bind`; each call's RTP on its own UDP port of `rtp_ports`, bound on `rtp_bind` and
//! advertised in the SDP answer as `public_ip` (default: `rtp_bind`). Only requests from
//! `allowed_networks` (the trunk's addresses) are served; a stranger's INVITE gets one stateless
//! 403 (`crate::sip::gate`). A UDP source address can be forged: on the internet, set
//! `[[sip.users]]` too. Which session a call opens is chosen by the number it called
//! (`[[sip.routes]]`).

use std::net::{IpAddr, SocketAddr};

use serde::Deserialize;

use omni_actors::settings::Base;
use omni_actors::settings::{Invalid, secret};

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
    /// The networks requests may come from (CIDR; a bare address is one host). Others are
    /// dropped (an INVITE: one stateless 403).
    pub allowed_networks: Vec<String>,
    /// INVITEs that open a call, a second, from one address, at most (past it: dropped
    /// unanswered; 0: no cap).
    pub max_invites_per_s_per_ip: u32,
    /// Which session each called number opens; the first that matches is taken.
    pub routes: Vec<SipRouteEntry>,
    /// How long a call offered to the app (a route's `accept = "webhook"`) rings for its
    /// accept or reject; then it is refused (480).
    pub accept_timeout_s: f64,
    /// The trunks' digest credentials: with any, an INVITE must also prove one (digest, qop
    /// auth) or is challenged (401) and refused (403).
    pub users: Vec<SipUserEntry>,
    /// The digest realm the challenges name.
    pub realm: String,
    /// The digest's hash: `"md5"` (RFC 3261's, which every trunk takes) or `"sha-256"` (RFC
    /// 8760's). One challenge only: offered both, some user agents (baresip 1.0) fail.
    pub digest_algorithm: DigestAlgorithm,
}

/// The hash of `[sip] digest_algorithm`.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
pub enum DigestAlgorithm {
    #[default]
    #[serde(rename = "md5")]
    Md5,
    #[serde(rename = "sha-256")]
    Sha256,
}

/// `[[sip.users]]`: one trunk's digest credentials.
#[derive(Clone, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields, default)]
pub struct SipUserEntry {
    pub user: String,
    /// A file holding the password (16 bytes or more), relative to the config's directory.
    pub password_file: String,
}

impl std::fmt::Debug for SipUserEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SipUserEntry").field("user", &self.user).finish_non_exhaustive()
    }
}

/// The trunks' digest credentials, read: user and password (never shown).
#[derive(Clone, PartialEq, Default)]
pub struct SipUsers(pub Vec<(String, String)>);

impl std::fmt::Debug for SipUsers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.0.iter().map(|(user, _)| user)).finish()
    }
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
            max_invites_per_s_per_ip: 30,
            routes: vec![SipRouteEntry { number: "*".into(), ..Default::default() }],
            accept_timeout_s: 20.0,
            users: Vec::new(),
            realm: "omni-gateway".into(),
            digest_algorithm: DigestAlgorithm::Md5,
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
    pub max_invites_per_s_per_ip: u32,
    pub routes: Vec<SipRouteEntry>,
    pub accept_timeout: std::time::Duration,
    /// With any, INVITEs must prove one by digest.
    pub users: SipUsers,
    pub realm: String,
    pub digest_algorithm: DigestAlgorithm,
}

impl SipSpec {
    /// The route of a call to `number`: the first that names it, or `*`.
    pub fn route(&self, number: &str) -> Option<&SipRouteEntry> {
        self.routes.iter().find(|r| r.number == "*" || r.number == number)
    }

    /// Whether a request from `ip` is served.
    pub fn allows(&self, ip: IpAddr) -> bool {
        self.network_of(ip).is_some()
    }

    /// Which entry of `allowed_networks` (the first) `ip` is in.
    pub fn network_of(&self, ip: IpAddr) -> Option<usize> {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        self.allowed_networks.iter().position(|n| n.contains(&ip))
    }
}

impl SipConfig {
    /// `None` when SIP is off.
    pub fn validate(&self, base: Base<'_>) -> Result<Option<SipSpec>, Invalid> {
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
        if let Some(star) = self.routes.iter().position(|r| r.number == "*")
            && let Some(after) = self.routes.get(star + 1)
        {
            return Err(Invalid::new(
                "routes",
                format!(
                    "route '{}' comes after number = \"*\", which takes every call first: list it before",
                    after.number
                ),
            ));
        }
        if public_ip.is_loopback() && !bind.ip().is_loopback() {
            return Err(Invalid::new(
                "public_ip",
                format!(
                    "is {public_ip} (rtp_bind's) while SIP is heard on {bind}: a trunk on the network would be told to send \
                     its RTP and ACK to loopback; set rtp_bind to this host's address (and public_ip to the one trunks reach, behind NAT)"
                ),
            ));
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
        let mut users = SipUsers::default();
        for (i, u) in self.users.iter().enumerate() {
            let key = |k: &str| format!("users[{i}].{k}");
            if u.user.is_empty() || u.user.contains([':', '"', '\\']) || u.user.chars().any(char::is_control) {
                return Err(Invalid::new(key("user"), "a user name, without ':', '\"' or '\\'"));
            }
            if users.0.iter().any(|(other, _)| *other == u.user) {
                return Err(Invalid::new(key("user"), format!("'{}' is listed twice", u.user)));
            }
            let path = base.resolve(std::path::Path::new(&u.password_file));
            let password = std::fs::read_to_string(&path)
                .map_err(|e| Invalid::new(key("password_file"), format!("{}: {e}", path.display())))?
                .trim()
                .to_string();
            secret(&key("password_file"), &password)?;
            users.0.push((u.user.clone(), password));
        }
        if self.realm.is_empty() || self.realm.contains('"') {
            return Err(Invalid::new("realm", "a name, without '\"'"));
        }
        Ok(Some(SipSpec {
            users,
            realm: self.realm.clone(),
            digest_algorithm: self.digest_algorithm,
            accept_timeout: std::time::Duration::from_secs_f64(self.accept_timeout_s),
            bind,
            rtp_bind,
            rtp_ports: first..=last,
            public_ip,
            allowed_networks,
            max_invites_per_s_per_ip: self.max_invites_per_s_per_ip,
            routes: self.routes.clone(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn here() -> Base<'static> {
        Base(std::path::Path::new("."))
    }

    #[test]
    fn off_by_default_and_on_with_its_defaults() {
        assert_eq!(SipConfig::default().validate(here()).unwrap(), None);
        let on = SipConfig { enabled: true, ..Default::default() }.validate(here()).unwrap().unwrap();
        assert_eq!(on.max_invites_per_s_per_ip, 30);
        assert!(on.allows("127.0.0.1".parse().unwrap()) && on.allows("::ffff:127.0.0.1".parse().unwrap()));
        assert!(!on.allows("203.0.113.9".parse().unwrap()));
        assert_eq!(on.route("+15551230000").map(|r| r.number.as_str()), Some("*"));
    }

    #[test]
    fn a_wildcard_rtp_address_needs_a_public_one_and_networks_must_parse() {
        let wild = SipConfig { enabled: true, rtp_bind: "0.0.0.0".into(), ..Default::default() };
        assert_eq!(wild.validate(here()).unwrap_err().key, "rtp_bind");
        let mixed =
            SipConfig { enabled: true, rtp_bind: "::".into(), public_ip: "203.0.113.1".into(), ..Default::default() };
        assert_eq!(mixed.validate(here()).unwrap_err().key, "public_ip");
        let bad = SipConfig { enabled: true, allowed_networks: vec!["trunk".into()], ..Default::default() };
        assert_eq!(bad.validate(here()).unwrap_err().key, "allowed_networks");
        let host = SipConfig { enabled: true, allowed_networks: vec!["198.51.100.7".into()], ..Default::default() };
        assert!(host.validate(here()).unwrap().unwrap().allows("198.51.100.7".parse().unwrap()));
    }

    #[test]
    fn a_route_after_any_and_a_loopback_address_for_a_network_are_refused() {
        let routes = vec![
            SipRouteEntry { number: "*".into(), ..Default::default() },
            SipRouteEntry { number: "100".into(), ..Default::default() },
        ];
        let e = SipConfig { enabled: true, routes, ..Default::default() }.validate(here()).unwrap_err();
        assert!(e.key == "routes" && e.why.contains("'100' comes after"), "{e:?}");
        let open = SipConfig { enabled: true, bind: "0.0.0.0:5060".into(), ..Default::default() };
        let e = open.validate(here()).unwrap_err();
        assert!(e.key == "public_ip" && e.why.contains("loopback"), "{e:?}");
        let lan =
            SipConfig { enabled: true, bind: "0.0.0.0:5060".into(), rtp_bind: "10.0.0.5".into(), ..Default::default() };
        assert!(lan.validate(here()).is_ok());
    }

    #[test]
    fn a_number_routes_to_its_own_entry_before_any() {
        let routes = vec![
            SipRouteEntry { number: "100".into(), model: "a".into(), ..Default::default() },
            SipRouteEntry { number: "*".into(), model: "b".into(), ..Default::default() },
        ];
        let spec = SipConfig { enabled: true, routes, ..Default::default() }.validate(here()).unwrap().unwrap();
        assert_eq!(spec.route("100").unwrap().model, "a");
        assert_eq!(spec.route("200").unwrap().model, "b");
    }
}
