//! `config.toml`: loaded once into typed structs, checked, then read-only. Loading only parses
//! and checks: nothing is opened, no connection is made (a role does that when it starts).
//!
//! Each section is a file of its own with its struct, its defaults and its checks
//! (`validate`, whose errors name its own keys); this file puts them together. Every key has a
//! default except the worker list; unknown keys are errors; every error names the file and the
//! key, e.g. `config.toml: workers[1].library: no such file`.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use omni_actors::domain::Mode;
use serde::Deserialize;

mod auth;
mod limits;
mod models;
mod nodes;
mod queue;
mod recording;
mod server;
#[cfg(test)]
mod tests;

pub use crate::observe::webhooks::{WebhookEntry, WebhookFormat, WebhookSpec};
use crate::store::config::Part;
pub use crate::store::{ClusterConfig, ClusterSpec};
pub use auth::{AuthConfig, KeyError, parse_keys_file, read_keys_file};
pub use limits::LimitsConfig;
pub use models::{ModelEntry, ModelSpec};
pub use nodes::{NodeConfig, NodeServe};
pub use omni_actors::settings::Invalid;
pub use omni_backend_host::decider::{DeciderSpec, DelegationConfig, DelegationSpec};
pub use omni_backend_host::link::config::{NodeEntry, NodeLink};
pub use omni_backend_host::workers::{BackendKind, BackendSource, Isolation, WorkerEntry, WorkerSpec};
pub use omni_dialects::transcription::{TranscriptionConfig, TranscriptionSpec};
pub use omni_dialects::vad::{VadConfig, VadEngine, VadSpec};
pub use omni_transports::sip::config::{SipConfig, SipRouteEntry, SipSpec};
pub use omni_transports::telnyx::config::{TelnyxConfig, TelnyxSpec};
pub use omni_transports::twilio::config::{TwilioConfig, TwilioSpec};
pub use omni_transports::webrtc::config::{WebRtcConfig, WebRtcSpec};
pub use queue::QueueConfig;
pub use recording::{RecordingConfig, UsageConfig};
pub use server::{ServerConfig, TlsConfig};

