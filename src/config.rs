//! `config.toml`: loaded once into typed structs, validated, then read-only.
//!
//! Every key has a default except the worker list; unknown keys are errors; every error
//! names the file and the key, e.g. `config.toml: workers[1].library: no such file`.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use omni_actors::domain::Mode;
use serde::Deserialize;

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
    pub max_connections_per_ip: usize,
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
            max_connections_per_ip: 0,
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
    /// Data a session may have queued for its recorder before records are dropped.
    pub max_lag_mb: f64,
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
}

impl Default for QueueConfig {
    fn default() -> Self {
        QueueConfig { max_waiting: 1000, update_interval_s: 3.0 }
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

fn default_backend() -> BackendKind {
    BackendKind::Builtin
}
fn default_count() -> usize {
    1
}
fn default_modes() -> Vec<String> {
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

fn default_model_modes() -> Vec<String> {
    vec!["audio".to_string()]
}

/// A model name and the public mode its sessions queue for (the first listed).
#[derive(Debug, Clone, PartialEq)]
pub struct ModelSpec {
    pub name: String,
    pub mode: Mode,
}

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
    workers: Vec<WorkerEntry>,
}

/// Where a worker's backend comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackendSource {
    Builtin,
    /// A shared library, its path resolved against the config file's directory.
    Library(PathBuf),
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
    pub bind: SocketAddr,
    pub queue: QueueConfig,
    pub limits: LimitsConfig,
    /// `dir` resolved against the config file's directory.
    pub recording: RecordingConfig,
    /// `api_keys` and the keys of `api_keys_file`.
    pub api_keys: Vec<String>,
    pub admin_key: Option<String>,
    /// `[server.tls]` paths, resolved, when both are set.
    pub tls: Option<(PathBuf, PathBuf)>,
    /// `[[models]]`; empty means any model name is served by the pool (in audio mode).
    pub models: Vec<ModelSpec>,
    pub workers: Vec<WorkerSpec>,
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
        let base = path.parent().unwrap_or(Path::new("."));
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
    let bind: SocketAddr =
        raw.server.bind.parse().map_err(|_| {
            ("server.bind".to_string(), format!("'{}' is not an IP address with a port", raw.server.bind))
        })?;
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
    let l = &raw.limits;
    positive("limits.chat_session_s", l.chat_session_s)?;
    positive("limits.video_session_s", l.video_session_s)?;
    positive("limits.audio_session_s", l.audio_session_s)?;
    positive("limits.context_tokens", l.context_tokens as f64)?;
    positive("limits.min_audio_samples", l.min_audio_samples as f64)?;
    positive("limits.max_pending_chunks", l.max_pending_chunks as f64)?;
    positive("limits.step_timeout_ms", l.step_timeout_ms as f64)?;

    if raw.workers.is_empty() {
        return Err(("workers".into(), "at least one [[workers]] entry is required".into()));
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
        let source = match (w.backend, &w.library) {
            (BackendKind::Builtin, None) => BackendSource::Builtin,
            (BackendKind::Builtin, Some(_)) => {
                return Err((key("library"), "only allowed with backend = \"library\"".into()));
            }
            (BackendKind::Library, None) => {
                return Err((key("library"), "required with backend = \"library\"".into()));
            }
            (BackendKind::Library, Some(lib)) => {
                let resolved = if lib.is_absolute() { lib.clone() } else { base.join(lib) };
                if !resolved.is_file() {
                    return Err((key("library"), format!("no such file: {}", resolved.display())));
                }
                BackendSource::Library(resolved)
            }
        };
        let isolation = w.isolation.unwrap_or(match source {
            BackendSource::Builtin => Isolation::Thread,
            BackendSource::Library(_) => Isolation::Process,
        });
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
    not_negative("recording.retention_days", recording.retention_days)?;
    not_negative("recording.max_total_gb", recording.max_total_gb)?;
    recording.dir = resolve(&recording.dir);

    let mut api_keys = raw.auth.api_keys.clone();
    if !raw.auth.api_keys_file.is_empty() {
        let file = resolve(Path::new(&raw.auth.api_keys_file));
        let text = std::fs::read_to_string(&file)
            .map_err(|e| ("auth.api_keys_file".to_string(), format!("cannot read {}: {e}", file.display())))?;
        api_keys.extend(
            text.lines().map(|l| l.split('#').next().unwrap_or("").trim()).filter(|l| !l.is_empty()).map(String::from),
        );
    }
    if let Some(i) = api_keys.iter().position(|k| k.trim().is_empty() || k.chars().any(char::is_whitespace)) {
        return Err((format!("auth.api_keys[{i}]"), "a key must be non-empty and without spaces".into()));
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

    Ok(Config {
        path: path.to_owned(),
        server: raw.server,
        bind,
        queue: raw.queue,
        limits: raw.limits,
        recording,
        api_keys,
        admin_key,
        tls,
        models,
        workers,
    })
}

fn not_negative(key: &str, v: f64) -> Result<(), Invalid> {
    if v >= 0.0 && v.is_finite() { Ok(()) } else { Err((key.to_string(), "must not be negative".into())) }
}

fn positive(key: &str, v: f64) -> Result<(), Invalid> {
    if v > 0.0 && v.is_finite() { Ok(()) } else { Err((key.to_string(), "must be greater than 0".into())) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(text, Path::new("config.toml"))
    }

    fn error(text: &str) -> String {
        parse(text).expect_err("expected a config error").to_string()
    }

    const MINIMAL: &str = "[[workers]]\nname = \"sim\"\n";

    #[test]
    fn defaults_fill_every_section() {
        let c = parse(MINIMAL).unwrap();
        assert_eq!(c.bind, "127.0.0.1:8006".parse().unwrap());
        assert_eq!(c.server.max_frame_bytes, 4_194_304);
        assert_eq!(c.queue, QueueConfig { max_waiting: 1000, update_interval_s: 3.0 });
        assert_eq!(c.limits, LimitsConfig::default());
        assert_eq!(c.limits.session_limit(Mode::Video), Duration::from_secs(300));
        assert_eq!(c.workers.len(), 1);
        let w = &c.workers[0];
        assert_eq!(w.name, "sim-0");
        assert_eq!(w.source, BackendSource::Builtin);
        assert_eq!(w.isolation, Isolation::Thread);
        assert_eq!(w.modes, vec![Mode::Chat, Mode::Video, Mode::Audio]);
    }

    #[test]
    fn count_expands_into_numbered_workers_with_text_options() {
        let c = parse(
            "[[workers]]\nname = \"gpu\"\ncount = 3\nmodes = [\"video\", \"audio\"]\n\
             [workers.options]\nstep_ms = 20\nvad_threshold = 0.05\nverbose = true\nvoice = \"x\"\n",
        )
        .unwrap();
        let names: Vec<_> = c.workers.iter().map(|w| w.name.as_str()).collect();
        assert_eq!(names, ["gpu-0", "gpu-1", "gpu-2"]);
        assert_eq!(c.workers[2].modes, vec![Mode::Video, Mode::Audio]);
        assert_eq!(
            c.workers[0].options,
            vec![
                ("step_ms".to_string(), "20".to_string()),
                ("vad_threshold".into(), "0.05".into()),
                ("verbose".into(), "true".into()),
                ("voice".into(), "x".into()),
            ]
        );
        assert_eq!(c.served_modes(), vec![Mode::Video, Mode::Audio]);
    }

    #[test]
    fn the_worker_list_is_required() {
        assert_eq!(error("[server]\nbind = \"127.0.0.1:1\"\n"), "config.toml: workers: is required");
        assert_eq!(error("workers = []\n"), "config.toml: workers: at least one [[workers]] entry is required");
    }

    #[test]
    fn unknown_keys_are_errors_naming_the_key() {
        let e = error("[server]\nbnd = \"x\"\n[[workers]]\n");
        assert!(e.starts_with("config.toml: server.bnd: unknown key (expected"), "{e}");
        let e = error("[[workers]]\nname = \"a\"\ncolour = 1\n");
        assert!(e.starts_with("config.toml: workers[0].colour: unknown key"), "{e}");
        let e = error("[nope]\n[[workers]]\n");
        assert!(e.starts_with("config.toml: nope: unknown key"), "{e}");
    }

    #[test]
    fn wrong_types_name_the_key_and_position() {
        let e = error("[queue]\nmax_waiting = \"many\"\n[[workers]]\n");
        assert!(e.starts_with("config.toml: queue.max_waiting: invalid type: string \"many\""), "{e}");
        assert!(e.contains("line 2"), "{e}");
        let e = error("[[workers]]\nbackend = \"gpu\"\n");
        assert!(e.starts_with("config.toml: workers[0].backend: unknown variant `gpu`"), "{e}");
    }

    #[test]
    fn syntax_errors_give_the_line() {
        let e = error("[server\n");
        assert!(e.starts_with("config.toml: ") && e.contains("line 1"), "{e}");
    }

    #[test]
    fn library_rules() {
        assert_eq!(
            error(
                "[[workers]]\nname = \"a\"\n[[workers]]\nname = \"b\"\nbackend = \"library\"\nlibrary = \"nope.so\"\n"
            ),
            "config.toml: workers[1].library: no such file: nope.so"
        );
        assert_eq!(
            error("[[workers]]\nbackend = \"library\"\n"),
            "config.toml: workers[0].library: required with backend = \"library\""
        );
        assert_eq!(
            error("[[workers]]\nlibrary = \"x.so\"\n"),
            "config.toml: workers[0].library: only allowed with backend = \"library\""
        );
    }

    #[test]
    fn a_relative_library_resolves_against_the_config_directory() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("libx.so"), b"").unwrap();
        let cfg = dir.path().join("gw.toml");
        let c = Config::parse("[[workers]]\nbackend = \"library\"\nlibrary = \"libx.so\"\n", &cfg).unwrap();
        assert_eq!(c.workers[0].source, BackendSource::Library(dir.path().join("libx.so")));
        assert_eq!(c.workers[0].isolation, Isolation::Process, "a library runs in a process by default");
    }

    #[test]
    fn worker_value_checks() {
        assert_eq!(error("[[workers]]\ncount = 0\n"), "config.toml: workers[0].count: must be at least 1");
        assert_eq!(
            error("[[workers]]\nmodes = []\n"),
            "config.toml: workers[0].modes: must name at least one of chat, video, audio"
        );
        assert_eq!(
            error("[[workers]]\nmodes = [\"chat\", \"tv\"]\n"),
            "config.toml: workers[0].modes[1]: unknown mode 'tv' (expected chat, video or audio)"
        );
        assert_eq!(
            error("[[workers]]\nname = \"a b\"\n"),
            "config.toml: workers[0].name: 'a b' must be non-empty and use only letters, digits, '_', '.' and '-'"
        );
        assert_eq!(
            error("[[workers]]\nname = \"a\"\n[[workers]]\nname = \"a\"\n"),
            "config.toml: workers[1].name: worker name a-0 is used twice"
        );
        assert_eq!(
            error("[[workers]]\n[workers.options]\nlist = [1]\n"),
            "config.toml: workers[0].options.list: must be a string, a number or a boolean"
        );
    }

    #[test]
    fn section_value_checks() {
        assert_eq!(
            error("[server]\nbind = \"localhost\"\n[[workers]]\n"),
            "config.toml: server.bind: 'localhost' is not an IP address with a port"
        );
        assert_eq!(
            error("[server]\nmax_frame_bytes = 10\n[[workers]]\n"),
            "config.toml: server.max_frame_bytes: must be at least 1024"
        );
        assert_eq!(
            error("[server]\nheartbeat_interval_s = 10\nheartbeat_timeout_s = 5\n[[workers]]\n"),
            "config.toml: server.heartbeat_timeout_s: must be longer than server.heartbeat_interval_s"
        );
        for key in [
            "server]\nheartbeat_interval_s",
            "queue]\nupdate_interval_s",
            "limits]\nchat_session_s",
            "limits]\nvideo_session_s",
            "limits]\naudio_session_s",
            "limits]\ncontext_tokens",
            "limits]\nmin_audio_samples",
            "limits]\nmax_pending_chunks",
            "limits]\nstep_timeout_ms",
        ] {
            let e = error(&format!("[{key} = 0\n[[workers]]\n"));
            let dotted = key.replace("]\n", ".");
            assert_eq!(e, format!("config.toml: {dotted}: must be greater than 0"));
        }
    }

    #[test]
    fn operations_sections() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("keys.txt"), "# team keys\nk2\n\n  k3  # ops\n").unwrap();
        let cfg = dir.path().join("gw.toml");
        let c = Config::parse(
            "[auth]\napi_keys = [\"k1\"]\napi_keys_file = \"keys.txt\"\nadmin_key = \"root\"\n\
             [recording]\nenabled = true\ndir = \"rec\"\n[server]\nallowed_origins = [\"https://app.example\"]\n[[workers]]\n",
            &cfg,
        )
        .unwrap();
        assert_eq!(c.api_keys, ["k1", "k2", "k3"]);
        assert_eq!(c.admin_key.as_deref(), Some("root"));
        assert!(c.recording.enabled);
        assert_eq!(c.recording.dir, dir.path().join("rec"));
        assert_eq!(c.server.shutdown_grace_s, 10.0);
        assert_eq!(c.tls, None);

