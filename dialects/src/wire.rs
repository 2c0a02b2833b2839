//! Helpers every JSON dialect shares: parsing with errors that name the field, base64
//! float32 PCM in and out, JPEG checks, and writing events with large payloads without
//! intermediate copies.

use std::borrow::Cow;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use omni_actors::edge::dialect::{DecodeError, Outbox};
use omni_actors::protocol::ProtocolError;
use serde::{Deserialize, Serialize};

/// A JSON string borrowed from the frame when it has no escapes (base64 never does).
/// serde borrows a bare `Cow<'a, str>` field but not one inside `Option` or `Vec`; this
/// newtype keeps the borrow there too, so a large payload is never copied.
#[derive(Debug, Deserialize)]
#[serde(transparent)]
pub struct Text<'a>(#[serde(borrow)] pub Cow<'a, str>);

impl std::ops::Deref for Text<'_> {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

/// The `type` of an event, read without looking at the rest.
#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(rename = "type", borrow, default)]
    kind: Option<Cow<'a, str>>,
}

/// Reads an event's `type`. Not JSON, or JSON that is not an object: `Unparseable`.
pub fn event_type(text: &str) -> Result<Cow<'_, str>, DecodeError> {
    if let Some(kind) = leading_type(text) {
        return Ok(Cow::Borrowed(kind));
    }
    let is_object = text.trim_start().starts_with('{');
    match serde_json::from_str::<Envelope>(text) {
        // serde also reads a struct from a JSON array; only an object is an event.
        Ok(_) if !is_object => Err(DecodeError::Unparseable("the message is JSON but not an object".into())),
        Ok(Envelope { kind: Some(kind) }) => Ok(kind),
        Ok(Envelope { kind: None }) => Err(ProtocolError::MissingField("type: every event needs a type".into()).into()),
        Err(e) if e.is_data() && is_object => {
            Err(ProtocolError::InvalidPayload("type: must be a string".into()).into())
        }
        Err(e) if e.is_data() => Err(DecodeError::Unparseable("the message is JSON but not an object".into())),
        Err(e) => Err(DecodeError::Unparseable(format!("not JSON: {}", strip_position(&e.to_string())))),
    }
}

/// Fast path of [`event_type`]: the `type` when it is the object's first member and a short
/// string without escapes, as clients write it (`{"type":"x",` from JavaScript, `{"type": "x",`
/// from Python's `json.dumps`): a large event is then not scanned twice. The whole frame is
/// still parsed (and refused if it is not JSON) by [`parse_event`].
fn leading_type(text: &str) -> Option<&str> {
    fn ws(s: &str) -> &str {
        s.trim_start_matches([' ', '\t', '\n', '\r'])
    }
    let rest = ws(ws(text).strip_prefix('{')?).strip_prefix("\"type\"")?;
    let rest = ws(ws(rest).strip_prefix(':')?).strip_prefix('"')?;
    // (bytes: 64 may fall inside a character; a quote is always a boundary)
    let end = rest.as_bytes()[..rest.len().min(64)].iter().position(|&b| b == b'"')?;
    (!rest[..end].contains('\\')).then(|| &rest[..end])
}

/// Parses a whole event into `T`. Errors name the field: a missing field or a container
/// (`containers`, e.g. `input`) that is not an object is `missing_field`, anything else of
/// the wrong type is `invalid_payload`.
pub fn parse_event<'a, T: Deserialize<'a>>(text: &'a str, containers: &[&str]) -> Result<T, DecodeError> {
    // The fast path borrows every string (no copy of a large payload); only an invalid
    // event is parsed again, tracking the path, to name the field in the error.
    if let Ok(event) = serde_json::from_str(text) {
        return Ok(event);
    }
    let mut de = serde_json::Deserializer::from_str(text);
    serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if inner.is_syntax() || inner.is_eof() {
            return DecodeError::Unparseable(format!("not JSON: {}", strip_position(&inner.to_string())));
        }
        let message = strip_position(&inner.to_string());
        DecodeError::Protocol(
            if let Some(field) = message.strip_prefix("missing field `").and_then(|r| r.split('`').next()) {
                let full = if path == "." { field.to_string() } else { format!("{path}.{field}") };
                ProtocolError::MissingField(format!("{full} is required"))
            } else if containers.contains(&path.as_str()) {
                ProtocolError::MissingField(format!("{path} must be an object"))
            } else {
                ProtocolError::InvalidPayload(format!("{path}: {message}"))
            },
        )
    })
}

fn strip_position(message: &str) -> String {
    match message.find(" at line ") {
        Some(i) => message[..i].to_string(),
        None => message.to_string(),
    }
}

