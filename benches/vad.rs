//! The gateway's voice activity detectors: CPU per second of a session's audio, for Silero VAD
//! (its 32 ms windows of speech, and of digital silence, which it skips) and the energy
//! detector. Needs the models (`python3 scripts/fetch-models.py`; `$OMNI_MODELS` or
//! `~/.cache/omni-gateway/models`). `cargo bench --bench vad`.

use std::hint::black_box;
use std::path::PathBuf;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use omni_actors::edge::vad::VoiceDetector;
use omni_gateway::config::VadSpec;

fn models() -> PathBuf {
    match std::env::var_os("OMNI_MODELS") {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/omni-gateway/models"),
    }
}

/// One second of a voiced sound (a vowel-like mix of harmonics with a little noise).
fn voiced_second() -> Vec<f32> {
    let mut seed = 7u32;
    (0..16000)
        .map(|i| {
            let t = i as f32 / 16000.0;
            seed = seed.wrapping_mul(1664525).wrapping_add(1013904223);
            let noise = ((seed >> 8) as f32 / (1u32 << 24) as f32 - 0.5) * 0.01;
            let f0 = 140.0;
            (1..8).map(|h| (2.0 * std::f32::consts::PI * f0 * h as f32 * t).sin() / h as f32).sum::<f32>() * 0.05
                + noise
        })
        .collect()
}

fn second(detector: &mut dyn VoiceDetector, audio: &[f32]) -> f32 {
    let size = detector.window();
    audio.chunks(size).map(|w| detector.probability(w)).sum()
}

fn detectors(c: &mut Criterion) {
    let mut group = c.benchmark_group("vad");
    group.throughput(Throughput::Elements(1));
    let voiced = voiced_second();
    let silent = vec![0.0f32; 16000];
    let model = omni_vad_silero::Model {
        path: models().join("silero_vad.onnx"),
        onnxruntime_library: models().join("libonnxruntime.so.1.31.1"),
    };
    if model.check().is_ok() {
        let mut silero = omni_dialects::vad::detectors(&VadSpec::Silero(model)).detector();
        group.bench_function("silero, 1 s of sound", |b| b.iter(|| black_box(second(silero.as_mut(), &voiced))));
        group.bench_function("silero, 1 s of digital silence", |b| {
            b.iter(|| black_box(second(silero.as_mut(), &silent)))
        });
    } else {
        eprintln!("vad: no Silero model in {} (python3 scripts/fetch-models.py): energy only", models().display());
    }
    let mut energy = omni_dialects::vad::energy().detector();
    group.bench_function("energy, 1 s of sound", |b| b.iter(|| black_box(second(energy.as_mut(), &voiced))));
    group.finish();
}

criterion_group!(benches, detectors);
criterion_main!(benches);
