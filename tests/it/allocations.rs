//! The hot path allocates no more than it must: decoding an `input.append` with one second
//! of audio (85 KB of JSON) makes one allocation for the samples and never copies the
//! base64 payload; encoding a one-second audio delta makes one allocation for its frame.
//! Counted with a global allocator of this test binary, on the test's own thread only (the
//! other tests of the binary run beside it).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use omni_actors::domain::{Mode, StepKind, StepOutcome};
use omni_actors::edge::dialect::{Dialect, Outbox};
use omni_actors::protocol::{Inbound, Outbound};
use omni_dialects::Limits;
use omni_dialects::legacy::Legacy;
use omni_dialects::minicpm::Current;
use omni_dialects::wire;

struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);
static BYTES: AtomicUsize = AtomicUsize::new(0);
/// Allocations of 16 KiB or more: a copy of the audio would be one.
static LARGE: AtomicUsize = AtomicUsize::new(0);

std::thread_local! {
    /// Allocations are counted on this thread only while it is set.
    static COUNTING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

fn counting() -> bool {
    COUNTING.try_with(|c| c.get()).unwrap_or(false)
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if counting() {
            ALLOCATIONS.fetch_add(1, Ordering::SeqCst);
            BYTES.fetch_add(layout.size(), Ordering::SeqCst);
            if layout.size() >= 16 * 1024 {
                LARGE.fetch_add(1, Ordering::SeqCst);
            }
        }
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if counting() {
            ALLOCATIONS.fetch_add(1, Ordering::SeqCst);
            BYTES.fetch_add(new_size, Ordering::SeqCst);
            if new_size >= 16 * 1024 {
                LARGE.fetch_add(1, Ordering::SeqCst);
            }
        }
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn counts() -> (usize, usize, usize) {
    (ALLOCATIONS.load(Ordering::SeqCst), BYTES.load(Ordering::SeqCst), LARGE.load(Ordering::SeqCst))
}

// One test function: the counters are the thread's, and one test runs on a thread at a time.
#[test]
fn decoding_a_chunk_and_encoding_a_delta_allocate_what_they_must() {
    COUNTING.with(|c| c.set(true));
    let samples: Vec<f32> = (0..16000).map(|i| 0.3 * (i as f32 * 0.0863).sin()).collect();
    let mut b64 = String::new();
    wire::encode_pcm_f32(&samples, &mut b64);
    let text =
        format!(r#"{{"type":"input.append","input":{{"audio":"{b64}","force_listen":false,"max_slice_nums":1}}}}"#);
    assert!(text.len() > 85_000);
    let text = bytestring::ByteString::from(text);
    let mut dialect = Current::new(Mode::Audio, Limits::default(), &omni_dialects::vad::energy());
    let mut replies = Outbox::default();
    let _ = dialect.decode(&text, &mut replies); // warm up lazily initialised state

    let (a0, b0, l0) = counts();
    let cmds = dialect.decode(&text, &mut replies).expect("valid event");
    let (a1, b1, l1) = counts();
    let [Inbound::Chunk(chunk)] = &cmds[..] else { panic!("{cmds:?}") };
    assert_eq!(chunk.audio, samples);
    let (allocations, bytes, large) = (a1 - a0, b1 - b0, l1 - l0);
    println!("decode: {allocations} allocations, {bytes} bytes, {large} large");
    assert_eq!(large, 1, "exactly one large allocation: the samples");
    assert!(bytes < 64_000 + 8_000, "the 85 KB payload is never copied: {bytes} bytes allocated");

    let outcome = StepOutcome {
        kind: StepKind::Speak,
        text: String::new(),
        audio: vec![0.25; 24000],
        end_of_turn: false,
        kv_length: 1,
        ..StepOutcome::default()
    };
    let mut frames = Outbox::with_capacity(4);
    let (a0, b0, l0) = counts();
    dialect.encode(
        Outbound::Step { session_id: "s", response_id: Some("r"), input_id: "input_1", outcome: &outcome },
        &mut frames,
    );
    let (a1, b1, l1) = counts();
    println!("encode: {} allocations, {} bytes, {} large", a1 - a0, b1 - b0, l1 - l0);
    assert_eq!(l1 - l0, 1, "one large allocation: the frame, sized up front");
    assert!(b1 - b0 < 128_000 + 8_000, "{} bytes", b1 - b0);

    // A legacy session.update whose reference voice is a crafted 300-byte WAV declaring
    // 4,294,967,291 Hz (this once made the server allocate 3 GB): refused, having allocated
    // next to nothing.
    let mut wav = Vec::new();
    wav.extend_from_slice(b"RIFF");
    wav.extend_from_slice(&136u32.to_le_bytes());
    wav.extend_from_slice(b"WAVEfmt ");
    for v in [16u32.to_le_bytes().to_vec(), 1u16.to_le_bytes().to_vec(), 1u16.to_le_bytes().to_vec()] {
        wav.extend_from_slice(&v);
    }
    wav.extend_from_slice(&4_294_967_291u32.to_le_bytes());
    wav.extend_from_slice(&4_294_967_291u32.to_le_bytes());
    wav.extend_from_slice(&1u16.to_le_bytes());
    wav.extend_from_slice(&8u16.to_le_bytes());
    wav.extend_from_slice(b"data");
    wav.extend_from_slice(&100u32.to_le_bytes());
    wav.extend_from_slice(&[128u8; 100]);
    let b64 = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, &wav);
    let update = format!(r#"{{"type":"session.update","session":{{"instructions":"x","ref_audio":"{b64}"}}}}"#);
    let update = bytestring::ByteString::from(update);
    let mut legacy = Legacy::new(Mode::Video, Limits::default());
    let (_, b0, _) = counts();
    let refused = legacy.decode(&update, &mut replies).expect_err("refused");
    let (_, b1, _) = counts();
    println!("crafted WAV: {} bytes allocated: {refused}", b1 - b0);
    assert!(refused.to_string().contains("sample rate 4294967291 Hz is outside 8000..192000 Hz"), "{refused}");
    assert!(b1 - b0 < 16_000, "a refused 300-byte voice allocated {} bytes", b1 - b0);
}
