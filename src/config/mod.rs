//! `config.toml`: loaded once into typed structs, validated, then read-only.
//!
//! Every key has a default except the worker list; unknown keys are errors; every error
//! names the file and the key, e.g. `config.toml: workers[1].library: no such file`.

use std::collections::HashSet;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use omni_actors::domain::Mode;
use serde::Deserialize;

mod sections;
#[cfg(test)]
mod tests;

pub use sections::*;

/// A configuration problem: which file, which key, what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub file: String,
    pub key: String,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.key.is_empty() {
            write!(f, "{}: {}", self.file, self.message)
        } else {
            write!(f, "{}: {}: {}", self.file, self.key, self.message)
        }
    }
}

impl std::error::Error for ConfigError {}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    server: ServerConfig,
    #[serde(default)]
    queue: QueueConfig,
    #[serde(default)]
    limits: LimitsConfig,
    #[serde(default)]
    recording: RecordingConfig,
    #[serde(default)]
    auth: AuthConfig,
    #[serde(default)]
    models: Vec<ModelEntry>,
    #[serde(default)]
    workers: Vec<WorkerEntry>,
    /// Read by `omni-gateway node`.
    #[serde(default)]
    node: Option<NodeConfig>,
    #[serde(default)]
    nodes: Vec<NodeEntry>,
    #[serde(default)]
    usage: UsageConfig,
    #[serde(default)]
    webhooks: Vec<WebhookEntry>,
    #[serde(default)]
    cluster: ClusterConfig,
}

/// Where a worker's backend comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackendSource {
    Builtin,
    /// A shared library, its path resolved against the config file's directory.
    Library(PathBuf),
    /// A MiniCPM-o model worker at this base URL (`http://host:port`).
    MinicpmoWorker(String),
}

impl BackendSource {
    /// For status and logs: "builtin", the library's path, or the worker's URL.
    pub fn label(&self) -> String {
        match self {
            BackendSource::Builtin => "builtin".to_string(),
            BackendSource::Library(p) => p.display().to_string(),
            BackendSource::MinicpmoWorker(url) => format!("minicpmo-worker {url}"),
        }
    }
}

/// One worker of the pool, after expanding `count`.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerSpec {
    /// `NAME-i`, unique in the pool.
    pub name: String,
    /// Index of the `[[workers]]` entry it came from.
    pub entry: usize,
    pub source: BackendSource,
    pub isolation: Isolation,
    pub modes: Vec<Mode>,
    /// `[workers.options]` as text, handed to the backend's open call.
    pub options: Vec<(String, String)>,
}

/// The validated configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub path: PathBuf,
    pub server: ServerConfig,
    /// `server.bind` resolved: every address a host name stands for (`localhost` may be
    /// both 127.0.0.1 and ::1).
    pub bind: Vec<SocketAddr>,
    pub queue: QueueConfig,
    pub limits: LimitsConfig,
    /// `dir` resolved against the config file's directory.
    pub recording: RecordingConfig,
    /// `api_keys` and the keys of `api_keys_file`.
    pub api_keys: Vec<String>,
    /// `auth.api_keys` as written.
    pub inline_api_keys: Vec<String>,
    /// `auth.api_keys_file`, resolved: read again on SIGHUP.
    pub api_keys_file: Option<PathBuf>,
    pub admin_key: Option<String>,
    /// `[server.tls]` paths, resolved, when both are set.
    pub tls: Option<(PathBuf, PathBuf)>,
    /// `server.trusted_proxies`, parsed.
    pub trusted_proxies: Vec<std::net::IpAddr>,
    /// `[[models]]`; empty means any model name is served by the pool (in audio mode).
    pub models: Vec<ModelSpec>,
    pub workers: Vec<WorkerSpec>,
    /// `[node]`, for `omni-gateway node`.
    pub node: Option<NodeServe>,
    /// `[[nodes]]`: nodes whose workers join the pool once reached.
    pub nodes: Vec<NodeLink>,
    /// `[usage] dir`, resolved, when usage accounting is on.
    pub usage: Option<PathBuf>,
    pub webhooks: Vec<WebhookSpec>,
    /// `[cluster]` with `engine = "redis"`; `None`: one gateway on its own.
    pub cluster: Option<ClusterSpec>,
}

