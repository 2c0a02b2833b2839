//! The sections of `config.toml` as written: typed, with the defaults every key has.
//! Unknown keys are errors (`deny_unknown_fields`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use omni_actors::domain::Mode;
use serde::Deserialize;

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    pub bind: String,
    pub max_frame_bytes: usize,
    /// Output a client has not read yet, past which its session ends (slow_consumer).
    pub max_outgoing_bytes: u64,
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
    /// Reverse proxies whose `X-Forwarded-For` names the client (IP addresses).
    pub trusted_proxies: Vec<String>,
    pub allowed_origins: Vec<String>,
    pub tls: TlsConfig,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            bind: "127.0.0.1:8006".into(),
            max_frame_bytes: 4 * 1024 * 1024,
            max_outgoing_bytes: 8 * 1024 * 1024,
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
            tls: TlsConfig::default(),
        }
    }
}

/// `[server.tls]`: with both set, the server speaks https/wss only.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TlsConfig {
    pub cert: String,
    pub key: String,
}

/// `[recording]`: every session recorded under `dir/YYYY-MM-DD/SESSION_ID/`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RecordingConfig {
    pub enabled: bool,
    pub dir: PathBuf,
    /// Recordings older than this are deleted (0 = keep all).
    pub retention_days: f64,
    /// Beyond this total size the oldest recordings are deleted (0 = no cap).
    pub max_total_gb: f64,
    /// How often the retention sweep runs.
    pub sweep_interval_s: f64,
    /// Data a session may have queued for its recorder (or hold before it has an id)
    /// before records are dropped.
    pub max_lag_mb: f64,
    /// Data all sessions together may have queued for recorders.
    pub max_total_lag_mb: f64,
    /// The most one session's recording takes; past it the recording is truncated.
    pub max_session_mb: f64,
}

impl Default for RecordingConfig {
    fn default() -> Self {
        RecordingConfig {
            enabled: false,
            dir: PathBuf::from("recordings"),
            retention_days: 0.0,
            max_total_gb: 0.0,
            sweep_interval_s: 3600.0,
            max_lag_mb: 64.0,
            max_total_lag_mb: 256.0,
            max_session_mb: 1024.0,
        }
    }
}

/// `[auth]`: keys for the realtime endpoint and for the admin routes.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    pub api_keys: Vec<String>,
    /// A file with more keys, one per line (`#` starts a comment).
    pub api_keys_file: String,
    pub admin_key: String,
}

impl ServerConfig {
    pub fn heartbeat_interval(&self) -> Duration {
        Duration::from_secs_f64(self.heartbeat_interval_s)
    }
    pub fn heartbeat_timeout(&self) -> Duration {
        Duration::from_secs_f64(self.heartbeat_timeout_s)
    }
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct QueueConfig {
    pub max_waiting: usize,
    pub update_interval_s: f64,
    /// How long a session of each mode is assumed to last before any has ended; the ETA
    /// then blends in the lengths measured as sessions end.
    pub typical_chat_s: f64,
    pub typical_video_s: f64,
    pub typical_audio_s: f64,
}

impl Default for QueueConfig {
    fn default() -> Self {
        QueueConfig {
            max_waiting: 1000,
            update_interval_s: 3.0,
            typical_chat_s: 60.0,
            typical_video_s: 120.0,
            typical_audio_s: 120.0,
        }
    }
}

impl QueueConfig {
    /// The length assumed for a session of `mode` before any has ended.
    pub fn typical(&self, mode: Mode) -> Duration {
        Duration::from_secs_f64(match mode {
            Mode::Chat => self.typical_chat_s,
            Mode::Video => self.typical_video_s,
            Mode::Audio => self.typical_audio_s,
        })
    }
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    pub chat_session_s: f64,
    pub video_session_s: f64,
    pub audio_session_s: f64,
    pub context_tokens: u64,
    pub min_audio_samples: usize,
    pub max_pending_chunks: usize,
    pub step_timeout_ms: u64,
    /// A backend's open slower than this fails the worker (models take minutes to load).
    pub open_timeout_s: f64,
    /// The longest reference voice a client may send (`session.init` voice fields, legacy
    /// `session.update` WAVs, chat TTS references), in seconds.
    pub max_reference_audio_s: f64,
    /// What the server holds for one client before its events are refused (`buffer_full`):
    /// audio not yet committed, items and images not yet answered, replies held while queued.
    pub max_buffered_mb: f64,
    /// Chat answers a session may have waiting behind the one in progress.
    pub max_pending_turns: usize,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            chat_session_s: 600.0,
            video_session_s: 300.0,
            audio_session_s: 600.0,
            context_tokens: 8192,
            min_audio_samples: 4000,
            max_pending_chunks: 2,
            step_timeout_ms: 15000,
            open_timeout_s: 300.0,
            max_reference_audio_s: 30.0,
            max_buffered_mb: 16.0,
            max_pending_turns: 4,
        }
    }
}

