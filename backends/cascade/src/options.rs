//! The worker's `[workers.options]`, checked at open: a wrong value or a missing file fails
//! the worker with a reason that names the option and the path.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Which detector finds the user's speech (`vad.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum VadEngine {
    Silero,
    Energy,
}

#[derive(Debug, Clone)]
pub(crate) struct Options {
    pub llm_model: PathBuf,
    pub asr_model: PathBuf,
    pub voice: PathBuf,
    pub onnxruntime_library: PathBuf,
    pub asr_library: PathBuf,
    pub espeak: String,
    pub threads: i32,
    pub n_ctx: u32,
    pub max_answer_tokens: u32,
    pub vad: VadEngine,
    pub vad_model: PathBuf,
    pub vad_probability: f32,
    pub vad_threshold: f32,
    pub speech_min_ms: u32,
    pub silence_ms: u32,
    /// Silence after which the utterance so far is transcribed early (0: at the endpoint only).
    pub early_asr_ms: u32,
    /// Once the early transcription has the utterance, its answer's first piece is made during
    /// the rest of the hang-over, and spoken at the endpoint (taken back if the user goes on).
    pub answer_ahead: bool,
    pub barge_in_ms: u32,
    /// The answer's first piece ends after this many words when its first clause is longer
    /// (0: the first clause): the first sound waits for fewer tokens and less speech.
    pub first_piece_words: u32,
    pub lead_ms: u32,
    /// The duplex chunk it asks for (`info`'s `step_samples`), in milliseconds.
    pub chunk_ms: u32,
    pub temperature: f32,
    pub top_k: i32,
    pub top_p: f32,
    pub seed: u32,
}

pub(crate) const KNOWN: &[&str] = &[
    "llm_model",
    "asr_model",
    "voice",
    "onnxruntime_library",
    "asr_library",
    "espeak",
    "threads",
    "n_ctx",
    "max_answer_tokens",
    "vad",
    "vad_model",
    "vad_probability",
    "vad_threshold",
    "speech_min_ms",
    "silence_ms",
    "early_asr_ms",
    "answer_ahead",
    "barge_in_ms",
    "first_piece_words",
    "lead_ms",
    "chunk_ms",
    "temperature",
    "top_k",
    "top_p",
    "seed",
];

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

/// `$OMNI_MODELS/x` and `~/x` expanded.
fn expand(value: &str) -> PathBuf {
    if let Some(rest) = value.strip_prefix("$OMNI_MODELS/") {
        models_dir().join(rest)
    } else if let Some(rest) = value.strip_prefix("~/") {
        home().join(rest)
    } else {
        PathBuf::from(value)
    }
}

fn file(key: &str, value: PathBuf) -> Result<PathBuf, String> {
    if value.is_file() {
        Ok(value)
    } else {
        Err(format!(
            "{key}: no such file: {} (scripts/fetch-models.py fetches the models into {})",
            value.display(),
            models_dir().display()
        ))
    }
}

fn number<T: std::str::FromStr + PartialOrd + std::fmt::Display>(
    map: &HashMap<String, String>,
    key: &str,
    default: T,
    min: T,
    max: T,
) -> Result<T, String> {
    match map.get(key) {
        None => Ok(default),
        Some(v) => match v.trim().parse::<T>() {
            Ok(n) if n >= min && n <= max => Ok(n),
            _ => Err(format!("{key}: {v:?} is not a number from {min} to {max}")),
        },
    }
}

