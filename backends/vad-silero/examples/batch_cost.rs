//! What a Silero window costs in ONNX Runtime, by batch (windows of several streams in one
//! run) and by rate (the model's 16 kHz and 8 kHz branches): the measurement behind the route to
//! under 1 ms of CPU per second of audio in docs/performance.md. The model and ONNX Runtime come
//! from `$OMNI_MODELS` (default `~/.cache/omni-gateway/models`).
//!
//! `cargo run --release -p omni-vad-silero --example batch_cost`

use std::path::PathBuf;
use std::time::Instant;

use ort::session::Session;
use ort::value::Tensor;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let models = std::env::var_os("OMNI_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/omni-gateway/models"));
    let env = omni_vad_silero::runtime(&models.join("libonnxruntime.so.1.31.1"))?;
    println!("| rate | batch | per window | per second of audio |\n|---|---|---|---|");
    for rate in [16000i64, 8000] {
        // 32 ms windows, and the context the model reads before each.
        let (context, window) = if rate == 16000 { (64, 512) } else { (32, 256) };
        for batch in [1usize, 8, 32] {
            let mut session = Session::builder(env)?
                .with_intra_threads(1)?
                .with_inter_threads(1)?
                .commit_from_file(models.join("silero_vad.onnx"))?;
            let input: Vec<f32> =
                (0..batch * (context + window)).map(|i| ((i * 7919 % 256) as f32 / 128.0 - 1.0) * 0.1).collect();
            let mut state = vec![0f32; 2 * batch * 128];
            let mut run = |state: &mut Vec<f32>| -> Result<(), Box<dyn std::error::Error>> {
                let input = Tensor::from_array(([batch, context + window], input.clone()))?;
                let s = Tensor::from_array(([2usize, batch, 128], state.clone()))?;
                let sr = Tensor::from_array(((), vec![rate]))?;
                let out = session.run(ort::inputs!["input" => input, "state" => s, "sr" => sr])?;
                let (_, next) = out["stateN"].try_extract_tensor::<f32>()?;
                state.copy_from_slice(next);
                Ok(())
            };
            for _ in 0..50 {
                run(&mut state)?;
            }
            let runs = 3000 / batch;
            let t = Instant::now();
            for _ in 0..runs {
                run(&mut state)?;
            }
            let per_window_us = t.elapsed().as_secs_f64() * 1e6 / (runs * batch) as f64;
            println!(
                "| {} kHz | {batch} | {per_window_us:.1} µs | {:.2} ms |",
                rate / 1000,
                per_window_us * 31.25 / 1000.0
            );
        }
    }
    Ok(())
}