impl Config {
    /// Reads, parses and validates a config file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            file: file.clone(),
            key: String::new(),
            message: format!("cannot read: {e}"),
        })?;
        Config::parse(&text, path)
    }

    /// Parses and validates config text; `path` names the file in errors and anchors
    /// relative library paths.
    pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
        let file = path.display().to_string();
        let err = |key: &str, message: String| ConfigError { file: file.clone(), key: key.to_string(), message };
        let de = toml::Deserializer::parse(text).map_err(|e| err("", describe_toml_error(&e, text)))?;
        let raw: RawConfig = serde_path_to_error::deserialize(de).map_err(|e| {
            let mut key = e.path().to_string();
            let inner = e.into_inner();
            let mut message = describe_toml_error(&inner, text);
            // For "unknown field `x`, expected ..." the path already ends with x.
            if let Some(rest) = inner.message().strip_prefix("unknown field `")
                && let Some((_, tail)) = rest.split_once('`')
            {
                message = match tail.strip_prefix(", expected ") {
                    Some(expected) => format!("unknown key (expected {expected})"),
                    None => "unknown key".into(),
                };
            } else if let Some(field) =
                inner.message().strip_prefix("missing field `").and_then(|r| r.split('`').next())
            {
                key = join_key(&key, field);
                message = "is required".into();
            }
            if key == "." {
                key.clear();
            }
            err(&key, message)
        })?;
        // Relative paths are resolved against the config file's directory, made absolute,
        // so that the path checked here is the path loaded later (never a bare name a
        // loader would look up on its own search path).
        let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        let base = std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf());
        let base = base.as_path();
        validate(raw, path, base).map_err(|(key, message)| err(&key, message))
    }

    /// The public mode sessions of an OpenAI-style `model` queue for; `None` for an
    /// unknown model (only when `[[models]]` lists names).
    pub fn model_mode(&self, name: &str) -> Option<Mode> {
        if self.models.is_empty() {
            return Some(Mode::Audio);
        }
        self.models.iter().find(|m| m.name == name).map(|m| m.mode)
    }

    pub fn step_timeout(&self) -> Duration {
        Duration::from_millis(self.limits.step_timeout_ms)
    }

    /// What one connection may send, per second (none when `max_messages_per_s` is 0).
    pub fn message_rate(&self) -> Option<crate::transport::limits::RateLimit> {
        let s = &self.server;
        (s.max_messages_per_s > 0.0).then(|| crate::transport::limits::RateLimit {
            per_second: s.max_messages_per_s,
            burst: s.max_messages_burst,
            abuse_after: Duration::from_secs(5),
        })
    }

    /// What a client may send and make a dialect hold.
    pub fn dialect_limits(&self) -> crate::dialect::Limits {
        let l = &self.limits;
        crate::dialect::Limits {
            min_audio_samples: l.min_audio_samples,
            reference: crate::audio::AudioLimits { max_seconds: l.max_reference_audio_s },
            max_buffered_bytes: (l.max_buffered_mb * 1048576.0) as usize,
            max_turns: l.max_pending_turns + 1,
        }
    }

    /// The modes at least one worker serves.
    pub fn served_modes(&self) -> Vec<Mode> {
        Mode::ALL.into_iter().filter(|m| self.workers.iter().any(|w| w.modes.contains(m))).collect()
    }
}

fn join_key(path: &str, field: &str) -> String {
    if path == "." { field.to_string() } else { format!("{path}.{field}") }
}

fn describe_toml_error(e: &toml::de::Error, text: &str) -> String {
    let message = e.message().trim().to_string();
    match e.span() {
        Some(span) => {
            let before = &text[..span.start.min(text.len())];
            let line = before.matches('\n').count() + 1;
            let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
            format!("{message} (line {line}, column {column})")
        }
        None => message,
    }
}

type Invalid = (String, String);

