//! The hot path of a duplex session: decoding an `input.append` with one second of audio
//! (about 85 KB of JSON) into float32 samples, encoding a one-second audio delta, and writing a
//! chunk for a MiniCPM-o worker.

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use omni_actors::domain::{Mode, StepKind, StepOutcome};
use omni_actors::edge::dialect::{Dialect, Outbox};
use omni_actors::protocol::{Inbound, Outbound};
use omni_dialects::Limits;
use omni_dialects::minicpm::Current;
use omni_dialects::wire;

fn append_event() -> String {
    let samples: Vec<f32> = (0..16000).map(|i| 0.3 * (i as f32 * 0.0863).sin()).collect();
    let mut audio = String::new();
    wire::encode_pcm_f32(&samples, &mut audio);
    format!(r#"{{"type":"input.append","input":{{"audio":"{audio}","force_listen":false,"max_slice_nums":1}}}}"#)
}

fn decode(c: &mut Criterion) {
    let text: bytestring::ByteString = append_event().into();
    let mut dialect = Current::new(Mode::Audio, Limits::default(), &omni_dialects::vad::energy());
    let mut group = c.benchmark_group("decode");
    group.throughput(Throughput::Bytes(text.len() as u64));
    group.bench_function("input.append 1 s (85 KB) to samples", |b| {
        b.iter(|| {
            let mut replies = Outbox::default();
            let cmds = dialect.decode(black_box(&text), &mut replies).expect("valid event");
            match &cmds[..] {
                [Inbound::Chunk(c)] => black_box(c.audio.len()),
                _ => unreachable!(),
            }
        })
    });
    // Python's json.dumps spaces its members (here the leading type's); a client may also put `type` last, and then the
    // frame is scanned twice (once for the type, once for the event).
    for (name, event) in [
        (
            "input.append 1 s, json.dumps spacing",
            text.replace(r#"{"type":"input.append","#, r#"{"type": "input.append", "#),
        ),
        (
            "input.append 1 s, type last",
            text.replace(r#"{"type":"input.append","input""#, r#"{"input""#)
                .replace("}}", r#"},"type":"input.append"}"#),
        ),
    ] {
        assert_ne!(event, text.to_string(), "{name}: the event was not rewritten");
        let event: bytestring::ByteString = event.into();
        group.bench_function(name, |b| {
            b.iter(|| black_box(dialect.decode(black_box(&event), &mut Outbox::default()).expect("valid event").len()))
        });
    }
    group.finish();
}

fn encode(c: &mut Criterion) {
    let outcome = StepOutcome {
        kind: StepKind::Speak,
        text: String::new(),
        audio: (0..24000).map(|i| 0.25 * (i as f32 * 0.05).sin()).collect(),
        end_of_turn: false,
        kv_length: 1024,
        input_tokens: 26,
        output_tokens: 0,
        prefill_us: 10,
        generate_us: 20,
        ..StepOutcome::default()
    };
    let mut dialect = Current::new(Mode::Audio, Limits::default(), &omni_dialects::vad::energy());
    let mut out = Outbox::default();
    let mut group = c.benchmark_group("encode");
    group.throughput(Throughput::Bytes(24000 * 4));
    group.bench_function("audio delta 1 s (24000 samples)", |b| {
        b.iter(|| {
            out.clear();
            let event = Outbound::Step {
                session_id: "sess_0123456789abcdef",
                response_id: Some("resp_3"),
                input_id: "input_42",
                outcome: &outcome,
            };
            dialect.encode(black_box(event), &mut out);
            black_box(out.texts()[0].len())
        })
    });
    group.finish();
}

/// The two base64 crates on the hot path's payloads: one second of input (64,000 bytes of
/// float32) decoded into a buffer, one second of output (96,000 bytes) encoded.
fn base64_crates(c: &mut Criterion) {
    use base64::Engine;
    let input: Vec<u8> = (0..64_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8).collect();
    let output: Vec<u8> = (0..96_000u32).map(|i| (i.wrapping_mul(40_503) >> 8) as u8).collect();
    let b64_in = base64::engine::general_purpose::STANDARD.encode(&input);
    let mut group = c.benchmark_group("base64");
    group.throughput(Throughput::Bytes(input.len() as u64));
    group.bench_function("decode 1 s in: base64 (decode_slice)", |b| {
        let mut buf = vec![0u8; input.len()];
        b.iter(|| base64::engine::general_purpose::STANDARD.decode_slice(black_box(&b64_in), &mut buf).unwrap())
    });
    group.bench_function("decode 1 s in: base64-simd", |b| {
        let mut buf = vec![0u8; input.len()];
        b.iter(|| {
            base64_simd::STANDARD
                .decode(black_box(b64_in.as_bytes()), base64_simd::Out::from_slice(&mut buf))
                .map(|d| d.len())
                .unwrap()
        })
    });
    group.throughput(Throughput::Bytes(output.len() as u64));
    group.bench_function("encode 1 s out: base64 (encode_string)", |b| {
        let mut s = String::with_capacity(130_000);
        b.iter(|| {
            s.clear();
            base64::engine::general_purpose::STANDARD.encode_string(black_box(&output), &mut s);
            s.len()
        })
    });
    group.bench_function("encode 1 s out: base64-simd", |b| {
        let mut s = String::with_capacity(130_000);
        b.iter(|| {
            s.clear();
            base64_simd::STANDARD.encode_append(black_box(&output), &mut s);
            s.len()
        })
    });
    group.finish();
}

/// A chunk as a MiniCPM-o worker's `audio_chunk`: the client's base64 forwarded (the MiniCPM-o
/// dialects), encoded from samples (the OpenAI dialect's pcm16), and, for comparison, the way
/// the release before wrote it (a `serde_json::Value` with the `base64` crate's text, escaped
/// byte by byte when serialized).
fn worker_chunk(c: &mut Criterion) {
    use base64::Engine;
    let text: bytestring::ByteString = append_event().into();
    let mut dialect = Current::new(Mode::Audio, Limits::default(), &omni_dialects::vad::energy());
    let Ok(Inbound::Chunk(forwarded)) = dialect.decode(&text, &mut Outbox::default()).map(|mut c| c.remove(0)) else {
        unreachable!()
    };
    assert!(forwarded.audio_base64.is_some());
    let encoded = omni_actors::domain::DuplexChunk { audio_base64: None, ..forwarded.clone() };
    let mut group = c.benchmark_group("worker chunk");
    group.bench_function("audio_chunk 1 s: the client's base64 forwarded", |b| {
        b.iter(|| omni_backend_host::minicpmo::audio_chunk(black_box(&forwarded), false).len())
    });
    group.bench_function("audio_chunk 1 s: encoded from samples", |b| {
        b.iter(|| omni_backend_host::minicpmo::audio_chunk(black_box(&encoded), false).len())
    });
    group.bench_function("audio_chunk 1 s: serde_json Value and base64 (the release before)", |b| {
        b.iter(|| {
            let audio =
                base64::engine::general_purpose::STANDARD.encode(bytemuck::cast_slice::<f32, u8>(&encoded.audio));
            serde_json::json!({"type": "audio_chunk", "audio_base64": audio, "force_listen": false}).to_string().len()
        })
    });
    group.finish();
}

criterion_group!(benches, decode, encode, base64_crates, worker_chunk);
criterion_main!(benches);
