//! Speaks a sentence with the CPU model backend's voice (Piper, `en_US-joe-medium`) and writes
//! it to OUT as raw 16 kHz mono float32 little-endian samples: `speak OUT TEXT`. The voice and
//! ONNX Runtime come from `$OMNI_MODELS` (default `~/.cache/omni-gateway/models`, filled by
//! `scripts/fetch-models.py`); the phonemes from `espeak-ng`. The voice activity tests measure
//! the detector's edges on this voice as on espeak-ng's. Without the voice's random variation:
//! the same text gives the same samples every run.

use std::path::PathBuf;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [out, text] = &args[..] else {
        eprintln!("usage: speak OUT TEXT");
        std::process::exit(2);
    };
    let models = std::env::var_os("OMNI_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/omni-gateway/models"));
    let run = || -> Result<(), Box<dyn std::error::Error>> {
        let runtime = models.join("libonnxruntime.so.1.31.1");
        let mut voice =
            omni_cascade::tts::Voice::open(&runtime, &models.join("en_US-joe-medium.onnx"), 1, "espeak-ng")?;
        // The same audio every run: the tests compare the detector's edges with it.
        voice.steady();
        let speech = voice.speak(text, &|| false)?;
        let speech = omni_cascade::tts::resample(&speech, omni_cascade::tts::OUT_RATE, 16000)?;
        let bytes: Vec<u8> = speech.iter().flat_map(|s| s.to_le_bytes()).collect();
        std::fs::write(out, bytes).map_err(|e| format!("{out}: {e}").into())
    };
    if let Err(e) = run() {
        eprintln!("speak: {e}");
        std::process::exit(1);
    }
}