fn validate(raw: RawConfig, path: &Path, base: &Path) -> Result<Config, Invalid> {
    let bind = resolve_bind(&raw.server.bind).map_err(|e| ("server.bind".to_string(), e))?;
    positive("server.max_frame_bytes", raw.server.max_frame_bytes as f64)?;
    if raw.server.max_outgoing_bytes < 65536 {
        return Err(("server.max_outgoing_bytes".into(), "must be at least 65536".into()));
    }
    if raw.server.max_frame_bytes < 1024 {
        return Err(("server.max_frame_bytes".into(), "must be at least 1024".into()));
    }
    positive("server.heartbeat_interval_s", raw.server.heartbeat_interval_s)?;
    positive("server.heartbeat_timeout_s", raw.server.heartbeat_timeout_s)?;
    if raw.server.heartbeat_timeout_s <= raw.server.heartbeat_interval_s {
        return Err(("server.heartbeat_timeout_s".into(), "must be longer than server.heartbeat_interval_s".into()));
    }
    positive("queue.update_interval_s", raw.queue.update_interval_s)?;
    positive("queue.typical_chat_s", raw.queue.typical_chat_s)?;
    positive("queue.typical_video_s", raw.queue.typical_video_s)?;
    positive("queue.typical_audio_s", raw.queue.typical_audio_s)?;
    let l = &raw.limits;
    positive("limits.chat_session_s", l.chat_session_s)?;
    positive("limits.video_session_s", l.video_session_s)?;
    positive("limits.audio_session_s", l.audio_session_s)?;
    positive("limits.context_tokens", l.context_tokens as f64)?;
    positive("limits.min_audio_samples", l.min_audio_samples as f64)?;
    positive("limits.max_pending_chunks", l.max_pending_chunks as f64)?;
    positive("limits.step_timeout_ms", l.step_timeout_ms as f64)?;
    positive("limits.open_timeout_s", l.open_timeout_s)?;
    positive("limits.max_reference_audio_s", l.max_reference_audio_s)?;
    positive("limits.max_buffered_mb", l.max_buffered_mb)?;

    let cluster = cluster_spec(&raw, &|p: &Path| if p.is_absolute() { p.to_path_buf() } else { base.join(p) })?;
    if raw.workers.is_empty() && raw.nodes.is_empty() && cluster.is_none() {
        return Err(("workers".into(), "at least one [[workers]] or [[nodes]] entry is required".into()));
    }
    let mut workers = Vec::new();
    let mut names = HashSet::new();
    for (i, w) in raw.workers.iter().enumerate() {
        let key = |k: &str| format!("workers[{i}].{k}");
        let name = w.name.clone().unwrap_or_else(|| format!("worker{i}"));
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c)) {
            return Err((
                key("name"),
                format!("'{name}' must be non-empty and use only letters, digits, '_', '.' and '-'"),
            ));
        }
        if w.count == 0 {
            return Err((key("count"), "must be at least 1".into()));
        }
        if w.library.is_some() && w.backend != BackendKind::Library {
            return Err((key("library"), "only allowed with backend = \"library\"".into()));
        }
        if w.url.is_some() && w.backend != BackendKind::MinicpmoWorker {
            return Err((key("url"), "only allowed with backend = \"minicpmo-worker\"".into()));
        }
        let source = match (w.backend, &w.library, &w.url) {
            (BackendKind::Builtin, _, _) => BackendSource::Builtin,
            (BackendKind::Library, None, _) => {
                return Err((key("library"), "required with backend = \"library\"".into()));
            }
            (BackendKind::Library, Some(lib), _) => {
                let resolved = if lib.is_absolute() { lib.clone() } else { base.join(lib) };
                if !resolved.is_file() {
                    return Err((key("library"), format!("no such file: {}", resolved.display())));
                }
                BackendSource::Library(resolved)
            }
            (BackendKind::MinicpmoWorker, _, None) => {
                return Err((
                    key("url"),
                    "required with backend = \"minicpmo-worker\" (e.g. http://gpu1:22400)".into(),
                ));
            }
            (BackendKind::MinicpmoWorker, _, Some(url)) => {
                BackendSource::MinicpmoWorker(worker_url(url).map_err(|e| (key("url"), e))?)
            }
        };
        let isolation = match (&source, w.isolation) {
            (BackendSource::MinicpmoWorker(_), Some(_)) => {
                return Err((key("isolation"), "not for a minicpmo-worker (it is a process of its own)".into()));
            }
            (_, Some(isolation)) => isolation,
            (BackendSource::Library(_), None) => Isolation::Process,
            (_, None) => Isolation::Thread,
        };
        if w.modes.is_empty() {
            return Err((key("modes"), "must name at least one of chat, video, audio".into()));
        }
        let mut modes = Vec::new();
        for (j, m) in w.modes.iter().enumerate() {
            let mode: Mode = m.parse().map_err(|e| (format!("workers[{i}].modes[{j}]"), e))?;
            if !modes.contains(&mode) {
                modes.push(mode);
            }
        }
        let mut options = Vec::new();
        for (k, v) in &w.options {
            let text = match v {
                toml::Value::String(s) => s.clone(),
                toml::Value::Integer(n) => n.to_string(),
                toml::Value::Float(f) => f.to_string(),
                toml::Value::Boolean(b) => b.to_string(),
                _ => {
                    return Err((
                        format!("workers[{i}].options.{k}"),
                        "must be a string, a number or a boolean".into(),
                    ));
                }
            };
            options.push((k.clone(), text));
        }
        for n in 0..w.count {
            let full = format!("{name}-{n}");
            if !names.insert(full.clone()) {
                return Err((key("name"), format!("worker name {full} is used twice")));
            }
            workers.push(WorkerSpec {
                name: full,
                entry: i,
                source: source.clone(),
                isolation,
                modes: modes.clone(),
                options: options.clone(),
            });
        }
    }
    let resolve = |p: &Path| if p.is_absolute() { p.to_path_buf() } else { base.join(p) };
    let mut recording = raw.recording.clone();
    positive("recording.sweep_interval_s", recording.sweep_interval_s)?;
    positive("recording.max_lag_mb", recording.max_lag_mb)?;
    positive("recording.max_total_lag_mb", recording.max_total_lag_mb)?;
    positive("recording.max_session_mb", recording.max_session_mb)?;
    not_negative("recording.retention_days", recording.retention_days)?;
    not_negative("recording.max_total_gb", recording.max_total_gb)?;
    recording.dir = resolve(&recording.dir);

    for (i, key) in raw.auth.api_keys.iter().enumerate() {
        crate::http::auth::check_key(key).map_err(|e| (format!("auth.api_keys[{i}]"), e))?;
    }
    let api_keys_file = (!raw.auth.api_keys_file.is_empty()).then(|| resolve(Path::new(&raw.auth.api_keys_file)));
    let mut api_keys = raw.auth.api_keys.clone();
    if let Some(file) = &api_keys_file {
        api_keys.extend(read_keys_file(file).map_err(|e| ("auth.api_keys_file".to_string(), e))?);
    }
    let admin = &raw.auth.admin_key;
    if admin.trim() != admin {
        return Err(("auth.admin_key".into(), "has spaces around it: remove them".into()));
    }
    if !admin.is_empty() {
        crate::http::auth::check_key(admin).map_err(|e| ("auth.admin_key".to_string(), e))?;
    }
    let admin_key = (!raw.auth.admin_key.is_empty()).then(|| raw.auth.admin_key.clone());

    let tls = match (raw.server.tls.cert.as_str(), raw.server.tls.key.as_str()) {
        ("", "") => None,
        ("", _) => return Err(("server.tls.cert".into(), "required with server.tls.key".into())),
        (_, "") => return Err(("server.tls.key".into(), "required with server.tls.cert".into())),
        (cert, key) => {
            let (cert, key) = (resolve(Path::new(cert)), resolve(Path::new(key)));
            for (k, p) in [("server.tls.cert", &cert), ("server.tls.key", &key)] {
                if !p.is_file() {
                    return Err((k.into(), format!("no such file: {}", p.display())));
                }
            }
            Some((cert, key))
        }
    };
    positive("server.shutdown_grace_s", raw.server.shutdown_grace_s)?;
    not_negative("server.max_messages_per_s", raw.server.max_messages_per_s)?;
    if raw.server.max_messages_per_s > 0.0 && raw.server.max_messages_burst < 1.0 {
        return Err(("server.max_messages_burst".into(), "must be at least 1".into()));
    }
    positive("server.message_timeout_s", raw.server.message_timeout_s)?;
    positive("server.max_fragment_buffer_mb", raw.server.max_fragment_buffer_mb)?;
    let mut trusted_proxies = Vec::new();
    for (i, p) in raw.server.trusted_proxies.iter().enumerate() {
        let ip = p
            .trim()
            .parse()
            .map_err(|_| (format!("server.trusted_proxies[{i}]"), format!("'{p}' is not an IP address")))?;
        trusted_proxies.push(ip);
    }
    for (i, origin) in raw.server.allowed_origins.iter().enumerate() {
        if !(origin.starts_with("http://") || origin.starts_with("https://")) || origin.ends_with('/') {
            return Err((
                format!("server.allowed_origins[{i}]"),
                format!("'{origin}' is not an origin like https://example.com"),
            ));
        }
    }

    let mut models: Vec<ModelSpec> = Vec::new();
    for (i, m) in raw.models.iter().enumerate() {
        if m.name.trim().is_empty() {
            return Err((format!("models[{i}].name"), "must not be empty".into()));
        }
        if models.iter().any(|x| x.name == m.name) {
            return Err((format!("models[{i}].name"), format!("'{}' is listed twice", m.name)));
        }
        let Some(first) = m.modes.first() else {
            return Err((format!("models[{i}].modes"), "must name at least one of chat, video, audio".into()));
        };
        for (j, mode) in m.modes.iter().enumerate() {
            mode.parse::<Mode>().map_err(|e| (format!("models[{i}].modes[{j}]"), e))?;
        }
        let mode: Mode = first.parse().map_err(|e| (format!("models[{i}].modes[0]"), e))?;
        if !workers.iter().any(|w| w.modes.contains(&mode)) {
            return Err((format!("models[{i}].modes"), format!("no worker serves {mode}")));
        }
        models.push(ModelSpec { name: m.name.clone(), mode });
    }

    let node = raw.node.as_ref().map(|n| node_serve(n, &resolve)).transpose()?;
    let mut nodes: Vec<NodeLink> = Vec::new();
    for (i, n) in raw.nodes.iter().enumerate() {
        let link = node_link(n, &resolve).map_err(|(k, e)| (format!("nodes[{i}].{k}"), e))?;
        if nodes.iter().any(|other| other.name == link.name) {
            return Err((format!("nodes[{i}].name"), format!("'{}' names two nodes", link.name)));
        }
        if workers.iter().any(|w| w.name.starts_with(&format!("{}/", link.name))) {
            return Err((format!("nodes[{i}].name"), format!("'{}' clashes with a worker name", link.name)));
        }
        nodes.push(link);
    }

    let usage = raw.usage.enabled.then(|| resolve(&raw.usage.dir));
    let mut webhooks: Vec<WebhookSpec> = Vec::new();
    for (i, w) in raw.webhooks.iter().enumerate() {
        let spec = webhook(w, i).map_err(|(k, e)| (format!("webhooks[{i}].{k}"), e))?;
        if webhooks.iter().any(|other| other.name == spec.name) {
            return Err((format!("webhooks[{i}].name"), format!("'{}' names two webhooks", spec.name)));
        }
        webhooks.push(spec);
    }

    Ok(Config {
        path: path.to_owned(),
        server: raw.server,
        bind,
        queue: raw.queue,
        limits: raw.limits,
        recording,
        api_keys,
        inline_api_keys: raw.auth.api_keys.clone(),
        api_keys_file,
        admin_key,
        tls,
        trusted_proxies,
        models,
        workers,
        node,
        nodes,
        cluster,
        usage,
        webhooks,
    })
}

