//! `[cluster]`: gateway replicas (and their nodes) sharing one queue and their nodes' workers
//! through a store. Checked here, never opened: the store is reached when a role starts.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use omni_actors::settings::{Base, Invalid, name_ok, network, positive};

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterConfig {
    /// "none" (one gateway, the default) or "redis".
    pub engine: String,
    /// `redis://[:PASSWORD@]HOST:PORT/DB`, or `rediss://` for TLS.
    pub url: String,
    /// Redis Sentinels, `HOST:PORT` or a URL with their password or TLS
    /// (`redis://:PASSWORD@HOST:PORT`, `rediss://...`): the store is the master they name
    /// `sentinel_master`, found again after a failover (`url` then gives only the master's
    /// password, database and TLS).
    pub sentinels: Vec<String>,
    /// The name the Sentinels monitor the store's master under.
    pub sentinel_master: String,
    /// This process's name in the store (a replica's, or a node's: its workers are
    /// `NAME/WORKER`); unique in the cluster. Default: HOSTNAME-PID.
    pub name: String,
    /// Every key starts with `{PREFIX}` (one hash slot): several clusters can share a Redis.
    pub prefix: String,
    /// A replica or node not heard from for this long is gone: its waiting tickets leave
    /// the queue, its free workers are no longer offered.
    pub lease_s: f64,
    /// A node gives a granted worker to the next client when the gateway has not attached
    /// it within this long.
    pub attach_timeout_s: f64,
    /// A replica's: links kept open to each node, on which the node pushes its grants attached
    /// (0: grants come through the store and each opens its own link).
    pub standby_links: usize,
    /// Refused on a replica, which holds its own `credential` instead (the nodes' token would let
    /// it pass for any replica). Kept to say so.
    pub token: String,
    /// A replica's: its own credential, issued for its name under the nodes' token by
    /// `omni-gateway --config NODE.toml replica-credential NAME`; its name is the replica's.
    pub credential: String,
    /// A replica's: a file holding its credential (one per pod: a Secret mounted with
    /// `subPathExpr`), instead of `credential`.
    pub credential_file: String,
    /// A node's: replicas it refuses (their credentials), read again on SIGHUP; the links they
    /// keep open for grants are closed.
    pub revoked_replicas: Vec<String>,
    /// A replica's: a PEM certificate the nodes' TLS is verified against (empty: plain TCP).
    pub ca: String,
    /// A replica's: the name the nodes' certificates are for (default: the node's host).
    pub server_name: String,
    /// A replica's: the networks nodes are reached in (CIDR, `"10.0.0.0/8"`); a grant that
    /// names an address outside them is never dialled. Empty: any (a grant is dialled only
    /// if its node signed it either way).
    pub node_networks: Vec<String>,
    /// A PEM certificate the store's TLS (`rediss://`) is verified against (a private CA).
    /// Empty: the public CAs.
    pub redis_ca: String,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            engine: "none".into(),
            url: String::new(),
            sentinels: Vec::new(),
            sentinel_master: "mymaster".into(),
            name: String::new(),
            prefix: "og".into(),
            lease_s: 3.0,
            attach_timeout_s: 5.0,
            standby_links: 4,
            token: String::new(),
            credential: String::new(),
            credential_file: String::new(),
            revoked_replicas: Vec::new(),
            ca: String::new(),
            server_name: String::new(),
            node_networks: Vec::new(),
            redis_ca: String::new(),
        }
    }
}

/// `[cluster]` validated, when `engine = "redis"`.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterSpec {
    pub url: String,
    pub sentinels: Vec<String>,
    pub sentinel_master: String,
    pub name: String,
    pub prefix: String,
    pub lease: Duration,
    pub attach_timeout: Duration,
    pub standby_links: usize,
    /// A replica's credential (None on a node).
    pub credential: Option<omni_backend_host::link::replica::Credential>,
    /// A node's: the replicas it refuses.
    pub revoked_replicas: Vec<String>,
    pub ca: Option<PathBuf>,
    pub server_name: String,
    pub node_networks: Vec<ipnet::IpNet>,
    pub redis_ca: Option<PathBuf>,
}

impl ClusterSpec {
    /// The URL as logs show it (no password, no database).
    pub fn redacted_url(&self) -> String {
        omni_actors::settings::redacted_url(&self.url)
    }
}

/// What the rest of the configuration says about this process's part in a cluster.
pub struct Part {
    /// It is a node (`[node]`), not a replica.
    pub node: bool,
    /// It lists `[[workers]]` or `[[nodes]]` of its own.
    pub own_workers: bool,
}