/// Base64 of little-endian float32 PCM into samples: one allocation, for the samples,
/// decoded straight into them (SIMD base64).
pub fn decode_pcm_f32(b64: &str, field: &str) -> Result<Vec<f32>, ProtocolError> {
    decode_pcm_f32_max(b64, field, usize::MAX, 16000)
}

/// As [`decode_pcm_f32`], refusing more than `max_samples` (at `rate`, for the message)
/// before anything is allocated.
pub fn decode_pcm_f32_max(b64: &str, field: &str, max_samples: usize, rate: u32) -> Result<Vec<f32>, ProtocolError> {
    let invalid = || ProtocolError::InvalidPayload(format!("{field}: not valid base64"));
    let simd = base64_simd::STANDARD;
    let n = simd.decoded_length(b64.as_bytes()).map_err(|_| invalid())?;
    if n % 4 != 0 {
        return Err(ProtocolError::InvalidPayload(format!(
            "{field}: {n} bytes is not a whole number of float32 samples (a multiple of 4)"
        )));
    }
    if n / 4 > max_samples {
        return Err(ProtocolError::InvalidPayload(format!(
            "{field}: {:.1} s of audio; at most {:.0} s are accepted",
            (n / 4) as f64 / rate as f64,
            max_samples as f64 / rate as f64
        )));
    }
    // Decoded straight into the samples' memory, which is not zeroed first (64 KB a chunk).
    let mut samples: Vec<f32> = Vec::with_capacity(n / 4);
    let spare = samples.spare_capacity_mut();
    let len = spare.len() * 4;
    // SAFETY: `len` bytes are the spare capacity of at least n / 4 float32s, viewed as bytes
    // (the same memory, a looser alignment, nothing read).
    let bytes = unsafe { std::slice::from_raw_parts_mut(spare.as_mut_ptr().cast::<std::mem::MaybeUninit<u8>>(), len) };
    let start = bytes.as_ptr() as usize;
    let written = simd.decode(b64.as_bytes(), base64_simd::Out::from_uninit_slice(bytes)).map_err(|_| invalid())?;
    // The decoder hands back the bytes it initialised: all `n` of them, from the start.
    if written.len() != n || written.as_ptr() as usize != start {
        return Err(invalid());
    }
    // SAFETY: the first `n` bytes, n / 4 float32s, are initialised (checked just above), and
    // every bit pattern is a float32.
    unsafe { samples.set_len(n / 4) };
    if cfg!(target_endian = "big") {
        for s in &mut samples {
            *s = f32::from_bits(u32::from_le(s.to_bits()));
        }
    }
    // Checked in blocks without an early exit (the compiler vectorises it); the position is
    // looked for only when there is one.
    if samples.chunks(1024).any(|block| block.iter().fold(false, |bad, s| bad | !s.is_finite())) {
        let i = samples.iter().position(|s| !s.is_finite()).expect("a block holds one");
        return Err(ProtocolError::InvalidPayload(format!("{field}: sample {i} is not a finite number")));
    }
    Ok(samples)
}

/// `part` (a string borrowed from `frame`'s parsed JSON) as a slice of the frame, without a copy;
/// `None` when it is not inside the frame (JSON escapes made the parser copy it).
pub fn slice_of(frame: &bytestring::ByteString, part: &str) -> Option<bytes::Bytes> {
    let whole = frame.as_bytes();
    let start = (part.as_ptr() as usize).checked_sub(whole.as_ptr() as usize)?;
    (start + part.len() <= whole.len()).then(|| whole.slice(start..start + part.len()))
}

pub use omni_actors::audio::pcm::{encode_pcm_f32, pcm_b64_len};

/// Decodes base64 (optionally a `data:` URL) into bytes.
pub fn decode_base64(b64: &str, field: &str) -> Result<Vec<u8>, ProtocolError> {
    let data = match b64.strip_prefix("data:") {
        Some(rest) => rest.split_once(";base64,").map(|(_, d)| d).ok_or_else(|| {
            ProtocolError::InvalidPayload(format!("{field}: a data URL must be base64 (data:...;base64,...)"))
        })?,
        None => b64,
    };
    STANDARD.decode(data).map_err(|e| ProtocolError::InvalidPayload(format!("{field}: not valid base64 ({e})")))
}

pub fn is_jpeg(bytes: &[u8]) -> bool {
    bytes.starts_with(&[0xFF, 0xD8, 0xFF])
}

pub fn is_png(bytes: &[u8]) -> bool {
    bytes.starts_with(b"\x89PNG\r\n\x1a\n")
}

