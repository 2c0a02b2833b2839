//! Fuzzing every dialect's decoder (proptest): arbitrary text, and structure-aware JSON
//! built from each dialect's own event types and field names, in sequences through one
//! decoder (dialects keep state). No input may panic; every input decodes to commands, or
//! to the spec's client error (`unknown_event`, `missing_field`, `invalid_payload`,
//! `not_ready`, `model_not_found`), or is unparseable (the session closes with 1003).
//!
//! Each property runs `PROPTEST_CASES` cases (proptest's default: 256) in the test suite;
//! `.ci/run` runs them again with 4,000; longer runs:
//! `PROPTEST_CASES=100000 cargo test --release --test it fuzz_decoders::`.

use base64::Engine;
use omni_actors::audio::{self, AudioLimits};
use omni_actors::domain::Mode;
use omni_actors::edge::dialect::{DecodeError, Dialect, Outbox};
use omni_dialects::Limits;
use omni_dialects::legacy::Legacy;
use omni_dialects::minicpm::Current;
use omni_dialects::openai::{Flavor, Realtime};
use omni_dialects::select::MiniCpmEndpoint;
use proptest::prelude::*;
use serde_json::{Map, Value};

const CLIENT_ERRORS: [&str; 15] = [
    "unknown_event",
    "missing_field",
    "invalid_payload",
    "not_ready",
    "model_not_found",
    "buffer_full",
    // The conversation's refusals, under OpenAI's own codes.
    "conversation_already_has_active_response",
    "input_audio_buffer_commit_empty",
    "item_already_exists",
    "item_delete_invalid_item_id",
    "item_retrieve_invalid_item_id",
    "item_truncate_invalid_item_id",
    "previous_item_not_found",
    "response_cancel_not_active",
    "response_create_unsupported",
];

/// Small bounds, so that sequences reach them.
fn limits() -> Limits {
    Limits { max_buffered_bytes: 4096, max_turns: 2, ..Limits::default() }
}

fn dialects() -> Vec<Box<dyn Dialect>> {
    let mut all: Vec<Box<dyn Dialect>> = Vec::new();
    for mode in [Mode::Chat, Mode::Video, Mode::Audio] {
        let voice = omni_dialects::vad::energy();
        all.push(Box::new(Current::new(mode, limits(), &voice).with_gateway_transcription(true)));
        all.push(Box::new(Legacy::new(mode, limits())));
        all.push(Box::new(MiniCpmEndpoint::new(mode, limits(), &voice)));
    }
    for flavor in [Flavor::Ga, Flavor::Beta, Flavor::Qwen] {
        all.push(Box::new(Realtime::new(flavor, "omni", limits(), &omni_dialects::vad::energy())));
    }
    all
}

/// Decodes every frame through every dialect, in order, checking the outcome of each.
fn decode_all(frames: &[String]) -> Result<(), TestCaseError> {
    for mut d in dialects() {
        let mut replies = Outbox::default();
        for frame in frames {
            match d.decode(&bytestring::ByteString::from(String::from(frame)), &mut replies) {
                Ok(_) | Err(DecodeError::Unparseable(_)) => {}
                Err(DecodeError::Protocol(e)) => prop_assert!(
                    CLIENT_ERRORS.contains(&e.code()),
                    "{}: {frame:.200} gave {} ({e})",
                    d.name(),
                    e.code()
                ),
            }
            d.take_recorded_media();
            prop_assert!(replies.texts().iter().all(|r| serde_json::from_str::<Value>(r).is_ok()), "replies are JSON");
            replies.clear();
        }
    }
    Ok(())
}

const TYPES: &[&str] = &[
    "session.init",
    "input.append",
    "session.close",
    "session.update",
    "input_audio_buffer.append",
    "input_audio_buffer.commit",
    "input_audio_buffer.clear",
    "input_image_buffer.append",
    "conversation.item.create",
    "response.create",
    "response.cancel",
    "session.finish",
    "session.dance",
];

