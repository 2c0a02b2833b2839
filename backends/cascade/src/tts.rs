//! Speech synthesis: a Piper voice (VITS, ONNX) run by ONNX Runtime, loaded at run time from
//! the library the fetch script extracted (crate `ort`, `load-dynamic`: nothing is linked or
//! downloaded at build time). Text becomes IPA phonemes with espeak-ng, run as a program (its
//! GPL library stays out of this one), then Piper's phoneme ids; the voice's 22.05 kHz output
//! is resampled to the 24 kHz the ABI speaks.

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

use ort::environment::Environment;
use ort::session::Session;
use ort::value::Tensor;
use unicode_normalization::UnicodeNormalization;

pub const OUT_RATE: u32 = 24000;

pub struct Voice {
    session: Session,
    ids: HashMap<char, Vec<i64>>,
    rate: u32,
    scales: [f32; 3],
    espeak_voice: String,
    espeak: String,
}

/// ONNX Runtime, loaded once per process and shared with the voice activity detector.
fn runtime(library: &Path) -> Result<&'static Environment, TtsError> {
    omni_vad_silero::runtime(library).map_err(|e| TtsError::Runtime(e.to_string()))
}

/// Why the voice did not open or speak.
#[derive(Debug, thiserror::Error)]
pub enum TtsError {
    /// ONNX Runtime did not load.
    #[error("{0}")]
    Runtime(String),
    /// The voice's `.onnx.json` is missing or not a Piper voice's.
    #[error("voice config {path}: {reason}")]
    Config { path: String, reason: String },
    /// The voice's model did not load or run.
    #[error("voice: {0}")]
    Model(String),
    /// espeak-ng, which turns text into the voice's phonemes, failed.
    #[error("espeak-ng: {0}")]
    Phonemes(String),
    /// The clip could not be resampled.
    #[error("resampling: {0}")]
    Resample(String),
}

impl Voice {
    pub fn open(runtime_lib: &Path, model: &Path, threads: usize, espeak: &str) -> Result<Voice, TtsError> {
        let env = runtime(runtime_lib)?;
        let config_path = model.with_extension("onnx.json");
        let bad = |reason: String| TtsError::Config { path: config_path.display().to_string(), reason };
        let config: serde_json::Value = std::fs::read_to_string(&config_path)
            .map_err(|e| bad(e.to_string()))
            .and_then(|t| serde_json::from_str(&t).map_err(|e| bad(e.to_string())))?;
        let mut ids = HashMap::new();
        let map = config["phoneme_id_map"].as_object().ok_or_else(|| bad("no phoneme_id_map".into()))?;
        for (symbol, list) in map {
            let mut chars = symbol.chars();
            if let (Some(c), None) = (chars.next(), chars.next()) {
                ids.insert(c, list.as_array().into_iter().flatten().filter_map(|v| v.as_i64()).collect());
            }
        }
        for needed in ['^', '_', '$'] {
            if !ids.contains_key(&needed) {
                return Err(bad(format!("phoneme_id_map has no {needed:?}")));
            }
        }
        let rate = config["audio"]["sample_rate"].as_u64().unwrap_or(22050) as u32;
        let inference = &config["inference"];
        let scales = [
            inference["noise_scale"].as_f64().unwrap_or(0.667) as f32,
            inference["length_scale"].as_f64().unwrap_or(1.0) as f32,
            inference["noise_w"].as_f64().unwrap_or(0.8) as f32,
        ];
        let espeak_voice = config["espeak"]["voice"].as_str().unwrap_or("en-us").to_string();
        let session = Session::builder(env)
            .map_err(|e| TtsError::Runtime(e.to_string()))?
            .with_intra_threads(threads)
            .map_err(|e| TtsError::Runtime(e.to_string()))?
            .commit_from_file(model)
            .map_err(|e| TtsError::Model(format!("{}: {e}", model.display())))?;
        let voice = Voice { session, ids, rate, scales, espeak_voice, espeak: espeak.to_string() };
        voice.phonemes("test").map_err(|e| TtsError::Phonemes(format!("{espeak} is needed for the voice: {e}")))?;
        Ok(voice)
    }

