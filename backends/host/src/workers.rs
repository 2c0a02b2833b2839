//! `[[workers]]`: the workers of this host, each entry standing for `count` of them.

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;

use omni_actors::domain::Mode;
use serde::Deserialize;

use omni_actors::settings::{Base, Invalid, check_name};

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    Builtin,
    Library,
    /// A MiniCPM-o model worker (its HTTP/WebSocket protocol) at `url`.
    #[serde(rename = "minicpmo-worker")]
    MinicpmoWorker,
    /// A vLLM-Omni server's duplex endpoint at `url`, each of its session slots a worker.
    #[serde(rename = "vllm-omni")]
    VllmOmni,
}

impl BackendKind {
    /// Whether the backend is a server reached at `url`.
    fn has_url(self) -> bool {
        matches!(self, BackendKind::MinicpmoWorker | BackendKind::VllmOmni)
    }

    fn name(self) -> &'static str {
        match self {
            BackendKind::Builtin => "builtin",
            BackendKind::Library => "library",
            BackendKind::MinicpmoWorker => "minicpmo-worker",
            BackendKind::VllmOmni => "vllm-omni",
        }
    }
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
    /// `backend = "minicpmo-worker"` or `"vllm-omni"`: the server's base URL (`http://gpu1:22400`).
    #[serde(default)]
    pub url: Option<String>,
    /// Where the backend runs; defaults to "thread" for builtin, "process" for library.
    #[serde(default)]
    pub isolation: Option<Isolation>,
    #[serde(default = "default_count")]
    pub count: usize,
    /// The modes served; by default every mode the backend can run.
    #[serde(default)]
    pub modes: Option<Vec<String>>,
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
/// The modes an entry serves when it names none: all, or the duplex ones for a backend that
/// runs only duplex sessions.
fn default_modes(backend: BackendKind) -> Vec<String> {
    let modes = Mode::ALL.iter().filter(|m| backend != BackendKind::VllmOmni || **m != Mode::Chat);
    modes.map(|m| m.as_str().to_string()).collect()
}

/// The largest voice prompt a vLLM-Omni slot takes: the server echoes it in `session.created`,
/// and the backend reads messages of at most 4 MiB (its base64 is a third larger).
const MAX_REF_AUDIO_BYTES: u64 = 2 << 20;

/// Where a worker's backend comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackendSource {
    Builtin,
    /// A shared library, its path resolved against the config file's directory.
    Library(PathBuf),
    /// A MiniCPM-o model worker at this base URL (`http://host:port`).
    MinicpmoWorker(String),
    /// A session slot of the vLLM-Omni server at this base URL (`http://host:port`).
    VllmOmni(String),
}

impl BackendSource {
    /// For status and logs: "builtin", the library's path, or the worker's URL.
    pub fn label(&self) -> String {
        match self {
            BackendSource::Builtin => "builtin".to_string(),
            BackendSource::Library(p) => p.display().to_string(),
            BackendSource::MinicpmoWorker(url) => format!("minicpmo-worker {url}"),
            BackendSource::VllmOmni(url) => format!("vllm-omni {url}"),
        }
    }

