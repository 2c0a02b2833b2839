//! `[vad]`: the voice activity detector the gateway runs on every session's input audio for
//! `turn_detection: server_vad` (the OpenAI and Qwen dialects' speech events and barge-in).
//!
//! `engine = "energy"` (the default: no model, runs anywhere) calls a window speech when its
//! loudness reaches the client's threshold; `engine = "silero"` runs Silero VAD (its ONNX
//! model and ONNX Runtime, both fetched by `scripts/fetch-models.py`), which tells speech from
//! noise and music. Paths may start with `$OMNI_MODELS/` (the fetch script's folder) or `~/`.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use omni_actors::settings::{Base, Invalid};

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum VadEngine {
    #[default]
    Energy,
    Silero,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct VadConfig {
    pub engine: VadEngine,
    /// Silero's ONNX model.
    pub model: String,
    /// ONNX Runtime's library.
    pub onnxruntime_library: String,
}

impl Default for VadConfig {
    fn default() -> Self {
        VadConfig {
            engine: VadEngine::Energy,
            model: "$OMNI_MODELS/silero_vad.onnx".into(),
            onnxruntime_library: "$OMNI_MODELS/libonnxruntime.so.1.31.1".into(),
        }
    }
}

/// The engine and its files, resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VadSpec {
    Energy,
    Silero(omni_vad_silero::Model),
}

/// The models folder: `$OMNI_MODELS`, or `~/.cache/omni-gateway/models` (the fetch script's).
pub(crate) fn models_dir() -> PathBuf {
    match std::env::var_os("OMNI_MODELS") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => home().join(".cache/omni-gateway/models"),
    }
}

fn home() -> PathBuf {
    std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/"))
}

/// A path as the model sections write it: `$OMNI_MODELS/x`, `~/x`, or relative to the config
/// file.
pub(crate) fn expand_models_path(value: &str, base: Base<'_>) -> PathBuf {
    if let Some(rest) = value.strip_prefix("$OMNI_MODELS/") {
        models_dir().join(rest)
    } else if let Some(rest) = value.strip_prefix("~/") {
        home().join(rest)
    } else {
        base.resolve(Path::new(value))
    }
}

impl VadConfig {
    pub fn validate(&self, base: Base<'_>) -> Result<VadSpec, Invalid> {
        if self.engine == VadEngine::Energy {
            return Ok(VadSpec::Energy);
        }
        let file = |key: &str, value: &str| -> Result<PathBuf, Invalid> {
            let path = expand_models_path(value, base);
            if path.is_file() {
                return Ok(path);
            }
            Err(Invalid::new(
                key,
                format!(
                    "no such file: {} (engine = \"silero\" needs it; python3 scripts/fetch-models.py fetches it into {})",
                    path.display(),
                    models_dir().display()
                ),
            ))
        };
        Ok(VadSpec::Silero(omni_vad_silero::Model {
            path: file("model", &self.model)?,
            onnxruntime_library: file("onnxruntime_library", &self.onnxruntime_library)?,
        }))
    }
}