impl ClusterConfig {
    /// `None` with `engine = "none"`.
    pub fn validate(&self, part: Part, base: Base<'_>) -> Result<Option<ClusterSpec>, Invalid> {
        match self.engine.as_str() {
            "none" => return Ok(None),
            "redis" => {}
            other => return Err(Invalid::new("engine", format!("'{other}' is not one of: none, redis"))),
        }
        if !(self.url.starts_with("redis://") || self.url.starts_with("rediss://")) {
            return Err(Invalid::new("url", "is required: redis://HOST:PORT/DB (rediss:// for TLS)"));
        }
        redis::IntoConnectionInfo::into_connection_info(self.url.as_str())
            .map_err(|e| Invalid::new("url", e.to_string()))?;
        for (i, a) in self.sentinels.iter().enumerate() {
            let is_url = a.starts_with("redis://") || a.starts_with("rediss://");
            let host_port =
                a.rsplit_once(':').is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
            if !(is_url || host_port) {
                // Not echoed: a URL mistyped may hold its password.
                return Err(Invalid::new(format!("sentinels[{i}]"), "is neither HOST:PORT nor a redis:// URL"));
            }
            if is_url {
                redis::IntoConnectionInfo::into_connection_info(a.as_str())
                    .map_err(|e| Invalid::new("sentinels", e.to_string()))?;
            }
        }
        if !self.sentinels.is_empty() && self.sentinel_master.is_empty() {
            return Err(Invalid::new("sentinel_master", "names the master the Sentinels monitor"));
        }
        positive("lease_s", self.lease_s)?;
        positive("attach_timeout_s", self.attach_timeout_s)?;
        if self.standby_links > 64 {
            return Err(Invalid::new("standby_links", format!("{} is over 64 links per node", self.standby_links)));
        }
        if !name_ok(&self.prefix) {
            return Err(Invalid::new("prefix", "must be letters, digits, '_', '.' or '-'"));
        }
        for r in &self.revoked_replicas {
            if !name_ok(r) {
                return Err(Invalid::new(
                    "revoked_replicas",
                    format!("'{}' is not a replica's name", r.escape_debug()),
                ));
            }
        }
        let credential = if part.node { None } else { self.credential(base)? };
        let name = match (&credential, self.name.as_str()) {
            (Some(c), "") => c.name.clone(),
            (Some(c), name) if name != c.name => {
                return Err(Invalid::new(
                    "name",
                    format!("'{name}', and the credential is replica '{}''s: one name per replica", c.name),
                ));
            }
            (_, "") => default_name(),
            (_, name) => name.to_string(),
        };
        if !name_ok(&name) {
            return Err(Invalid::new("name", format!("'{name}' must use only letters, digits, '_', '.' and '-'")));
        }
        if !part.node {
            // A replica: its workers are the nodes' (the store's), and it must reach them.
            if part.own_workers {
                return Err(Invalid::new(
                    "",
                    "a replica of a cluster serves the workers of the cluster's nodes: move [[workers]] to a node \
                     (omni-gateway node) and drop [[nodes]]",
                ));
            }
            if !self.token.is_empty() {
                return Err(Invalid::new(
                    "token",
                    "a replica holds its own credential, not the nodes' token (which would let it pass for any \
                     replica): issue one with `omni-gateway --config NODE.toml replica-credential NAME` and set \
                     credential (or credential_file)",
                ));
            }
            if credential.is_none() {
                return Err(Invalid::new(
                    "credential",
                    "is required on a replica: its own, from `omni-gateway --config NODE.toml replica-credential NAME`",
                ));
            }
        }
        let ca = (!self.ca.is_empty()).then(|| base.file("ca", &self.ca)).transpose()?;
        let node_networks =
            self.node_networks.iter().map(|n| network("node_networks", n)).collect::<Result<Vec<_>, _>>()?;
        if !self.redis_ca.is_empty() && !self.url.starts_with("rediss://") {
            return Err(Invalid::new("redis_ca", "verifies the store's TLS: the url must be rediss://"));
        }
        let redis_ca = (!self.redis_ca.is_empty()).then(|| base.file("redis_ca", &self.redis_ca)).transpose()?;
        Ok(Some(ClusterSpec {
            url: self.url.clone(),
            sentinels: self.sentinels.clone(),
            sentinel_master: self.sentinel_master.clone(),
            name,
            prefix: self.prefix.clone(),
            lease: Duration::from_secs_f64(self.lease_s),
            attach_timeout: Duration::from_secs_f64(self.attach_timeout_s),
            standby_links: self.standby_links,
            credential,
            revoked_replicas: self.revoked_replicas.clone(),
            ca,
            server_name: self.server_name.clone(),
            node_networks,
            redis_ca,
        }))
    }
}

impl ClusterConfig {
    /// The replica's credential, from `credential` or `credential_file` (one of them).
    fn credential(&self, base: Base<'_>) -> Result<Option<omni_backend_host::link::replica::Credential>, Invalid> {
        let (key, text) = match (self.credential.as_str(), self.credential_file.as_str()) {
            ("", "") => return Ok(None),
            (text, "") => ("credential", text.to_string()),
            ("", file) => {
                let path = base.file("credential_file", file)?;
                let text = std::fs::read_to_string(&path)
                    .map_err(|e| Invalid::new("credential_file", format!("{}: {e}", path.display())))?;
                ("credential_file", text)
            }
            _ => return Err(Invalid::new("credential", "and credential_file: one of them")),
        };
        omni_backend_host::link::replica::Credential::parse(&text)
            .map(Some)
            .map_err(|why| Invalid::new(key, why.to_string()))
    }
}

/// HOSTNAME-PID: unique on a host, readable in the store and in the nodes' logs.
fn default_name() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let host: String = host.trim().chars().filter(|ch| ch.is_ascii_alphanumeric() || "_.-".contains(*ch)).collect();
    format!("{}-{}", if host.is_empty() { "host" } else { &host }, std::process::id())
}
