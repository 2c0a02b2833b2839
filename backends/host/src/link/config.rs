//! `[[nodes]]`: the nodes whose workers join this gateway's pool, each reached over a link
//! (`crate::remote`), and the tokens a node and its gateways prove to each other.

use std::path::PathBuf;
use std::time::Duration;

use omni_actors::settings::{Base, Invalid, check_name, host_port, positive, secret};
use serde::Deserialize;

/// One `[[nodes]]` entry: a node whose workers join this gateway's pool.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct NodeEntry {
    /// Names its workers (`NAME/worker-0`); defaults to the address's host.
    #[serde(default)]
    pub name: Option<String>,
    /// `HOST:PORT` of the node's `[node] bind`.
    pub address: String,
    /// The node's `[node] token`.
    pub token: String,
    /// A PEM certificate (the node's own, or the CA that signed it): the link is TLS,
    /// verified against it. Empty: plain TCP.
    #[serde(default)]
    pub ca: String,
    /// The name the node's certificate is for; defaults to the address's host.
    #[serde(default)]
    pub server_name: String,
    #[serde(default = "default_node_heartbeat_interval")]
    pub heartbeat_interval_s: f64,
    /// A node not heard from for this long is down: the sessions on its workers end
    /// (backend_error) and the gateway reconnects with backoff.
    #[serde(default = "default_node_heartbeat_timeout")]
    pub heartbeat_timeout_s: f64,
}

fn default_node_heartbeat_interval() -> f64 {
    1.0
}
fn default_node_heartbeat_timeout() -> f64 {
    5.0
}

/// A `[[nodes]]` entry, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeLink {
    pub name: String,
    pub address: String,
    pub token: String,
    pub ca: Option<PathBuf>,
    pub server_name: String,
    pub heartbeat_interval: Duration,
    pub heartbeat_timeout: Duration,
    /// The networks the node may be reached in (empty: any): a replica's
    /// `[cluster] node_networks`, for the addresses its grants name.
    pub networks: Vec<ipnet::IpNet>,
    /// A replica's: the credential it proves its name with (then `token` is unused).
    pub replica: Option<super::replica::Credential>,
}

impl NodeLink {
    /// What the handshake proves on this link.
    pub fn secret(&self) -> super::handshake::Secret<'_> {
        match &self.replica {
            Some(c) => super::handshake::Secret::Replica { name: &c.name, password: c.password() },
            None => super::handshake::Secret::Token(&self.token),
        }
    }
}

/// Every entry checked; a node's name must not clash with another's or a worker's.
pub fn validate(entries: &[NodeEntry], worker_names: &[&str], base: Base<'_>) -> Result<Vec<NodeLink>, Invalid> {
    let mut nodes: Vec<NodeLink> = Vec::new();
    for (i, n) in entries.iter().enumerate() {
        let at = |key: &str| format!("nodes[{i}].{key}");
        let link = n.validate(base).map_err(|e| e.under(&format!("nodes[{i}]")))?;
        if nodes.iter().any(|other| other.name == link.name) {
            return Err(Invalid::new(at("name"), format!("'{}' names two nodes", link.name)));
        }
        if worker_names.iter().any(|w| w.starts_with(&format!("{}/", link.name))) {
            return Err(Invalid::new(at("name"), format!("'{}' clashes with a worker name", link.name)));
        }
        nodes.push(link);
    }
    Ok(nodes)
}

impl NodeEntry {
    pub fn validate(&self, base: Base<'_>) -> Result<NodeLink, Invalid> {
        let (host, _) = host_port("address", &self.address)?;
        let name = self.name.clone().unwrap_or_else(|| host.clone());
        check_name("name", &name)?;
        node_token("token", &self.token)?;
        positive("heartbeat_interval_s", self.heartbeat_interval_s)?;
        if self.heartbeat_timeout_s <= self.heartbeat_interval_s {
            return Err(Invalid::new("heartbeat_timeout_s", "must be longer than heartbeat_interval_s"));
        }
        let ca = (!self.ca.is_empty()).then(|| base.file("ca", &self.ca)).transpose()?;
        Ok(NodeLink {
            name,
            address: self.address.clone(),
            token: self.token.clone(),
            ca,
            server_name: if self.server_name.is_empty() { host } else { self.server_name.clone() },
            heartbeat_interval: Duration::from_secs_f64(self.heartbeat_interval_s),
            heartbeat_timeout: Duration::from_secs_f64(self.heartbeat_timeout_s),
            networks: Vec::new(),
            replica: None,
        })
    }
}

/// A node token (a node's `[node] token`, a gateway's `[[nodes]] token`, the cluster's) is at
/// least this long.
pub const MIN_TOKEN_BYTES: usize = 32;
/// ...and zxcvbn must estimate it takes at least 10^this guesses: its ceiling (it counts in a
/// u64), which a random string of 32 bytes or more reaches, and repeats, sequences and common
/// words do not. (It cannot tell a long passphrase from a random string: the hint says how to
/// make the latter.)
const MIN_TOKEN_GUESSES_LOG10: f64 = 19.0;
/// How to make a good one, for the error.
const TOKEN_HINT: &str = "make one with `openssl rand -base64 32`";

/// A token two parts prove to each other (a node and its gateways, the replicas of a cluster):
/// long and random, as a proof of it can be tried offline against guesses.
pub fn node_token(key: &str, value: &str) -> Result<(), Invalid> {
    secret(key, value)?;
    if value.len() < MIN_TOKEN_BYTES {
        let why = format!(
            "a node token must be at least {MIN_TOKEN_BYTES} bytes (this one has {}): {TOKEN_HINT}",
            value.len()
        );
        return Err(Invalid::new(key, why));
    }
    let lower = value.to_ascii_lowercase();
    if ["change-me", "changeme", "change_me", "placeholder", "replace-me", "example"].iter().any(|p| lower.contains(p))
    {
        return Err(Invalid::new(key, format!("is a placeholder, not a secret: {TOKEN_HINT}")));
    }
    let guesses = zxcvbn::zxcvbn(value, &[]).guesses_log10();
    if guesses < MIN_TOKEN_GUESSES_LOG10 {
        let why = format!("is guessable (words, sequences or repeats: about 10^{guesses:.0} guesses): {TOKEN_HINT}");
        return Err(Invalid::new(key, why));
    }
    Ok(())
}

#[cfg(test)]
mod token_tests {
    use super::node_token;

    #[test]
    fn a_node_token_is_long_random_and_no_placeholder() {
        for (token, why) in [
            ("node-token-0123456789abcdef", "at least 32 bytes"),
            ("change-me-node-token-0123456789", "at least 32 bytes"),
            ("change-me-to-a-long-node-token-Xq7pL2vR9", "placeholder"),
            ("passwordpasswordpasswordpassword12", "guessable"),
            ("aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "guessable"),
            ("0123456789012345678901234567890123456789", "guessable"),
        ] {
            let e = node_token("token", token).expect_err(token);
            assert!(e.to_string().contains(why), "{token}: {e}");
            assert!(e.to_string().contains("openssl rand"), "the way to a good one: {e}");
        }
        for token in [
            "q3V8r7lWm0Jx2d9Kp4TzY6bN1cHs5fGa8uE0iO2wRkM=",
            "9f2c4a7e1b8d3f6a0c5e9b2d7f4a1c8e3b6d0f9a2c5e8b1d4f7a0c3e6b9d2f5a",
        ] {
            node_token("token", token).unwrap_or_else(|e| panic!("{token}: {e}"));
        }
    }
}