fn webhook(w: &WebhookEntry, i: usize) -> Result<WebhookSpec, Invalid> {
    let name = w.name.clone().unwrap_or_else(|| format!("webhook{i}"));
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c)) {
        return Err((
            "name".into(),
            format!("'{name}' must be non-empty and use only letters, digits, '_', '.' and '-'"),
        ));
    }
    if !(w.url.starts_with("http://") || w.url.starts_with("https://")) {
        return Err(("url".into(), format!("'{}' must start with http:// or https://", w.url)));
    }
    if w.events.is_empty() {
        return Err(("events".into(), format!("name at least one of {}", crate::observe::webhooks::EVENTS.join(", "))));
    }
    for (j, e) in w.events.iter().enumerate() {
        if !crate::observe::webhooks::EVENTS.contains(&e.as_str()) {
            return Err((
                format!("events[{j}]"),
                format!("'{e}' is not one of {}", crate::observe::webhooks::EVENTS.join(", ")),
            ));
        }
    }
    crate::http::auth::check_key(&w.secret).map_err(|e| ("secret".to_string(), e))?;
    positive("timeout_s", w.timeout_s)?;
    positive("retry_base_s", w.retry_base_s)?;
    if w.max_attempts == 0 {
        return Err(("max_attempts".into(), "must be at least 1".into()));
    }
    if w.queue_size == 0 {
        return Err(("queue_size".into(), "must be at least 1".into()));
    }
    Ok(WebhookSpec {
        name,
        url: w.url.clone(),
        events: w.events.clone(),
        secret: w.secret.clone(),
        timeout: Duration::from_secs_f64(w.timeout_s),
        max_attempts: w.max_attempts,
        retry_base: Duration::from_secs_f64(w.retry_base_s),
        queue_size: w.queue_size,
    })
}