        assert_eq!(
            error("[auth]\napi_keys_file = \"/nonexistent/keys\"\n[[workers]]\n").split(" (").next().unwrap(),
            "config.toml: auth.api_keys_file: cannot read /nonexistent/keys: No such file or directory"
        );
        assert_eq!(
            error("[auth]\napi_keys = [\"ok\", \"has space\"]\n[[workers]]\n"),
            "config.toml: auth.api_keys[1]: a key must be non-empty and without spaces"
        );
        assert_eq!(
            error("[server.tls]\ncert = \"c.pem\"\n[[workers]]\n"),
            "config.toml: server.tls.key: required with server.tls.cert"
        );
        assert_eq!(
            error("[server.tls]\ncert = \"/nope/c.pem\"\nkey = \"/nope/k.pem\"\n[[workers]]\n"),
            "config.toml: server.tls.cert: no such file: /nope/c.pem"
        );
        assert_eq!(
            error("[server]\nallowed_origins = [\"example.com\"]\n[[workers]]\n"),
            "config.toml: server.allowed_origins[0]: 'example.com' is not an origin like https://example.com"
        );
        assert_eq!(
            error("[recording]\nretention_days = -1\n[[workers]]\n"),
            "config.toml: recording.retention_days: must not be negative"
        );
        assert!(
            error("[recording]\nenable = true\n[[workers]]\n")
                .starts_with("config.toml: recording.enable: unknown key")
        );
    }

    #[test]
    fn models_map_names_to_modes() {
        let c = parse(MINIMAL).unwrap();
        assert_eq!(c.model_mode("anything"), Some(Mode::Audio), "no [[models]]: any name");
        let c = parse("[[models]]\nname = \"omni\"\n[[models]]\nname = \"omni-video\"\nmodes = [\"video\", \"audio\"]\n[[workers]]\n").unwrap();
        assert_eq!(
            (c.model_mode("omni"), c.model_mode("omni-video"), c.model_mode("gpt")),
            (Some(Mode::Audio), Some(Mode::Video), None)
        );
        assert_eq!(
            error("[[models]]\nname = \"a\"\n[[models]]\nname = \"a\"\n[[workers]]\n"),
            "config.toml: models[1].name: 'a' is listed twice"
        );
        assert_eq!(
            error("[[models]]\nname = \"a\"\nmodes = [\"video\"]\n[[workers]]\nmodes = [\"chat\"]\n"),
            "config.toml: models[0].modes: no worker serves video"
        );
        assert!(
            error("[[models]]\nname = \"a\"\nmodes = [\"tv\"]\n[[workers]]\n")
                .starts_with("config.toml: models[0].modes[0]: unknown mode")
        );
    }

    #[test]
    fn an_unreadable_file_is_named() {
        let e = Config::load(Path::new("/nonexistent/gw.toml")).unwrap_err().to_string();
        assert!(e.starts_with("/nonexistent/gw.toml: cannot read:"), "{e}");
    }

    #[test]
    fn the_shipped_config_is_valid_and_documents_every_key() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config.toml");
        let text = std::fs::read_to_string(&path).unwrap();
        let c = Config::parse(&text, &path).unwrap();
        assert_eq!(c.bind, "127.0.0.1:8006".parse().unwrap());
        for key in [
            "bind",
            "max_frame_bytes",
            "max_outgoing_bytes",
            "heartbeat_interval_s",
            "heartbeat_timeout_s",
            "shutdown_grace_s",
            "max_connections_per_ip",
            "allowed_origins",
            "cert",
            "key",
            "enabled",
            "dir",
            "retention_days",
            "max_total_gb",
            "sweep_interval_s",
            "max_lag_mb",
            "api_keys",
            "api_keys_file",
            "admin_key",
            "max_waiting",
            "update_interval_s",
            "chat_session_s",
            "video_session_s",
            "audio_session_s",
            "context_tokens",
            "min_audio_samples",
            "max_pending_chunks",
            "step_timeout_ms",
            "name",
            "backend",
            "library",
            "count",
            "modes",
            "options",
        ] {
            assert!(
                text.contains(&format!("{key} "))
                    || text.contains(&format!("{key}="))
                    || text.contains(&format!(".{key}]")),
                "config.toml does not mention {key}"
            );
        }
    }
}