    /// Without the voice's random variation (its noise scales at 0): the same text gives the
    /// same audio, for measurements that must repeat.
    pub fn steady(&mut self) {
        self.scales[0] = 0.0;
        self.scales[2] = 0.0;
    }

    /// IPA phonemes of `text`, as Piper's voices were trained on (espeak-ng's).
    fn phonemes(&self, text: &str) -> Result<String, TtsError> {
        let out = Command::new(&self.espeak)
            .args(["-q", "--ipa", "-v", &self.espeak_voice, "--", text])
            .output()
            .map_err(|e| TtsError::Phonemes(e.to_string()))?;
        if !out.status.success() {
            return Err(TtsError::Phonemes(String::from_utf8_lossy(&out.stderr).into_owned()));
        }
        let ipa = String::from_utf8_lossy(&out.stdout);
        Ok(ipa.split_whitespace().collect::<Vec<_>>().join(" "))
    }

    /// Speech for one clause, at 24 kHz. `cancelled` is polled between the stages.
    pub fn speak(&mut self, text: &str, cancelled: &dyn Fn() -> bool) -> Result<Vec<f32>, TtsError> {
        let clean: String = text.chars().filter(|c| !matches!(c, '*' | '#' | '`' | '_' | '~')).collect();
        if clean.chars().all(|c| !c.is_alphanumeric()) {
            return Ok(Vec::new());
        }
        let mut ipa = self.phonemes(&clean)?;
        // espeak drops the punctuation, which Piper uses for the melody: put the last one back.
        if let Some(p) = clean.trim_end().chars().last().filter(|c| ",.!?;:".contains(*c)) {
            ipa.push(p);
        }
        if cancelled() {
            return Ok(Vec::new());
        }
        let mut ids = self.ids[&'^'].clone();
        ids.extend(&self.ids[&'_']);
        for c in ipa.nfd() {
            if let Some(id) = self.ids.get(&c) {
                ids.extend(id);
                ids.extend(&self.ids[&'_']);
            }
        }
        ids.extend(&self.ids[&'$']);
        let n = ids.len();
        let model = |e: ort::Error| TtsError::Model(e.to_string());
        let input = Tensor::from_array(([1usize, n], ids)).map_err(model)?;
        let lengths = Tensor::from_array(([1usize], vec![n as i64])).map_err(model)?;
        let scales = Tensor::from_array(([3usize], self.scales.to_vec())).map_err(model)?;
        let outputs = self
            .session
            .run(ort::inputs!["input" => input, "input_lengths" => lengths, "scales" => scales])
            .map_err(model)?;
        let (_, audio) = outputs["output"].try_extract_tensor::<f32>().map_err(model)?;
        resample(audio, self.rate, OUT_RATE)
    }
}

/// A whole clip from `from` to `to` Hz (rubato's FFT resampler).
pub fn resample(samples: &[f32], from: u32, to: u32) -> Result<Vec<f32>, TtsError> {
    use audioadapter_buffers::direct::InterleavedSlice;
    use rubato::{Fft, FixedSync, Resampler};
    if from == to || samples.is_empty() {
        return Ok(samples.to_vec());
    }
    let fail = |e: &dyn std::fmt::Display| TtsError::Resample(e.to_string());
    let input = InterleavedSlice::new(samples, 1, samples.len()).map_err(|e| fail(&e))?;
    let mut r = Fft::<f32>::new(from as usize, to as usize, 1024, 1, FixedSync::Input).map_err(|e| fail(&e))?;
    let out = r.process_all(&input, samples.len(), None).map_err(|e| fail(&e))?;
    Ok(out.take_data())
}