/// A worker's base URL: `http://HOST:PORT` (no path), without the trailing slash.
fn worker_url(url: &str) -> Result<String, String> {
    let rest = url.strip_prefix("http://").ok_or_else(|| format!("'{url}' must start with http://"))?;
    let rest = rest.trim_end_matches('/');
    if rest.is_empty() || rest.contains('/') || rest.contains('?') {
        return Err(format!("'{url}' must be http://HOST:PORT, with no path"));
    }
    Ok(format!("http://{rest}"))
}

/// `HOST:PORT` split, for addresses resolved when they are used (a node may be down, or
/// its name not resolvable yet, when the gateway starts).
fn host_port(address: &str) -> Result<(String, u16), String> {
    let (host, port) =
        address.rsplit_once(':').ok_or_else(|| format!("'{address}' is not HOST:PORT (e.g. gpu1:7100)"))?;
    let port = port.parse::<u16>().map_err(|_| format!("'{address}': '{port}' is not a port number"))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        return Err(format!("'{address}' has no host"));
    }
    Ok((host.to_string(), port))
}

fn node_serve(n: &NodeConfig, resolve: &dyn Fn(&Path) -> PathBuf) -> Result<NodeServe, Invalid> {
    let bind = resolve_bind(&n.bind).map_err(|e| ("node.bind".to_string(), e))?;
    if n.token.is_empty() {
        return Err(("node.token".into(), "is required: the secret a gateway presents (16 bytes or more)".into()));
    }
    crate::http::auth::check_key(&n.token).map_err(|e| ("node.token".to_string(), e))?;
    positive("node.heartbeat_interval_s", n.heartbeat_interval_s)?;
    if n.heartbeat_timeout_s <= n.heartbeat_interval_s {
        return Err(("node.heartbeat_timeout_s".into(), "must be longer than node.heartbeat_interval_s".into()));
    }
    let tls = match (n.tls.cert.as_str(), n.tls.key.as_str()) {
        ("", "") => None,
        ("", _) => return Err(("node.tls.cert".into(), "required with node.tls.key".into())),
        (_, "") => return Err(("node.tls.key".into(), "required with node.tls.cert".into())),
        (cert, key) => {
            let (cert, key) = (resolve(Path::new(cert)), resolve(Path::new(key)));
            for (k, p) in [("node.tls.cert", &cert), ("node.tls.key", &key)] {
                if !p.is_file() {
                    return Err((k.into(), format!("no such file: {}", p.display())));
                }
            }
            Some((cert, key))
        }
    };
    Ok(NodeServe {
        bind,
        token: n.token.clone(),
        heartbeat_interval: Duration::from_secs_f64(n.heartbeat_interval_s),
        heartbeat_timeout: Duration::from_secs_f64(n.heartbeat_timeout_s),
        tls,
        advertise: n.advertise.clone(),
    })
}

