//! `[node]` (this host serving its workers to gateways: `omni-gateway node`) and `[[nodes]]`
//! (the nodes whose workers join this gateway's pool).

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::check::{Base, Invalid, check_name, host_port, node_token, positive, resolve_bind};
use super::server::TlsConfig;

/// `[node]`: read by `omni-gateway node` only. Where this host serves its `[[workers]]` to
/// gateways, and the token a gateway must present.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct NodeConfig {
    pub bind: String,
    pub token: String,
    /// Each side says something at least this often (a ping when it has nothing to say).
    pub heartbeat_interval_s: f64,
    /// A gateway heard from for this long is gone: its workers are freed.
    pub heartbeat_timeout_s: f64,
    pub tls: TlsConfig,
    /// In a cluster: the `HOST:PORT` gateways dial to reach this node (default: its first
    /// bound address; set it when that is not what gateways can reach, e.g. 0.0.0.0).
    pub advertise: String,
}

impl Default for NodeConfig {
    fn default() -> Self {
        NodeConfig {
            bind: "127.0.0.1:7100".into(),
            token: String::new(),
            heartbeat_interval_s: 1.0,
            heartbeat_timeout_s: 5.0,
            tls: TlsConfig::default(),
            advertise: String::new(),
        }
    }
}

/// `[node]`, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeServe {
    pub bind: Vec<std::net::SocketAddr>,
    pub token: String,
    pub heartbeat_interval: Duration,
    pub heartbeat_timeout: Duration,
    /// Certificate and key, resolved, when both are set.
    pub tls: Option<(PathBuf, PathBuf)>,
    /// `[node] advertise` (empty: the first bound address).
    pub advertise: String,
}

impl NodeConfig {
    pub fn validate(&self, base: Base<'_>) -> Result<NodeServe, Invalid> {
        let bind = resolve_bind("bind", &self.bind)?;
        if self.token.is_empty() {
            return Err(Invalid::new("token", "is required: the secret a gateway presents (16 bytes or more)"));
        }
        node_token("token", &self.token)?;
        positive("heartbeat_interval_s", self.heartbeat_interval_s)?;
        if self.heartbeat_timeout_s <= self.heartbeat_interval_s {
            return Err(Invalid::new("heartbeat_timeout_s", "must be longer than node.heartbeat_interval_s"));
        }
        let tls = base.tls_pair("node", &self.tls.cert, &self.tls.key)?;
        Ok(NodeServe {
            bind,
            token: self.token.clone(),
            heartbeat_interval: Duration::from_secs_f64(self.heartbeat_interval_s),
            heartbeat_timeout: Duration::from_secs_f64(self.heartbeat_timeout_s),
            tls,
            advertise: self.advertise.clone(),
        })
    }
}

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
    pub replica: Option<crate::link::replica::Credential>,
}

impl NodeLink {
    /// What the handshake proves on this link.
    pub fn secret(&self) -> crate::link::handshake::Secret<'_> {
        match &self.replica {
            Some(c) => crate::link::handshake::Secret::Replica { name: &c.name, password: c.password() },
            None => crate::link::handshake::Secret::Token(&self.token),
        }
    }
}

/// Every entry checked; a node's name must not clash with another's or a worker's.
pub(super) fn validate(entries: &[NodeEntry], worker_names: &[&str], base: Base<'_>) -> Result<Vec<NodeLink>, Invalid> {
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