impl Options {
    /// `this_library`: where the cascade library itself is (the ASR library is beside it).
    pub(crate) fn parse(map: &HashMap<String, String>, this_library: Option<&Path>) -> Result<Options, String> {
        if let Some(unknown) = map.keys().find(|k| !KNOWN.contains(&k.as_str())) {
            return Err(format!("unknown option {unknown:?} (known: {})", KNOWN.join(", ")));
        }
        let path = |key: &str, default: &str| expand(map.get(key).map(String::as_str).unwrap_or(default));
        let beside = this_library
            .and_then(Path::parent)
            .map(|d| d.join("libomni_asr_whisper.so"))
            .unwrap_or_else(|| PathBuf::from("libomni_asr_whisper.so"));
        let asr_library = match map.get("asr_library") {
            Some(v) => expand(v),
            None => beside,
        };
        let vad = match map.get("vad").map(String::as_str) {
            None | Some("silero") => VadEngine::Silero,
            Some("energy") => VadEngine::Energy,
            Some(other) => return Err(format!("vad: {other:?} is not a detector (silero, energy)")),
        };
        let vad_model = path("vad_model", "$OMNI_MODELS/silero_vad.onnx");
        let options = Options {
            vad,
            vad_model,
            vad_probability: number(map, "vad_probability", 0.5, 0.05, 0.95)?,
            llm_model: file("llm_model", path("llm_model", "$OMNI_MODELS/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"))?,
            asr_model: file("asr_model", path("asr_model", "$OMNI_MODELS/ggml-tiny.en.bin"))?,
            voice: file("voice", path("voice", "$OMNI_MODELS/en_US-joe-medium.onnx"))?,
            onnxruntime_library: file(
                "onnxruntime_library",
                path("onnxruntime_library", "$OMNI_MODELS/libonnxruntime.so.1.31.1"),
            )?,
            asr_library: file("asr_library", asr_library)?,
            espeak: map.get("espeak").cloned().unwrap_or_else(|| "espeak-ng".into()),
            threads: number(map, "threads", 2, 1, 64)?,
            n_ctx: number(map, "n_ctx", 4096, 512, 32768)?,
            max_answer_tokens: number(map, "max_answer_tokens", 120, 8, 4096)?,
            vad_threshold: number(map, "vad_threshold", 0.015, 0.0001, 1.0)?,
            speech_min_ms: number(map, "speech_min_ms", 250, 20, 10000)?,
            silence_ms: number(map, "silence_ms", 500, 100, 10000)?,
            early_asr_ms: number(map, "early_asr_ms", 150, 0, 10000)?,
            answer_ahead: match map.get("answer_ahead").map(String::as_str) {
                None | Some("true") => true,
                Some("false") => false,
                Some(other) => return Err(format!("answer_ahead: {other:?} is not true or false")),
            },
            // Counted over the last second (vad.rs): at most 1000.
            barge_in_ms: number(map, "barge_in_ms", 300, 20, 1000)?,
            first_piece_words: number(map, "first_piece_words", 4, 0, 100)?,
            lead_ms: number(map, "lead_ms", 1500, 0, 60000)?,
            chunk_ms: number(map, "chunk_ms", 200, 100, 1000)?,
            temperature: number(map, "temperature", 0.2, 0.0, 2.0)?,
            top_k: number(map, "top_k", 40, 1, 1000)?,
            top_p: number(map, "top_p", 0.9, 0.01, 1.0)?,
            seed: number(map, "seed", 42, 0, u32::MAX)?,
        };
        if options.vad == VadEngine::Silero {
            file("vad_model", options.vad_model.clone())?;
        }
        Ok(options)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn a_missing_model_is_named_with_its_path() {
        let err = Options::parse(&map(&[("llm_model", "/nowhere/model.gguf")]), None).unwrap_err();
        assert!(err.starts_with("llm_model: no such file: /nowhere/model.gguf"), "{err}");
    }

    #[test]
    fn unknown_options_and_bad_numbers_are_refused() {
        let err = Options::parse(&map(&[("lmm_model", "x")]), None).unwrap_err();
        assert!(err.contains("unknown option \"lmm_model\""), "{err}");
        let dir = std::env::temp_dir();
        let f = dir.join("omni-cascade-options-test");
        std::fs::write(&f, b"x").unwrap();
        let p = f.to_str().unwrap();
        let all = [
            ("llm_model", p),
            ("asr_model", p),
            ("voice", p),
            ("onnxruntime_library", p),
            ("asr_library", p),
            ("vad_model", p),
        ];
        let mut m = map(&all);
        m.insert("threads".into(), "0".into());
        let err = Options::parse(&m, None).unwrap_err();
        assert_eq!(err, "threads: \"0\" is not a number from 1 to 64");
        m.insert("threads".into(), "2".into());
        assert_eq!(Options::parse(&m, None).unwrap().threads, 2);
    }
}