fn cluster_spec(raw: &RawConfig, resolve: &dyn Fn(&Path) -> PathBuf) -> Result<Option<ClusterSpec>, Invalid> {
    let c = &raw.cluster;
    match c.engine.as_str() {
        "none" => return Ok(None),
        "redis" => {}
        other => return Err(("cluster.engine".into(), format!("'{other}' is not one of: none, redis"))),
    }
    if !(c.url.starts_with("redis://") || c.url.starts_with("rediss://")) {
        return Err(("cluster.url".into(), "is required: redis://HOST:PORT/DB (rediss:// for TLS)".into()));
    }
    redis::Client::open(c.url.as_str()).map_err(|e| ("cluster.url".to_string(), e.to_string()))?;
    for a in &c.sentinels {
        let url = a.starts_with("redis://") || a.starts_with("rediss://");
        let port_ok = a.rsplit_once(':').is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
        if !(url || port_ok) {
            return Err(("cluster.sentinels".into(), format!("'{a}' is neither HOST:PORT nor a redis:// URL")));
        }
    }
    if !c.sentinels.is_empty() && c.sentinel_master.is_empty() {
        return Err(("cluster.sentinel_master".into(), "names the master the Sentinels monitor".into()));
    }
    positive("cluster.lease_s", c.lease_s)?;
    positive("cluster.attach_timeout_s", c.attach_timeout_s)?;
    if c.standby_links > 64 {
        return Err(("cluster.standby_links".into(), format!("{} is over 64 links per node", c.standby_links)));
    }
    let name_ok = |n: &str| !n.is_empty() && n.chars().all(|ch| ch.is_ascii_alphanumeric() || "_.-".contains(ch));
    if !c.prefix.chars().all(|ch| ch.is_ascii_alphanumeric() || "_.-".contains(ch)) || c.prefix.is_empty() {
        return Err(("cluster.prefix".into(), "must be letters, digits, '_', '.' or '-'".into()));
    }
    let name = if c.name.is_empty() { default_cluster_name() } else { c.name.clone() };
    if !name_ok(&name) {
        return Err(("cluster.name".into(), format!("'{name}' must use only letters, digits, '_', '.' and '-'")));
    }
    if raw.node.is_none() {
        // A replica: its workers are the nodes' (the store's), and it must reach them.
        if !raw.workers.is_empty() || !raw.nodes.is_empty() {
            return Err((
                "cluster".into(),
                "a replica of a cluster serves the workers of the cluster's nodes: move [[workers]] to a node \
                 (omni-gateway node) and drop [[nodes]]"
                    .into(),
            ));
        }
        crate::http::auth::check_key(&c.token)
            .map_err(|e| ("cluster.token".to_string(), format!("the nodes' token: {e}")))?;
    }
    let ca = (!c.ca.is_empty()).then(|| resolve(Path::new(&c.ca)));
    if let Some(ca) = &ca
        && !ca.is_file()
    {
        return Err(("cluster.ca".into(), format!("no such file: {}", ca.display())));
    }
    let spec = ClusterSpec {
        url: c.url.clone(),
        sentinels: c.sentinels.clone(),
        sentinel_master: c.sentinel_master.clone(),
        name,
        prefix: c.prefix.clone(),
        lease: Duration::from_secs_f64(c.lease_s),
        attach_timeout: Duration::from_secs_f64(c.attach_timeout_s),
        standby_links: c.standby_links,
        token: c.token.clone(),
        ca,
        server_name: c.server_name.clone(),
    };
    // What opening the store checks (no connection is made yet): the server starts on it.
    crate::store::redis::RedisStore::from_spec(&spec).map_err(|e| match e.split_once(": ") {
        Some((key, why)) => (key.to_string(), why.to_string()),
        None => ("cluster".to_string(), e),
    })?;
    Ok(Some(spec))
}

