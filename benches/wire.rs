//! The hot path of a duplex session: decoding an `input.append` with one second of audio
//! (about 85 KB of JSON) into float32 samples, and encoding a one-second audio delta.

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use omni_actors::dialect::Dialect;
use omni_actors::domain::{Mode, StepKind, StepOutcome};
use omni_actors::protocol::{Inbound, Outbound};
use omni_gateway::dialect::minicpm::Current;
use omni_gateway::dialect::wire;

fn append_event() -> String {
    let samples: Vec<f32> = (0..16000).map(|i| 0.3 * (i as f32 * 0.0863).sin()).collect();
    let mut audio = String::new();
    wire::encode_pcm_f32(&samples, &mut audio);
    format!(r#"{{"type":"input.append","input":{{"audio":"{audio}","force_listen":false,"max_slice_nums":1}}}}"#)
}

fn decode(c: &mut Criterion) {
    let text = append_event();
    let mut dialect = Current::new(Mode::Audio, 4000);
    let mut group = c.benchmark_group("decode");
    group.throughput(Throughput::Bytes(text.len() as u64));
    group.bench_function("input.append 1 s (85 KB) to samples", |b| {
        b.iter(|| {
            let mut replies = Vec::new();
            let cmds = dialect.decode(black_box(&text), &mut replies).expect("valid event");
            match &cmds[..] {
                [Inbound::Chunk(c)] => black_box(c.audio.len()),
                _ => unreachable!(),
            }
        })
    });
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
    };
    let mut dialect = Current::new(Mode::Audio, 4000);
    let mut out = Vec::new();
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
            black_box(out[0].len())
        })
    });
    group.finish();
}

criterion_group!(benches, decode, encode);
criterion_main!(benches);
