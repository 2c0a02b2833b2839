//! `[node]`: this host serving its workers to gateways (`omni-gateway node`). The nodes whose
//! workers join a gateway's pool (`[[nodes]]`) are the backend host's section
//! (`omni_backend_host::link::config`).

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::server::TlsConfig;
use omni_actors::settings::{Base, Invalid, positive, resolve_bind};
use omni_backend_host::link::config::node_token;

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
