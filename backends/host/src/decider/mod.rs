//! `[delegation]`: a text model beside a voice that calls no tools (a MiniCPM-o worker, a
//! vLLM-Omni slot, an ABI library without `OMNI_CAP_TOOLS`). Once per user turn the session
//! sends the decider its instructions, tools and the conversation's transcript; the decider
//! answers with a call or none ([`omni_actors::edge::decider`]). Off by default.
//!
//! - `decider = "http"` ([`http`]): an OpenAI-compatible chat-completions server with tools (a
//!   vLLM, llama.cpp or Ollama server beside the GPU), sent `url`/chat/completions requests.
//! - `decider = "pool"` ([`omni_actors::delegate::pool`]): a chat worker of the gateway's own
//!   pool whose backend calls tools (the CPU model, any ABI 1.3 library), queued as a chat session.

pub mod http;

use std::sync::Arc;
use std::time::Duration;

use omni_actors::edge::decider::{Decider, OpenDecider};
use omni_actors::messages::delegate::DelegationPort;
use omni_actors::messages::queue::QueuePort;
use omni_actors::settings::{Base, Invalid};
use serde::Deserialize;

/// `[delegation]` as written.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct DelegationConfig {
    /// `off` (the default) or `http`.
    pub decider: String,
    /// The chat-completions server's base URL (`http://127.0.0.1:8080/v1`); requests go to
    /// `URL/chat/completions`.
    pub url: String,
    /// The model the server is asked for.
    pub model: String,
    /// Its API key, sent as `Authorization: Bearer`; or a file that holds it (relative to the
    /// configuration file). Neither: no `Authorization` header.
    pub api_key: String,
    pub api_key_file: String,
    /// A decision not answered in this long fails the turn with `decider_timeout`.
    pub timeout_s: f64,
    /// The largest answer read (KiB); a longer one fails the turn with `decider_invalid_output`.
    pub max_answer_kb: u64,
    /// Decisions running side by side.
    pub threads: usize,
    /// Decisions waiting or running, at most; past it a turn fails at once with
    /// `decider_unavailable`.
    pub max_waiting: usize,
}

impl Default for DelegationConfig {
    fn default() -> Self {
        DelegationConfig {
            decider: "off".into(),
            url: String::new(),
            model: String::new(),
            api_key: String::new(),
            api_key_file: String::new(),
            timeout_s: 10.0,
            max_answer_kb: 256,
            threads: 2,
            max_waiting: 64,
        }
    }
}

/// `[delegation]` resolved, when it is on.
#[derive(Debug, Clone, PartialEq)]
pub struct DelegationSpec {
    pub decider: DeciderSpec,
    pub timeout: Duration,
    pub max_answer_bytes: u64,
    pub threads: usize,
    pub max_waiting: usize,
}

/// Which decider.
#[derive(Clone, PartialEq)]
pub enum DeciderSpec {
    /// A chat-completions server.
    Http {
        /// Where requests go (`URL/chat/completions`).
        endpoint: String,
        model: String,
        api_key: Option<String>,
    },
    /// The pool's own chat workers whose backend calls tools.
    Pool,
}

impl std::fmt::Debug for DeciderSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            // The key is a secret: never in a log.
            DeciderSpec::Http { endpoint, model, api_key } => f
                .debug_struct("Http")
                .field("endpoint", endpoint)
                .field("model", model)
                .field("api_key", &api_key.as_ref().map(|_| "(set)"))
                .finish(),
            DeciderSpec::Pool => f.write_str("Pool"),
        }
    }
}

impl DelegationSpec {
    /// What the gateway says at start-up and in `check-config` of the tools it serves.
    pub fn describe(&self) -> String {
        let by = match &self.decider {
            DeciderSpec::Http { endpoint, model, .. } => format!("{model} at {endpoint}"),
            DeciderSpec::Pool => "the pool's chat workers whose backend calls tools, queued as chat sessions".into(),
        };
        format!(
            "delegation: tools of backends that call none (MiniCPM-o workers, vLLM-Omni slots, ABI libraries \
             without tools) are decided by {by} (timeout {} s)",
            self.timeout.as_secs_f64()
        )
    }
}

