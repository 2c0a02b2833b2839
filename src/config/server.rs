//! `[server]`: where the gateway listens and what one connection may do.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use omni_actors::settings::{Base, Invalid, network, not_negative, positive, resolve_bind};

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    pub bind: String,
    pub max_frame_bytes: usize,
    /// Output a client has not read yet, past which its session ends (slow_consumer).
    pub max_outgoing_bytes: u64,
    /// A client's messages read and not yet handled by its session, past which the server
    /// stops reading the connection until the session catches up.
    pub max_incoming_bytes: u64,
    /// What every connection's session may have read and not handled, together: past it a
    /// connection with a message of its own waiting is not read until it is handled.
    pub max_incoming_total_mb: f64,
    pub heartbeat_interval_s: f64,
    pub heartbeat_timeout_s: f64,
    pub shutdown_grace_s: f64,
    /// Open connections per client address (an IPv6 /64 counts as one); 0 = no cap.
    pub max_connections_per_ip: usize,
    /// Connections per client address waiting for a worker; 0 = no cap.
    pub max_waiting_per_ip: usize,
    /// Messages (and pings) per second one connection may send; past it they are dropped
    /// and, persisting, the connection is closed (1008). 0 = no limit.
    pub max_messages_per_s: f64,
    /// Messages one connection may send at once beyond the rate.
    pub max_messages_burst: f64,
    /// A message sent in fragments must be finished this long after its first frame.
    pub message_timeout_s: f64,
    /// What every connection's unfinished fragmented messages may hold together.
    pub max_fragment_buffer_mb: f64,
    /// Reverse proxies whose `X-Forwarded-For` names the client: addresses, or networks
    /// (`"10.0.0.0/8"`: an ingress whose pods change addresses).
    pub trusted_proxies: Vec<String>,
    pub allowed_origins: Vec<String>,
    /// How long a session whose connection dropped without a close is held for its client to
    /// resume it (`?resume=TOKEN`): its place in the queue or its worker, its conversation,
    /// what it was sent. 0: a dropped connection ends its session.
    pub resume_grace_s: f64,
    /// The last messages each session keeps for a resumed client, in KiB.
    pub resume_replay_kb: usize,
    pub tls: TlsConfig,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            bind: "127.0.0.1:8006".into(),
            max_frame_bytes: 4 * 1024 * 1024,
            max_outgoing_bytes: 8 * 1024 * 1024,
            max_incoming_bytes: 256 * 1024,
            max_incoming_total_mb: 64.0,
            heartbeat_interval_s: 5.0,
            heartbeat_timeout_s: 30.0,
            shutdown_grace_s: 10.0,
            max_connections_per_ip: 32,
            max_waiting_per_ip: 8,
            max_messages_per_s: 200.0,
            max_messages_burst: 400.0,
            message_timeout_s: 10.0,
            max_fragment_buffer_mb: 128.0,
            trusted_proxies: Vec::new(),
            allowed_origins: Vec::new(),
            resume_grace_s: 30.0,
            resume_replay_kb: 256,
            tls: TlsConfig::default(),
        }
    }
}

/// `[server.tls]` (and `[node.tls]`): with both set, TLS only.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TlsConfig {
    pub cert: String,
    pub key: String,
}

/// What `[server]` settles besides its plain values.
pub struct ServerChecked {
    /// `bind` resolved: every address a host name stands for.
    pub bind: Vec<SocketAddr>,
    pub tls: Option<(PathBuf, PathBuf)>,
    pub trusted_proxies: Vec<ipnet::IpNet>,
}

impl ServerConfig {
    pub fn heartbeat_interval(&self) -> Duration {
        Duration::from_secs_f64(self.heartbeat_interval_s)
    }

    pub fn heartbeat_timeout(&self) -> Duration {
        Duration::from_secs_f64(self.heartbeat_timeout_s)
    }

    /// How sessions are held for a resume.
    pub fn resume_terms(&self) -> omni_actors::session::resume::ResumeTerms {
        omni_actors::session::resume::ResumeTerms {
            grace: Duration::from_secs_f64(self.resume_grace_s),
            replay_bytes: self.resume_replay_kb * 1024,
        }
    }

    /// Checks the section; keys in errors are its own (`bind`, `tls.cert`...).
    pub fn validate(&self, base: Base<'_>) -> Result<ServerChecked, Invalid> {
        let bind = resolve_bind("bind", &self.bind)?;
        positive("max_frame_bytes", self.max_frame_bytes as f64)?;
        if self.max_outgoing_bytes < 65536 {
            return Err(Invalid::new("max_outgoing_bytes", "must be at least 65536"));
        }
        if self.max_incoming_bytes < 65536 {
            return Err(Invalid::new("max_incoming_bytes", "must be at least 65536"));
        }
        positive("max_incoming_total_mb", self.max_incoming_total_mb)?;
        if self.max_frame_bytes < 1024 {
            return Err(Invalid::new("max_frame_bytes", "must be at least 1024"));
        }
        positive("heartbeat_interval_s", self.heartbeat_interval_s)?;
        positive("heartbeat_timeout_s", self.heartbeat_timeout_s)?;
        if self.heartbeat_timeout_s <= self.heartbeat_interval_s {
            return Err(Invalid::new("heartbeat_timeout_s", "must be longer than server.heartbeat_interval_s"));
        }
        let tls = base.tls_pair("server", &self.tls.cert, &self.tls.key)?;
        positive("shutdown_grace_s", self.shutdown_grace_s)?;
        not_negative("max_messages_per_s", self.max_messages_per_s)?;
        if self.max_messages_per_s > 0.0 && self.max_messages_burst < 1.0 {
            return Err(Invalid::new("max_messages_burst", "must be at least 1"));
        }
        positive("message_timeout_s", self.message_timeout_s)?;
        positive("max_fragment_buffer_mb", self.max_fragment_buffer_mb)?;
        not_negative("resume_grace_s", self.resume_grace_s)?;
        if self.resume_grace_s > 3600.0 {
            return Err(Invalid::new("resume_grace_s", "must be at most 3600 (an hour)"));
        }
        let mut trusted_proxies = Vec::new();
        for (i, p) in self.trusted_proxies.iter().enumerate() {
            trusted_proxies.push(network(&format!("trusted_proxies[{i}]"), p)?);
        }
        for (i, origin) in self.allowed_origins.iter().enumerate() {
            if !(origin.starts_with("http://") || origin.starts_with("https://")) || origin.ends_with('/') {
                let why = format!("'{origin}' is not an origin like https://example.com");
                return Err(Invalid::new(format!("allowed_origins[{i}]"), why));
            }
        }
        Ok(ServerChecked { bind, tls, trusted_proxies })
    }
}