const KEYS: &[&str] = &[
    "type",
    "payload",
    "input",
    "audio",
    "video_frames",
    "force_listen",
    "max_slice_nums",
    "messages",
    "role",
    "content",
    "text",
    "image",
    "image_url",
    "session",
    "event_id",
    "config",
    "voice",
    "system_prompt",
    "generation",
    "tts",
    "enabled",
    "ref_audio_data",
    "streaming",
    "item",
    "modalities",
    "instructions",
    "turn_detection",
    "input_audio_format",
    "output_audio_format",
    "temperature",
    "max_new_tokens",
    "length_penalty",
    "reason",
    "input_audio",
    "format",
    "rate",
    "sample_rate",
    "threshold",
    "silence_duration_ms",
    "response",
    "ref_audio",
    "tts_ref_audio",
    "output_modalities",
    "max_response_output_tokens",
    "thinking",
    "omni",
    "data",
    "ref_audio_base64",
    "tts_ref_audio_base64",
];

fn scalar() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        prop_oneof![Just(0u64), Just(1), Just(16000), Just(u64::MAX)].prop_map(Value::from),
        "\\PC{0,24}".prop_map(Value::String),
        prop::sample::select(TYPES).prop_map(|t| Value::String(t.into())),
        prop::sample::select(&["user", "system", "assistant", "tool", "text", "audio", "server_vad", "pcm16"][..])
            .prop_map(|t| Value::String(t.into())),
        // base64 of arbitrary bytes: odd lengths, not a multiple of 4 samples, and so on
        prop::collection::vec(any::<u8>(), 0..64)
            .prop_map(|b| Value::String(base64::engine::general_purpose::STANDARD.encode(b))),
        "[A-Za-z0-9+/=]{0,40}".prop_map(Value::String),
    ]
}

fn value() -> impl Strategy<Value = Value> {
    scalar().prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::vec((prop::sample::select(KEYS), inner), 0..6)
                .prop_map(|kv| Value::Object(kv.into_iter().map(|(k, v)| (k.to_string(), v)).collect())),
        ]
    })
}

/// An event: a known type (usually) and a handful of known fields with arbitrary values.
fn event() -> impl Strategy<Value = String> {
    (
        prop::option::weighted(0.9, prop::sample::select(TYPES)),
        prop::collection::vec((prop::sample::select(KEYS), value()), 0..6),
    )
        .prop_map(|(kind, fields)| {
            let mut m = Map::new();
            for (k, v) in fields {
                m.insert(k.to_string(), v);
            }
            if let Some(kind) = kind {
                m.insert("type".into(), Value::String(kind.into()));
            }
            Value::Object(m).to_string()
        })
}

/// A WAV file with arbitrary header fields (rate, channels, bits, format, declared data
/// length) around arbitrary bytes: what a client may put in a reference voice.
fn crafted_wav() -> impl Strategy<Value = Vec<u8>> {
    let rate = prop_oneof![
        any::<u32>(),
        Just(4_294_967_291u32),
        Just(0),
        Just(7_999),
        Just(8_000),
        Just(44_100),
        Just(192_000),
        Just(192_001),
        Just(191_999),
    ];
    let bits = prop_oneof![Just(8u16), Just(16), Just(24), Just(32), any::<u16>()];
    let format = prop_oneof![Just(1u16), Just(3), any::<u16>()];
    let declared = prop_oneof![Just(None), any::<u32>().prop_map(Some)];
    (rate, 0u16..12, bits, format, declared, prop::collection::vec(any::<u8>(), 0..400)).prop_map(
        |(rate, channels, bits, format, declared, data)| {
            let block = (channels as u32).wrapping_mul(bits as u32 / 8);
            let data_len = declared.unwrap_or(data.len() as u32);
            let mut w = Vec::new();
            w.extend_from_slice(b"RIFF");
            w.extend_from_slice(&36u32.wrapping_add(data_len).to_le_bytes());
            w.extend_from_slice(b"WAVEfmt ");
            w.extend_from_slice(&16u32.to_le_bytes());
            w.extend_from_slice(&format.to_le_bytes());
            w.extend_from_slice(&channels.to_le_bytes());
            w.extend_from_slice(&rate.to_le_bytes());
            w.extend_from_slice(&rate.wrapping_mul(block).to_le_bytes());
            w.extend_from_slice(&(block as u16).to_le_bytes());
            w.extend_from_slice(&bits.to_le_bytes());
            w.extend_from_slice(b"data");
            w.extend_from_slice(&data_len.to_le_bytes());
            w.extend_from_slice(&data);
            w
        },
    )
}