impl DelegationConfig {
    pub fn validate(&self, base: Base<'_>) -> Result<Option<DelegationSpec>, Invalid> {
        if !(self.timeout_s > 0.0 && self.timeout_s <= 600.0) {
            return Err(Invalid::new("timeout_s", "must be above 0 and at most 600"));
        }
        if !(1..=64).contains(&self.threads) {
            return Err(Invalid::new("threads", "must be from 1 to 64"));
        }
        if self.max_waiting == 0 {
            return Err(Invalid::new("max_waiting", "must be at least 1"));
        }
        if !(1..=65536).contains(&self.max_answer_kb) {
            return Err(Invalid::new("max_answer_kb", "must be from 1 to 65536"));
        }
        let spec = |decider| DelegationSpec {
            decider,
            timeout: Duration::from_secs_f64(self.timeout_s),
            max_answer_bytes: self.max_answer_kb * 1024,
            threads: self.threads,
            max_waiting: self.max_waiting,
        };
        match self.decider.as_str() {
            "off" => return Ok(None),
            "http" => {}
            "pool" if self.url.is_empty() && self.model.is_empty() => return Ok(Some(spec(DeciderSpec::Pool))),
            "pool" => {
                return Err(Invalid::new("url", "a pool decider is the pool's own chat worker: give no url or model"));
            }
            other => {
                return Err(Invalid::new("decider", format!("'{other}' is not a decider (off, http, pool)")));
            }
        }
        let url = self.url.trim_end_matches('/');
        let authority = url.split_once("://").map_or("", |(_, rest)| rest.split('/').next().unwrap_or(""));
        if authority.contains('@') {
            return Err(Invalid::new(
                "url",
                "must not hold credentials (user:password@): give the key as api_key or api_key_file",
            ));
        }
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(Invalid::new(
                "url",
                "must be the chat-completions server's base URL, http:// or https:// (e.g. http://127.0.0.1:8080/v1)",
            ));
        }
        if self.model.is_empty() {
            return Err(Invalid::new("model", "must name the model the server is asked for"));
        }
        if !self.api_key.is_empty() && !self.api_key_file.is_empty() {
            return Err(Invalid::new("api_key_file", "give api_key or api_key_file, not both"));
        }
        let api_key = if self.api_key_file.is_empty() {
            (!self.api_key.is_empty()).then(|| self.api_key.clone())
        } else {
            let path = base.file("api_key_file", &self.api_key_file)?;
            let key = std::fs::read_to_string(&path)
                .map_err(|e| Invalid::new("api_key_file", format!("{}: {e}", path.display())))?;
            Some(key.trim().to_string()).filter(|k| !k.is_empty())
        };
        Ok(Some(spec(DeciderSpec::Http {
            endpoint: format!("{url}/chat/completions"),
            model: self.model.clone(),
            api_key,
        })))
    }
}

/// Starts the deciders of `spec`; a pool decider's sessions join `queue`.
pub fn start(spec: &DelegationSpec, queue: &QueuePort) -> DelegationPort {
    match &spec.decider {
        DeciderSpec::Http { endpoint, model, api_key } => {
            let (shared, endpoint, model, api_key) = (spec.clone(), endpoint.clone(), model.clone(), api_key.clone());
            let open: OpenDecider = Arc::new(move || {
                Box::new(http::HttpDecider::new(&endpoint, &model, api_key.as_deref(), &shared)) as Box<dyn Decider>
            });
            DelegationPort::start(spec.threads, spec.max_waiting, open)
        }
        DeciderSpec::Pool => {
            DelegationPort::pool(queue.clone(), spec.max_waiting, spec.timeout, spec.max_answer_bytes as usize)
        }
    }
}