impl LimitsConfig {
    /// The session time limit of a public mode, counted from the upgrade.
    pub fn session_limit(&self, mode: Mode) -> Duration {
        Duration::from_secs_f64(match mode {
            Mode::Chat => self.chat_session_s,
            Mode::Video => self.video_session_s,
            Mode::Audio => self.audio_session_s,
        })
    }
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    Builtin,
    Library,
    /// A MiniCPM-o model worker (its HTTP/WebSocket protocol) at `url`.
    #[serde(rename = "minicpmo-worker")]
    MinicpmoWorker,
}

/// One `[[workers]]` entry as written; it stands for `count` workers.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct WorkerEntry {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default = "default_backend")]
    pub backend: BackendKind,
    #[serde(default)]
    pub library: Option<PathBuf>,
    /// `backend = "minicpmo-worker"`: the worker's base URL (`http://gpu1:22400`).
    #[serde(default)]
    pub url: Option<String>,
    /// Where the backend runs; defaults to "thread" for builtin, "process" for library.
    #[serde(default)]
    pub isolation: Option<Isolation>,
    #[serde(default = "default_count")]
    pub count: usize,
    #[serde(default = "default_modes")]
    pub modes: Vec<String>,
    #[serde(default)]
    pub options: BTreeMap<String, toml::Value>,
}

/// Where a worker's backend runs: on a thread of the gateway, or in a child process of its
/// own (a crash in the backend then takes only the child down).
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Isolation {
    Thread,
    Process,
}

pub(super) fn default_backend() -> BackendKind {
    BackendKind::Builtin
}
pub(super) fn default_count() -> usize {
    1
}
pub(super) fn default_modes() -> Vec<String> {
    Mode::ALL.iter().map(|m| m.as_str().to_string()).collect()
}

/// One `[[models]]` entry: an OpenAI-style `model` name and the modes whose workers serve it.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ModelEntry {
    pub name: String,
    #[serde(default = "default_model_modes")]
    pub modes: Vec<String>,
}

pub(super) fn default_model_modes() -> Vec<String> {
    vec!["audio".to_string()]
}

/// A model name and the public mode its sessions queue for (the first listed).
#[derive(Debug, Clone, PartialEq)]
pub struct ModelSpec {
    pub name: String,
    pub mode: Mode,
}

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

/// `[cluster]`: gateway replicas (and their nodes) sharing one queue and one pool in a store.
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
    /// A replica's: the nodes' `[node] token`.
    pub token: String,
    /// A replica's: a PEM certificate the nodes' TLS is verified against (empty: plain TCP).
    pub ca: String,
    /// A replica's: the name the nodes' certificates are for (default: the node's host).
    pub server_name: String,
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
            ca: String::new(),
            server_name: String::new(),
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
    pub token: String,
    pub ca: Option<PathBuf>,
    pub server_name: String,
}

impl ClusterSpec {
    /// The URL without its password, for logs.
    pub fn redacted_url(&self) -> String {
        match (self.url.split_once("://"), self.url.rsplit_once('@')) {
            (Some((scheme, _)), Some((_, host))) => format!("{scheme}://***@{host}"),
            _ => self.url.clone(),
        }
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

pub(super) fn default_node_heartbeat_interval() -> f64 {
    1.0
}
pub(super) fn default_node_heartbeat_timeout() -> f64 {
    5.0
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
}

/// `[usage]`: usage accounting per API key and mode (off by default).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct UsageConfig {
    pub enabled: bool,
    /// Where the day files (`YYYY-MM-DD.jsonl`) go; relative to the config file.
    pub dir: PathBuf,
}

impl Default for UsageConfig {
    fn default() -> Self {
        UsageConfig { enabled: false, dir: PathBuf::from("usage") }
    }
}

/// One `[[webhooks]]` entry.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct WebhookEntry {
    #[serde(default)]
    pub name: Option<String>,
    pub url: String,
    pub events: Vec<String>,
    /// Signs every delivery (HMAC-SHA256); 16 bytes or more.
    pub secret: String,
    #[serde(default = "default_webhook_timeout")]
    pub timeout_s: f64,
    #[serde(default = "default_webhook_attempts")]
    pub max_attempts: u32,
    /// The first retry waits this long, each next one twice as long.
    #[serde(default = "default_webhook_retry")]
    pub retry_base_s: f64,
    /// Deliveries waiting to be sent; beyond it they are dropped (and counted).
    #[serde(default = "default_webhook_queue")]
    pub queue_size: usize,
}

pub(super) fn default_webhook_timeout() -> f64 {
    5.0
}
pub(super) fn default_webhook_attempts() -> u32 {
    5
}
pub(super) fn default_webhook_retry() -> f64 {
    0.5
}
pub(super) fn default_webhook_queue() -> usize {
    1000
}

/// A `[[webhooks]]` entry, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct WebhookSpec {
    pub name: String,
    pub url: String,
    pub events: Vec<String>,
    pub secret: String,
    pub timeout: Duration,
    pub max_attempts: u32,
    pub retry_base: Duration,
    pub queue_size: usize,
}