proptest! {
    #[test]
    fn crafted_wavs_are_refused_or_decoded_within_the_limits(wav in crafted_wav()) {
        let limits = AudioLimits { max_seconds: 30.0 };
        if let Ok((samples, rate)) = audio::decode_wav(&wav, limits) {
            prop_assert!((audio::MIN_RATE..=audio::MAX_RATE).contains(&rate));
            prop_assert!(samples.len() <= limits.max_samples(rate));
            prop_assert!(samples.len() <= wav.len(), "never more samples than the file holds");
            // ...and what was accepted resamples to the backend's rate.
            prop_assert!(audio::resample(&samples, rate, 16000).is_ok());
        }
        // Through the legacy dialect's session.update, a crafted voice is a client error.
        let b64 = base64::engine::general_purpose::STANDARD.encode(&wav);
        let update = serde_json::json!({"type": "session.update", "session": {"instructions": "x", "ref_audio": b64}});
        decode_all(&[update.to_string()])?;
    }

    #[test]
    fn any_client_sample_rate_is_refused_or_usable(rate in prop_oneof![any::<u64>(), 0u64..200_000], pcm in prop::collection::vec(any::<i16>(), 0..2000)) {
        let format = serde_json::json!({"type": "session.update", "session": {
            "input_audio_format": {"type": "pcm", "sample_rate": rate},
            "audio": {"input": {"format": {"type": "audio/pcm", "rate": rate}}}}});
        let bytes: Vec<u8> = pcm.iter().flat_map(|s| s.to_le_bytes()).collect();
        let append = serde_json::json!({"type": "input_audio_buffer.append",
            "audio": base64::engine::general_purpose::STANDARD.encode(bytes)});
        for flavor in [Flavor::Ga, Flavor::Beta, Flavor::Qwen] {
            let mut d = Realtime::new(flavor, "omni", limits(), &omni_dialects::vad::energy());
            match d.decode(&bytestring::ByteString::from(String::from(&format.to_string())), &mut Outbox::default()) {
                Ok(_) => prop_assert!((8000..=192_000).contains(&rate), "{rate} accepted"),
                Err(DecodeError::Protocol(e)) => {
                    prop_assert_eq!(e.code(), "invalid_payload");
                    prop_assert!(e.to_string().contains("sample rate"), "{}", e);
                }
                Err(other) => prop_assert!(false, "{other:?}"),
            }
            let _ = d.decode(&bytestring::ByteString::from(String::from(&append.to_string())), &mut Outbox::default());
        }
    }

    #[test]
    fn arbitrary_text_never_panics(frames in prop::collection::vec("\\PC{0,200}", 1..4)) {
        decode_all(&frames)?;
    }

    #[test]
    fn arbitrary_bytes_as_lossy_text_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        decode_all(&[String::from_utf8_lossy(&bytes).into_owned()])?;
    }

    #[test]
    fn structured_events_get_an_event_or_the_specs_error(frames in prop::collection::vec(event(), 1..6)) {
        decode_all(&frames)?;
    }

    #[test]
    fn any_json_value_is_handled(v in value()) {
        decode_all(&[v.to_string()])?;
    }
}

#[test]
fn known_nasty_inputs() {
    let nasty = [
        "",
        "{}",
        "null",
        "[]",
        "{\"type\":null}",
        "{\"type\":\"input.append\",\"input\":{\"audio\":\"====\"}}",
        "{\"type\":\"input.append\",\"input\":{\"audio\":\"AAA\"}}",
        "{\"type\":\"input.append\",\"input\":{\"audio\":\"\",\"video_frames\":[\"\",null,1]}}",
        "{\"type\":\"input_audio_buffer.append\",\"audio\":\"AAAA\"}",
        "{\"type\":\"session.init\",\"payload\":{\"config\":{\"max_slice_nums\":-1,\"temperature\":1e308}}}",
        "{\"type\":\"conversation.item.create\",\"item\":{\"content\":[{\"type\":\"input_audio\"}]}}",
        "{\"type\":\"input.append\",\"input\":{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"audio\",\"audio\":\"AAAAAAAA\"}]}]}}",
        "{\"type\":\"input.append\"}\u{0}",
        "{\"type\":\"input.append\",\"type\":\"session.close\"}",
        &format!("{}{}", "[".repeat(10000), "]".repeat(10000)),
        &format!("{{\"type\":\"input.append\",\"input\":{}{}}}", "{\"a\":".repeat(3000), "}".repeat(3000)),
    ];
    decode_all(&nasty.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
}
