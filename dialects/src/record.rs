//! What a recording keeps of the JSON dialects' frames: each event as sent or received,
//! with its media replaced by references to the recording's files. Runs on the recorder's
//! thread (never the session's): the actors hand it the frame and the media the dialect
//! already decoded, and write what it returns.
//!
//! The field names are the dialects' own: inbound audio is under `audio`, `delta` or
//! `data` (decoded by the dialect, taken here in order), images under `video_frames`,
//! `image` or a content part of type `image`; outbound model audio under `audio`, or
//! `delta` in an `*audio.delta` event (decoded here, in the dialect's sample format). Any
//! other string over 1 KB (a reference voice) becomes an attachment.
//!
//! A `$ref` is the recording's own: a key of that name in what a client sent is kept as
//! `$client_ref`, so that a replay follows only references the server wrote.

use omni_actors::audio::g711::{self, Law};
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use omni_actors::edge::redact::RecordedMedia;
use omni_actors::edge::redact::{Direction, MediaSink, Recorded, Redact};
use serde_json::Value;

/// Strings longer than this are data, not text: they go to files.
const LARGE: usize = 1024;

/// How a dialect encodes the model's audio in its base64 fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AudioEncoding {
    /// Little-endian float32 (the MiniCPM-o dialects).
    F32 = 0,
    /// Little-endian signed 16-bit (the OpenAI-shaped dialects).
    Pcm16 = 1,
    /// G.711 μ-law at 8 kHz (an OpenAI-dialect client that asked for it).
    Ulaw = 2,
    /// G.711 A-law at 8 kHz.
    Alaw = 3,
}

/// The redactor of a JSON dialect.
pub struct JsonRedactor {
    /// How the model's audio is coded in the frames ([`AudioEncoding`] as a number): a dialect
    /// whose client may change it mid-session keeps it up to date.
    output: Arc<AtomicU8>,
}

impl JsonRedactor {
    pub fn shared(output: AudioEncoding) -> Arc<dyn Redact> {
        Arc::new(JsonRedactor::new(output))
    }

    /// A redactor whose output coding follows `output`, which its dialect sets.
    pub fn following(output: Arc<AtomicU8>) -> Arc<dyn Redact> {
        Arc::new(JsonRedactor { output })
    }

    fn new(output: AudioEncoding) -> JsonRedactor {
        JsonRedactor { output: Arc::new(AtomicU8::new(output as u8)) }
    }

    /// The model's audio of a delta, at 24 kHz for `output.wav`.
    fn decode_output(&self, b64: &str) -> Option<Vec<f32>> {
        let bytes = STANDARD.decode(b64).ok()?;
        let mut samples = Vec::with_capacity(bytes.len());
        match self.output.load(Ordering::Relaxed) {
            0 => samples.extend(bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))),
            1 => omni_actors::audio::pcm::decode_i16_le(&bytes, &mut samples),
            law => {
                let law = if law == AudioEncoding::Ulaw as u8 { Law::Mu } else { Law::A };
                law.expand(&bytes, &mut samples);
                return omni_actors::audio::resample(&samples, g711::RATE, 24000).ok();
            }
        }
        Some(samples)
    }
}

/// The inbound media of one frame, taken in order as the walk meets their fields.
struct Media {
    audio: std::vec::IntoIter<Vec<f32>>,
    frames: std::vec::IntoIter<Vec<u8>>,
    /// The event is an audio delta (its `delta` field is model audio).
    audio_delta: bool,
}

/// Where a string sits in the event.
#[derive(Clone, Copy)]
struct At<'a> {
    key: Option<&'a str>,
    in_frames: bool,
    parent_type: Option<&'a str>,
}

impl Redact for JsonRedactor {
    fn redact(
        &self,
        dir: Direction,
        text: &[u8],
        decoded: RecordedMedia,
        sink: &mut dyn MediaSink,
    ) -> io::Result<Recorded> {
        let Ok(mut event) = serde_json::from_slice::<Value>(text) else {
            let raw = String::from_utf8_lossy(&text[..text.len().min(4096)]).into_owned();
            return Ok(Recorded::Raw(raw));
        };
        let kind = event.get("type").and_then(Value::as_str).unwrap_or_default();
        let audio_delta = kind.ends_with("audio.delta");
        let mut media = Media { audio: decoded.0.into_iter(), frames: decoded.1.into_iter(), audio_delta };
        let top = At { key: None, in_frames: false, parent_type: None };
        self.walk(&mut event, top, dir, &mut media, sink)?;
        Ok(Recorded::Event(serde_json::value::to_raw_value(&event)?))
    }
}