/// HOSTNAME-PID: unique on a host, readable in the store and in the nodes' logs.
fn default_cluster_name() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let host: String = host.trim().chars().filter(|ch| ch.is_ascii_alphanumeric() || "_.-".contains(*ch)).collect();
    format!("{}-{}", if host.is_empty() { "host" } else { &host }, std::process::id())
}

fn node_link(n: &NodeEntry, resolve: &dyn Fn(&Path) -> PathBuf) -> Result<NodeLink, Invalid> {
    let (host, _) = host_port(&n.address).map_err(|e| ("address".to_string(), e))?;
    let name = n.name.clone().unwrap_or_else(|| host.clone());
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c)) {
        return Err((
            "name".into(),
            format!("'{name}' must be non-empty and use only letters, digits, '_', '.' and '-'"),
        ));
    }
    crate::http::auth::check_key(&n.token).map_err(|e| ("token".to_string(), e))?;
    positive("heartbeat_interval_s", n.heartbeat_interval_s)?;
    if n.heartbeat_timeout_s <= n.heartbeat_interval_s {
        return Err(("heartbeat_timeout_s".into(), "must be longer than heartbeat_interval_s".into()));
    }
    let ca = (!n.ca.is_empty()).then(|| resolve(Path::new(&n.ca)));
    if let Some(ca) = &ca
        && !ca.is_file()
    {
        return Err(("ca".into(), format!("no such file: {}", ca.display())));
    }
    Ok(NodeLink {
        name,
        address: n.address.clone(),
        token: n.token.clone(),
        ca,
        server_name: if n.server_name.is_empty() { host } else { n.server_name.clone() },
        heartbeat_interval: Duration::from_secs_f64(n.heartbeat_interval_s),
        heartbeat_timeout: Duration::from_secs_f64(n.heartbeat_timeout_s),
    })
}