use omni_actors::settings::Base;

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
    vad: VadConfig,
    #[serde(default)]
    transcription: TranscriptionConfig,
    #[serde(default)]
    delegation: DelegationConfig,
    #[serde(default)]
    webrtc: WebRtcConfig,
    #[serde(default)]
    sip: SipConfig,
    #[serde(default)]
    twilio: TwilioConfig,
    #[serde(default)]
    telnyx: TelnyxConfig,
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
    pub trusted_proxies: Vec<ipnet::IpNet>,
    /// `[vad]`: the detector of the OpenAI-shaped dialects' server VAD.
    pub vad: VadSpec,
    /// `[transcription]`, when on: the gateway's own recogniser.
    pub transcription: Option<TranscriptionSpec>,
    /// `[delegation]`, when on: the decider that calls tools for backends that call none.
    pub delegation: Option<DelegationSpec>,
    /// `[webrtc]`: calls over WebRTC.
    pub webrtc: WebRtcSpec,
    /// `[sip]`, when on: calls from a SIP trunk.
    pub sip: Option<SipSpec>,
    /// `[twilio]`: what proves a Media Stream is Twilio's.
    pub twilio: TwilioSpec,
    /// `[telnyx]`: what proves a media stream is Telnyx's.
    pub telnyx: TelnyxSpec,
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
        validate(raw, path, Base(base)).map_err(|e| err(&e.key, e.why))
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
    pub fn message_rate(&self) -> Option<omni_transports::limits::RateLimit> {
        let s = &self.server;
        (s.max_messages_per_s > 0.0).then(|| omni_transports::limits::RateLimit {
            per_second: s.max_messages_per_s,
            burst: s.max_messages_burst,
            abuse_after: Duration::from_secs(5),
        })
    }

    /// What every WebSocket connection may do (the realtime route's, a Twilio stream's, a call's
    /// app socket): frames, the heartbeat, the message rate.
    pub fn edge_settings(&self) -> omni_transports::websocket::EdgeSettings {
        omni_transports::websocket::EdgeSettings {
            max_frame_bytes: self.server.max_frame_bytes,
            heartbeat_interval: self.server.heartbeat_interval(),
            heartbeat_timeout: self.server.heartbeat_timeout(),
            message_timeout: Duration::from_secs_f64(self.server.message_timeout_s),
            rate: self.message_rate(),
        }
    }

    /// What a client may send and make a dialect hold.
    pub fn dialect_limits(&self) -> omni_dialects::Limits {
        let l = &self.limits;
        omni_dialects::Limits {
            min_audio_samples: l.min_audio_samples,
            reference: omni_actors::audio::AudioLimits { max_seconds: l.max_reference_audio_s },
            max_buffered_bytes: (l.max_buffered_mb * 1048576.0) as usize,
            max_waiting_bytes: (l.max_buffered_waiting_mb * 1048576.0) as usize,
            max_total_bytes: (l.max_buffered_total_mb * 1048576.0) as usize,
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
    let message = without_values(e.message().trim());
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

/// A parser's message without the value it quotes (a value in the wrong place may be a secret:
/// a key where a list was expected): `invalid type: string "sk-...", expected a sequence` says
/// `invalid type: string, expected a sequence`. The key and the line say where it is.
fn without_values(message: &str) -> String {
    for prefix in ["invalid type: ", "invalid value: "] {
        if let Some(rest) = message.strip_prefix(prefix)
            && let Some((found, expected)) = rest.split_once(", expected")
        {
            let kind = found.split_whitespace().next().unwrap_or("value");
            return format!("{prefix}{kind}, expected{expected}");
        }
    }
    if let Some(rest) = message.strip_prefix("unknown variant ")
        && let Some((_, expected)) = rest.split_once(", expected")
    {
        return format!("unknown variant, expected{expected}");
    }
    message.to_string()
}

/// Puts the sections together, each checked by its own rules; keys in errors are made whole
/// here (`server.bind`, `workers[1].library`).
fn validate(raw: RawConfig, path: &Path, base: Base<'_>) -> Result<Config, Invalid> {
    let server = raw.server.validate(base).map_err(|e| e.under("server"))?;
    raw.queue.validate().map_err(|e| e.under("queue"))?;
    raw.limits.validate().map_err(|e| e.under("limits"))?;
    let part = Part { node: raw.node.is_some(), own_workers: !raw.workers.is_empty() || !raw.nodes.is_empty() };
    let cluster = raw.cluster.validate(part, base).map_err(|e| e.under("cluster"))?;
    if raw.workers.is_empty() && raw.nodes.is_empty() && cluster.is_none() {
        return Err(Invalid::new("workers", "at least one [[workers]] or [[nodes]] entry is required"));
    }
    let workers = omni_backend_host::workers::validate(&raw.workers, base)?;
    let recording = raw.recording.validate(base).map_err(|e| e.under("recording"))?;
    let auth = raw.auth.validate(base).map_err(|e| e.under("auth"))?;
    let models = models::validate(&raw.models, &workers)?;
    let vad = raw.vad.validate(base).map_err(|e| e.under("vad"))?;
    let transcription = raw.transcription.validate(base).map_err(|e| e.under("transcription"))?;
    let delegation = raw.delegation.validate(base).map_err(|e| e.under("delegation"))?;
    if delegation.as_ref().is_some_and(|d| d.decider == DeciderSpec::Pool)
        && raw.nodes.is_empty()
        && cluster.is_none()
        && !workers.iter().any(|w| w.modes.contains(&omni_actors::domain::Mode::Chat))
    {
        return Err(Invalid::new(
            "delegation.decider",
            "a pool decider is a chat worker of this gateway: give a [[workers]] entry \"chat\" in its modes \
             whose backend calls tools (the CPU model, the reference backend, an ABI 1.3 library)",
        ));
    }
    if delegation.is_some() && transcription.is_none() {
        return Err(Invalid::new(
            "delegation.decider",
            "the decider reads the gateway's transcript of each user turn: enable [transcription] too",
        ));
    }
    let webrtc = raw.webrtc.validate().map_err(|e| e.under("webrtc"))?;
    let sip = raw.sip.validate(base).map_err(|e| e.under("sip"))?;
    let twilio = raw.twilio.validate(base).map_err(|e| e.under("twilio"))?;
    let telnyx = raw.telnyx.validate(base).map_err(|e| e.under("telnyx"))?;
    if let Some(route) = sip
        .iter()
        .flat_map(|s| &s.routes)
        .find(|r| !r.model.is_empty() && !models.is_empty() && !models.iter().any(|m| m.name == r.model))
    {
        let known: Vec<&str> = models.iter().map(|m| m.name.as_str()).collect();
        return Err(Invalid::new(
            "sip.routes",
            format!(
                "route '{}' names model '{}', which is not served (known: {})",
                route.number,
                route.model,
                known.join(", ")
            ),
        ));
    }
    let node = raw.node.as_ref().map(|n| n.validate(base).map_err(|e| e.under("node"))).transpose()?;
    let names: Vec<&str> = workers.iter().map(|w| w.name.as_str()).collect();
    let nodes = omni_backend_host::link::config::validate(&raw.nodes, &names, base)?;
    let webhooks = crate::observe::webhooks::config::validate(&raw.webhooks, base)?;
    if let Some(route) =
        sip.iter().flat_map(|s| &s.routes).find(|r| r.accept == omni_transports::sip::config::Accept::Webhook)
        && !webhooks.iter().any(|w| w.events.iter().any(|e| e == "realtime.call.incoming"))
    {
        return Err(Invalid::new(
            "sip.routes",
            format!(
                "route '{}' has accept = \"webhook\", and no [[webhooks]] entry takes realtime.call.incoming: its calls would ring unheard",
                route.number
            ),
        ));
    }
    Ok(Config {
        path: path.to_owned(),
        bind: server.bind,
        tls: server.tls,
        trusted_proxies: server.trusted_proxies,
        server: raw.server,
        queue: raw.queue,
        limits: raw.limits,
        recording,
        api_keys: auth.api_keys,
        inline_api_keys: raw.auth.api_keys.clone(),
        api_keys_file: auth.api_keys_file,
        admin_key: auth.admin_key,
        vad,
        transcription,
        delegation,
        webrtc,
        sip,
        twilio,
        telnyx,
        models,
        workers,
        node,
        nodes,
        cluster,
        usage: raw.usage.validate(base),
        webhooks,
    })
}

impl Config {
    /// The API keys as they are now: `api_keys`, and the keys file read again. For SIGHUP.
    pub fn reload_api_keys(&self) -> Result<Vec<String>, crate::config::KeyError> {
        let mut keys = self.inline_api_keys.clone();
        if let Some(file) = &self.api_keys_file {
            keys.extend(read_keys_file(file)?);
        }
        Ok(keys)
    }
}