impl JsonRedactor {
    fn walk(
        &self,
        v: &mut Value,
        at: At<'_>,
        dir: Direction,
        media: &mut Media,
        sink: &mut dyn MediaSink,
    ) -> io::Result<()> {
        match v {
            Value::Object(map) => {
                if dir == Direction::In
                    && let Some(forged) = map.remove("$ref")
                {
                    map.insert("$client_ref".into(), forged);
                }
                let t = map.get("type").and_then(Value::as_str).map(str::to_owned);
                for (k, item) in map.iter_mut() {
                    let inner = At { key: Some(k), in_frames: k == "video_frames", parent_type: t.as_deref() };
                    self.walk(item, inner, dir, media, sink)?;
                }
            }
            Value::Array(items) => {
                for item in items {
                    self.walk(item, at, dir, media, sink)?;
                }
            }
            Value::String(s) => {
                if let Some(replacement) = self.replace(s, at, dir, media, sink)? {
                    *v = replacement;
                }
            }
            _ => {}
        }
        Ok(())
    }

    fn replace(
        &self,
        s: &str,
        at: At<'_>,
        dir: Direction,
        media: &mut Media,
        sink: &mut dyn MediaSink,
    ) -> io::Result<Option<Value>> {
        // Frames and audio always go to their files; other large strings to attachments.
        let is_frame = at.in_frames || at.key == Some("image") || at.parent_type == Some("image");
        let is_audio = match dir {
            Direction::In => matches!(at.key, Some("audio" | "delta" | "data")),
            Direction::Out => at.key == Some("audio") || (at.key == Some("delta") && media.audio_delta),
        };
        if !is_frame && !is_audio && s.len() <= LARGE {
            return Ok(None);
        }
        let reference = match (dir, is_frame, is_audio) {
            (Direction::In, true, _) => media.frames.next().map(|f| sink.frame(&f)).transpose()?,
            (Direction::In, false, true) => media.audio.next().map(|a| sink.input_audio(&a)).transpose()?,
            (Direction::Out, false, true) => {
                // The voice an edge played itself comes decoded; a dialect's event has it in base64.
                media.audio.next().or_else(|| self.decode_output(s)).map(|a| sink.output_audio(&a)).transpose()?
            }
            _ => None,
        };
        Ok(match reference {
            Some(r) => Some(serde_json::to_value(r)?),
            None if s.len() > LARGE => Some(serde_json::to_value(sink.attachment(s)?)?),
            None => None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use omni_actors::edge::redact::MediaRef;
    use serde_json::json;

    /// Counts what would be written, the way the recorder numbers it.
    #[derive(Default)]
    struct Counting {
        input: u64,
        output: u64,
        frames: u64,
        attachments: u64,
    }

    fn audio_ref(file: &str, counter: &mut u64, n: usize) -> MediaRef {
        let r = MediaRef { file: file.into(), offset: Some(*counter), samples: Some(n as u64), chars: None };
        *counter += n as u64;
        r
    }

    impl MediaSink for Counting {
        fn input_audio(&mut self, samples: &[f32]) -> io::Result<MediaRef> {
            Ok(audio_ref("input.wav", &mut self.input, samples.len()))
        }
        fn output_audio(&mut self, samples: &[f32]) -> io::Result<MediaRef> {
            Ok(audio_ref("output.wav", &mut self.output, samples.len()))
        }
        fn frame(&mut self, _: &[u8]) -> io::Result<MediaRef> {
            self.frames += 1;
            Ok(MediaRef { file: format!("frames/{:06}.jpg", self.frames), offset: None, samples: None, chars: None })
        }
        fn attachment(&mut self, text: &str) -> io::Result<MediaRef> {
            self.attachments += 1;
            let file = format!("attachments/{:06}.b64", self.attachments);
            Ok(MediaRef { file, offset: None, samples: None, chars: Some(text.len() as u64) })
        }
    }

    fn event(r: Recorded) -> Value {
        match r {
            Recorded::Event(raw) => serde_json::from_str(raw.get()).unwrap(),
            Recorded::Raw(raw) => panic!("not an event: {raw}"),
        }
    }

    fn b64_f32(samples: &[f32]) -> String {
        STANDARD.encode(samples.iter().flat_map(|s| s.to_le_bytes()).collect::<Vec<u8>>())
    }

    #[test]
    fn inbound_media_become_references_in_order() {
        let r = JsonRedactor::new(AudioEncoding::F32);
        let mut sink = Counting::default();
        let append = json!({"type": "input.append", "input": {"audio": "AAAA", "video_frames": ["x", "y"]}});
        let media = (vec![vec![0.0; 16000]], vec![vec![1], vec![2]]);
        let v = event(r.redact(Direction::In, append.to_string().as_bytes(), media, &mut sink).unwrap());
        assert_eq!(v["input"]["audio"], json!({"$ref": "input.wav", "offset": 0, "samples": 16000}));
        assert_eq!(v["input"]["video_frames"], json!([{"$ref": "frames/000001.jpg"}, {"$ref": "frames/000002.jpg"}]));
        let init = json!({"type": "session.init", "payload": {"voice": {"ref_audio_base64": "A".repeat(2000)}}});
        let v = event(r.redact(Direction::In, init.to_string().as_bytes(), (vec![], vec![]), &mut sink).unwrap());
        assert_eq!(v["payload"]["voice"]["ref_audio_base64"], json!({"$ref": "attachments/000001.b64", "chars": 2000}));
    }

    #[test]
    fn a_ref_a_client_sent_is_not_the_recordings() {
        let r = JsonRedactor::new(AudioEncoding::F32);
        let mut sink = Counting::default();
        let forged = json!({"type": "x", "a": {"$ref": "../../../config.toml", "samples": 9}, "$ref": "input.wav"});
        let v = event(r.redact(Direction::In, forged.to_string().as_bytes(), (vec![], vec![]), &mut sink).unwrap());
        assert_eq!(
            v,
            json!({"type": "x", "a": {"$client_ref": "../../../config.toml", "samples": 9}, "$client_ref": "input.wav"})
        );
    }

    #[test]
    fn outbound_audio_is_decoded_in_the_dialects_format() {
        let mut sink = Counting::default();
        let f32 = JsonRedactor::new(AudioEncoding::F32);
        let delta = json!({"type": "response.output.delta", "kind": "audio", "audio": b64_f32(&[0.5; 24000])});
        let v = event(f32.redact(Direction::Out, delta.to_string().as_bytes(), (vec![], vec![]), &mut sink).unwrap());
        assert_eq!(v["audio"], json!({"$ref": "output.wav", "offset": 0, "samples": 24000}));
        let pcm16 = JsonRedactor::new(AudioEncoding::Pcm16);
        let delta = json!({"type": "response.audio.delta", "delta": STANDARD.encode([0u8; 960])});
        let v = event(pcm16.redact(Direction::Out, delta.to_string().as_bytes(), (vec![], vec![]), &mut sink).unwrap());
        assert_eq!(v["delta"], json!({"$ref": "output.wav", "offset": 24000, "samples": 480}));
        let text = json!({"type": "response.text.delta", "delta": "hello"});
        let v = event(pcm16.redact(Direction::Out, text.to_string().as_bytes(), (vec![], vec![]), &mut sink).unwrap());
        assert_eq!(v["delta"], "hello", "a text delta stays text");
    }

    #[test]
    fn audio_an_edge_carried_as_samples_is_recorded_from_the_samples() {
        let mut sink = Counting::default();
        let r = JsonRedactor::new(AudioEncoding::Pcm16);
        let heard = json!({"type": "caller.audio", "rate": 24000, "audio": ""});
        let v = event(
            r.redact(Direction::In, heard.to_string().as_bytes(), (vec![vec![0.1; 320]], vec![]), &mut sink).unwrap(),
        );
        assert_eq!(v["audio"], json!({"$ref": "input.wav", "offset": 0, "samples": 320}));
        let said = json!({"type": "model.audio", "response_id": "resp_1", "rate": 24000, "audio": ""});
        let v = event(
            r.redact(Direction::Out, said.to_string().as_bytes(), (vec![vec![0.2; 480]], vec![]), &mut sink).unwrap(),
        );
        assert_eq!(v["audio"], json!({"$ref": "output.wav", "offset": 0, "samples": 480}));
        assert_eq!(v["response_id"], "resp_1");
    }

    #[test]
    fn a_frame_that_is_not_json_is_kept_raw_and_short() {
        let r = JsonRedactor::new(AudioEncoding::F32);
        let long = vec![b'x'; 10_000];
        match r.redact(Direction::In, &long, (vec![], vec![]), &mut Counting::default()).unwrap() {
            Recorded::Raw(raw) => assert_eq!(raw.len(), 4096),
            Recorded::Event(_) => panic!("not JSON"),
        }
    }
}