/// The keys of a keys file (see [`crate::http::auth::parse_keys_file`]); errors name the file and line.
pub fn read_keys_file(file: &Path) -> Result<Vec<String>, String> {
    let text = std::fs::read_to_string(file).map_err(|e| format!("cannot read {}: {e}", file.display()))?;
    crate::http::auth::parse_keys_file(&text).map_err(|e| format!("{}: {e}", file.display()))
}

impl Config {
    /// The API keys as they are now: `api_keys`, and the keys file read again. For SIGHUP.
    pub fn reload_api_keys(&self) -> Result<Vec<String>, String> {
        let mut keys = self.inline_api_keys.clone();
        if let Some(file) = &self.api_keys_file {
            keys.extend(read_keys_file(file)?);
        }
        Ok(keys)
    }
}

/// `HOST:PORT` with an IP address or a host name that resolves.
fn resolve_bind(bind: &str) -> Result<Vec<SocketAddr>, String> {
    use std::net::ToSocketAddrs;
    if let Ok(addr) = bind.parse::<SocketAddr>() {
        return Ok(vec![addr]);
    }
    let Some((host, port)) = bind.rsplit_once(':') else {
        return Err(format!("'{bind}' is not HOST:PORT (e.g. 127.0.0.1:8006 or localhost:8006)"));
    };
    if port.parse::<u16>().is_err() {
        return Err(format!("'{bind}': '{port}' is not a port number"));
    }
    let addrs: Vec<SocketAddr> = (host, port.parse::<u16>().unwrap_or(0))
        .to_socket_addrs()
        .map_err(|e| format!("'{bind}': cannot resolve '{host}': {e}"))?
        .collect();
    let mut unique = Vec::new();
    for a in addrs {
        if !unique.contains(&a) {
            unique.push(a);
        }
    }
    if unique.is_empty() {
        return Err(format!("'{bind}': '{host}' resolves to no address"));
    }
    Ok(unique)
}

fn not_negative(key: &str, v: f64) -> Result<(), Invalid> {
    if v >= 0.0 && v.is_finite() { Ok(()) } else { Err((key.to_string(), "must not be negative".into())) }
}

fn positive(key: &str, v: f64) -> Result<(), Invalid> {
    if v > 0.0 && v.is_finite() { Ok(()) } else { Err((key.to_string(), "must be greater than 0".into())) }
}