/// The type of an encoded image (`image/jpeg`, `image/png`, `image/webp`, `image/gif`,
/// `image/bmp`), from its first bytes; anything else is refused. The bytes go to the backend
/// as they are: the type is in them.
pub fn image_type(bytes: &[u8], field: &str) -> Result<&'static str, ProtocolError> {
    const TYPES: [&str; 5] = ["image/jpeg", "image/png", "image/webp", "image/gif", "image/bmp"];
    infer::get(bytes)
        .map(|t| t.mime_type())
        .filter(|mime| TYPES.contains(mime))
        .ok_or_else(|| ProtocolError::InvalidPayload(format!("{field}: not a JPEG, PNG, WebP, GIF or BMP image")))
}

/// A base64 JPEG frame.
pub fn decode_jpeg(b64: &str, field: &str) -> Result<Vec<u8>, ProtocolError> {
    let bytes = decode_base64(b64, field)?;
    if !is_jpeg(&bytes) {
        return Err(ProtocolError::InvalidPayload(format!("{field}: not a JPEG image")));
    }
    Ok(bytes)
}

/// `max_slice_nums`: an integer from 1 to 9.
pub fn slice_nums(v: Option<i64>, field: &str) -> Result<Option<u32>, ProtocolError> {
    match v {
        None => Ok(None),
        Some(n @ 1..=9) => Ok(Some(n as u32)),
        Some(n) => Err(ProtocolError::InvalidPayload(format!("{field}: {n} is outside 1..9"))),
    }
}

/// Writes a JSON object field by field, so that a large string (base64 audio) is encoded
/// straight into the output.
pub struct JsonWriter {
    out: String,
    first: bool,
    /// Where the PCM field's base64 is, once written.
    voice: Option<std::ops::Range<usize>>,
}

impl JsonWriter {
    pub fn new(capacity: usize) -> JsonWriter {
        let mut out = String::with_capacity(capacity);
        out.push('{');
        JsonWriter { out, first: true, voice: None }
    }

    fn key(&mut self, key: &str) {
        if !self.first {
            self.out.push(',');
        }
        self.first = false;
        self.out.push('"');
        self.out.push_str(key);
        self.out.push_str("\":");
    }

    /// A field with any serializable value (keys are plain ASCII, not escaped).
    pub fn field(mut self, key: &str, value: impl Serialize) -> JsonWriter {
        self.key(key);
        // Serializing plain values into a String cannot fail.
        let _ = serde_json::to_writer(string_writer(&mut self.out), &value);
        self
    }

    /// A field whose value is the base64 of float32 PCM.
    pub fn pcm_field(mut self, key: &str, samples: &[f32]) -> JsonWriter {
        self.key(key);
        self.out.push('"');
        let start = self.out.len();
        encode_pcm_f32(samples, &mut self.out);
        self.voice = Some(start..self.out.len());
        self.out.push('"');
        self
    }

    pub fn finish(mut self) -> String {
        self.out.push('}');
        self.out
    }

    /// Finishes the object into `out`: as a frame carrying the model's voice (`samples` of it,
    /// at 24 kHz) when a PCM field was written, else as a plain frame.
    pub fn finish_into(mut self, out: &mut Outbox, samples: usize) {
        self.out.push('}');
        match self.voice {
            Some(voice) => out.push_voiced(self.out, voice, samples),
            None => out.push(self.out),
        }
    }
}