    /// The server's base URL, for a backend reached over the network.
    pub fn url(&self) -> Option<&str> {
        match self {
            BackendSource::MinicpmoWorker(url) | BackendSource::VllmOmni(url) => Some(url),
            _ => None,
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

/// Every entry checked and expanded into workers with unique names; errors name
/// `workers[i].KEY`.
pub fn validate(entries: &[WorkerEntry], base: Base<'_>) -> Result<Vec<WorkerSpec>, Invalid> {
    let mut workers = Vec::new();
    let mut names = HashSet::new();
    for (i, entry) in entries.iter().enumerate() {
        for w in entry.validate(i, base).map_err(|e| e.under(&format!("workers[{i}]")))? {
            if !names.insert(w.name.clone()) {
                let why = format!("worker name {} is used twice", w.name);
                return Err(Invalid::new(format!("workers[{i}].name"), why));
            }
            workers.push(w);
        }
    }
    Ok(workers)
}

impl WorkerEntry {
    /// The entry checked, as its `count` workers; keys in errors are the entry's own.
    pub fn validate(&self, i: usize, base: Base<'_>) -> Result<Vec<WorkerSpec>, Invalid> {
        let name = self.name.clone().unwrap_or_else(|| format!("worker{i}"));
        check_name("name", &name)?;
        if self.count == 0 {
            return Err(Invalid::new("count", "must be at least 1"));
        }
        if self.library.is_some() && self.backend != BackendKind::Library {
            return Err(Invalid::new("library", "only allowed with backend = \"library\""));
        }
        if self.url.is_some() && !self.backend.has_url() {
            return Err(Invalid::new("url", "only allowed with backend = \"minicpmo-worker\" or \"vllm-omni\""));
        }
        let source = match (self.backend, &self.library, &self.url) {
            (BackendKind::Builtin, _, _) => BackendSource::Builtin,
            (BackendKind::Library, None, _) => {
                return Err(Invalid::new("library", "required with backend = \"library\""));
            }
            (BackendKind::Library, Some(lib), _) => {
                let resolved = base.resolve(lib);
                if !resolved.is_file() {
                    return Err(Invalid::new("library", format!("no such file: {}", resolved.display())));
                }
                BackendSource::Library(resolved)
            }
            (kind, _, None) => {
                let why = format!("required with backend = \"{}\" (e.g. http://gpu1:22400)", kind.name());
                return Err(Invalid::new("url", why));
            }
            (BackendKind::MinicpmoWorker, _, Some(url)) => BackendSource::MinicpmoWorker(worker_url(url)?),
            (BackendKind::VllmOmni, _, Some(url)) => BackendSource::VllmOmni(worker_url(url)?),
        };
        let isolation = match (&source, self.isolation) {
            (BackendSource::MinicpmoWorker(_) | BackendSource::VllmOmni(_), Some(_)) => {
                let why = format!("not for a {} (it is a process of its own)", self.backend.name());
                return Err(Invalid::new("isolation", why));
            }
            (_, Some(isolation)) => isolation,
            (BackendSource::Library(_), None) => Isolation::Process,
            (_, None) => Isolation::Thread,
        };
        let named = self.modes.clone().unwrap_or_else(|| default_modes(self.backend));
        if named.is_empty() {
            return Err(Invalid::new("modes", "must name at least one of chat, video, audio"));
        }
        let mut modes = Vec::new();
        for (j, m) in named.iter().enumerate() {
            let mode: Mode = m.parse().map_err(|e| Invalid::new(format!("modes[{j}]"), e))?;
            if mode == Mode::Chat && self.backend == BackendKind::VllmOmni {
                let why =
                    "a vllm-omni slot runs duplex sessions only: \"audio\" and \"video\" (it answers no text turns)";
                return Err(Invalid::new(format!("modes[{j}]"), why));
            }
            if !modes.contains(&mode) {
                modes.push(mode);
            }
        }
        if self.backend == BackendKind::VllmOmni {
            check_voice_prompt(&self.options, base)?;
        }
        let mut options = Vec::new();
        for (k, v) in &self.options {
            let text = match v {
                toml::Value::String(s) => s.clone(),
                toml::Value::Integer(n) => n.to_string(),
                toml::Value::Float(f) => f.to_string(),
                toml::Value::Boolean(b) => b.to_string(),
                _ => return Err(Invalid::new(format!("options.{k}"), "must be a string, a number or a boolean")),
            };
            // A vLLM-Omni slot's voice prompt is a file beside the config.
            let text = match (self.backend, k.as_str()) {
                (BackendKind::VllmOmni, "ref_audio") => {
                    base.file(&format!("options.{k}"), &text)?.display().to_string()
                }
                _ => text,
            };
            options.push((k.clone(), text));
        }
        Ok((0..self.count)
            .map(|n| WorkerSpec {
                name: format!("{name}-{n}"),
                entry: i,
                source: source.clone(),
                isolation,
                modes: modes.clone(),
                options: options.clone(),
            })
            .collect())
    }
}

/// A vLLM-Omni slot's `ref_audio`: required (MiniCPM-o speaks only with a voice prompt, and
/// most clients send none), a WAV file, small enough to be echoed back.
fn check_voice_prompt(options: &BTreeMap<String, toml::Value>, base: Base<'_>) -> Result<(), Invalid> {
    let key = "options.ref_audio";
    let Some(toml::Value::String(path)) = options.get("ref_audio") else {
        let why =
            "required with backend = \"vllm-omni\": a WAV voice prompt (5 to 10 s of one voice, e.g. 16 kHz mono)";
        return Err(Invalid::new(key, why));
    };
    let path = base.file(key, path)?;
    let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    if size > MAX_REF_AUDIO_BYTES {
        let why =
            format!("{} is {size} bytes: at most {MAX_REF_AUDIO_BYTES} (about 60 s of 16 kHz mono)", path.display());
        return Err(Invalid::new(key, why));
    }
    let bytes = std::fs::read(&path).map_err(|e| Invalid::new(key, format!("{}: {e}", path.display())))?;
    let limits = omni_actors::audio::AudioLimits { max_seconds: 120.0 };
    omni_actors::audio::decode_wav(&bytes, limits)
        .map_err(|e| Invalid::new(key, format!("{} is not a WAV file the gateway reads: {e}", path.display())))?;
    Ok(())
}

/// A worker's base URL: `http://HOST:PORT` (no path), without the trailing slash.
fn worker_url(url: &str) -> Result<String, Invalid> {
    // Shown redacted: a URL may carry a password or a token in its path or query.
    let shown = omni_actors::settings::redacted_url(url);
    let rest =
        url.strip_prefix("http://").ok_or_else(|| Invalid::new("url", format!("'{shown}' must start with http://")))?;
    let rest = rest.trim_end_matches('/');
    if rest.is_empty() || rest.contains('/') || rest.contains('?') {
        return Err(Invalid::new("url", format!("'{shown}' must be http://HOST:PORT, with no path")));
    }
    Ok(format!("http://{rest}"))
}