/// An io::Write into a String (serde_json writes UTF-8; each piece is checked).
fn string_writer(s: &mut String) -> impl std::io::Write + '_ {
    struct W<'a>(&'a mut String);
    impl std::io::Write for W<'_> {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            let text = std::str::from_utf8(buf).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
            self.0.push_str(text);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    W(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_string_borrowed_from_a_frame_is_sliced_without_a_copy_and_one_copied_is_not() {
        let frame = bytestring::ByteString::from(r#"{"audio":"QUJD"}"#);
        let borrowed = &frame[10..14];
        let slice = slice_of(&frame, borrowed).expect("inside the frame");
        assert_eq!(&slice[..], b"QUJD");
        assert_eq!(slice.as_ptr(), borrowed.as_ptr(), "the frame's own bytes");
        let copied = String::from("QUJD");
        assert_eq!(slice_of(&frame, &copied), None);
    }

    #[test]
    fn pcm_round_trips() {
        let samples: Vec<f32> = (0..4001).map(|i| (i as f32 * 0.01).sin()).collect();
        let mut b64 = String::new();
        encode_pcm_f32(&samples, &mut b64);
        assert_eq!(b64.len(), pcm_b64_len(samples.len()));
        assert_eq!(decode_pcm_f32(&b64, "audio").unwrap(), samples);
    }

    #[test]
    fn pcm_errors_name_the_field_and_the_reason() {
        let e = decode_pcm_f32("not base64!", "input.audio").unwrap_err();
        assert!(
            matches!(&e, ProtocolError::InvalidPayload(m) if m.starts_with("input.audio: not valid base64")),
            "{e}"
        );
        let e = decode_pcm_f32(&STANDARD.encode([0u8; 10]), "input.audio").unwrap_err();
        assert_eq!(e.to_string(), "input.audio: 10 bytes is not a whole number of float32 samples (a multiple of 4)");
        let e = decode_pcm_f32(&STANDARD.encode(f32::NAN.to_le_bytes()), "a").unwrap_err();
        assert_eq!(e.to_string(), "a: sample 0 is not a finite number");
        let mut samples = vec![0.5f32; 3000];
        samples[2500] = f32::INFINITY;
        let mut b64 = String::new();
        encode_pcm_f32(&samples, &mut b64);
        assert_eq!(decode_pcm_f32(&b64, "a").unwrap_err().to_string(), "a: sample 2500 is not a finite number");
        samples[2500] = -1.0;
        b64.clear();
        encode_pcm_f32(&samples, &mut b64);
        assert_eq!(decode_pcm_f32(&b64, "a").unwrap(), samples);
    }

    #[test]
    fn jpeg_and_data_urls() {
        let jpeg = [0xFF, 0xD8, 0xFF, 0xE0, 1, 2];
        let b64 = STANDARD.encode(jpeg);
        assert_eq!(decode_jpeg(&b64, "f").unwrap(), jpeg);
        assert_eq!(decode_jpeg(&format!("data:image/jpeg;base64,{b64}"), "f").unwrap(), jpeg);
        assert_eq!(decode_jpeg(&STANDARD.encode(b"GIF89a"), "f").unwrap_err().to_string(), "f: not a JPEG image");
    }

    #[test]
    fn a_frame_with_pcm_says_where_its_voice_is() {
        let mut out = Outbox::default();
        JsonWriter::new(64).field("type", "x").pcm_field("audio", &[0.5; 30]).field("n", 1).finish_into(&mut out, 30);
        JsonWriter::new(64).field("type", "y").finish_into(&mut out, 0);
        match out.items() {
            [omni_actors::edge::dialect::Emit::Voiced(v), omni_actors::edge::dialect::Emit::Text(t)] => {
                assert_eq!(v.quiet(), r#"{"type":"x","audio":"","n":1}"#);
                assert_eq!(v.text[v.voice.clone()].len(), omni_actors::audio::pcm::pcm_b64_len(30));
                assert_eq!((v.samples, t.as_str()), (30, r#"{"type":"y"}"#));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn json_writer_escapes_values_and_embeds_pcm() {
        let s =
            JsonWriter::new(64).field("type", "x").field("text", "a \"quoted\"\n").pcm_field("audio", &[1.0]).finish();
        let v: serde_json::Value = serde_json::from_str(&s).unwrap();
        assert_eq!(v["text"], "a \"quoted\"\n");
        assert_eq!(decode_pcm_f32(v["audio"].as_str().unwrap(), "a").unwrap(), vec![1.0]);
    }

    #[test]
    fn event_type_classifies_what_is_not_an_event() {
        assert_eq!(event_type(r#"{"type":"a"}"#).unwrap(), "a");
        // Python's json.dumps, and the type elsewhere
        assert!(matches!(event_type(" {\n \"type\" : \"a\", \"b\": 1}"), Ok(Cow::Borrowed("a"))));
        assert_eq!(leading_type(r#"{"type": "a", "audio": "AAAA"}"#), Some("a"));
        assert_eq!(leading_type(r#"{"audio": "AAAA", "type": "a"}"#), None);
        assert_eq!(event_type(r#"{"audio": "AAAA", "type": "a"}"#).unwrap(), "a");
        assert_eq!(leading_type(r#"{"type": "a\"b"}"#), None);
        assert_eq!(leading_type("\u{a0}{\"type\":\"a\"}"), None, "JSON's whitespace only");
        assert!(matches!(event_type("\u{a0}{\"type\":\"a\"}"), Err(DecodeError::Unparseable(_))));
        assert_eq!(event_type(r#"{"type": "a\u0062"}"#).unwrap(), "ab");
        // Found by the fuzzer: the 64-byte window of the fast path ending inside a character.
        let long = format!("{{\"type\":\"{}\u{10b9b}\"}}", "x".repeat(61));
        assert!(event_type(&long).is_ok());
        assert!(matches!(event_type("nope"), Err(DecodeError::Unparseable(_))));
        assert!(matches!(event_type("[1,2]"), Err(DecodeError::Unparseable(_))));
        assert!(matches!(event_type("{\"type\": 3}"), Err(DecodeError::Protocol(ProtocolError::InvalidPayload(_)))));
        assert!(matches!(event_type("{}"), Err(DecodeError::Protocol(ProtocolError::MissingField(_)))));
    }
}
