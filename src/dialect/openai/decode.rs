//! Client events of the OpenAI-shaped dialects, from their JSON into the driver's typed
//! [`Command`]s: every field checked, every refusal naming its field. A payload that would
//! make the session hold more than its bound (audio, items, images) is refused before it is
//! decoded ([`Driver::admit`]).

use std::borrow::Cow;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use omni_actors::domain::{ChatMessage, Role};
use omni_actors::protocol::ProtocolError;
use serde_json::Value;

use super::Flavor;
use super::conf::{self, invalid, modalities};
use crate::dialect::conversation::items::{Part, TextKind};
use crate::dialect::conversation::{Command, Driver, NewItem, ResponseRequest};
use crate::dialect::wire;

/// What one client event asks.
pub(super) enum Decoded {
    Command(Command),
    /// `session.finish` (Qwen): the session ends.
    Finish,
}

/// pcm16 little-endian base64 into float32 samples.
pub(super) fn decode_pcm16(b64: &str, param: &str) -> Result<Vec<f32>, ProtocolError> {
    let bytes = STANDARD.decode(b64).map_err(|e| invalid(param, format!("not valid base64 ({e})")))?;
    if bytes.len() % 2 != 0 {
        return Err(invalid(param, format!("{} bytes is not a whole number of 16-bit samples", bytes.len())));
    }
    Ok(bytes.chunks_exact(2).map(|c| i16::from_le_bytes([c[0], c[1]]) as f32 / 32768.0).collect())
}

fn field_str<'a>(v: &'a Value, key: &str) -> Result<&'a str, ProtocolError> {
    match v.get(key) {
        None | Some(Value::Null) => Err(ProtocolError::MissingField(format!("{key} is required"))),
        Some(Value::String(s)) => Ok(s),
        Some(_) => Err(invalid(key, "must be a string")),
    }
}

/// The command of one client event of type `kind`. `carries_audio`: the session's edge carries
/// the audio itself (its formats are the edge's, and no event may carry audio).
pub(super) fn command(
    kind: &str,
    v: &Value,
    driver: &Driver,
    flavor: Flavor,
    carries_audio: bool,
) -> Result<Decoded, ProtocolError> {
    let command = match kind {
        "session.update" => {
            let session = v.get("session").ok_or_else(|| ProtocolError::MissingField("session is required".into()))?;
            let session =
                if carries_audio { Cow::Owned(conf::without_formats(session)) } else { Cow::Borrowed(session) };
            Command::Update(Box::new(conf::apply(driver.conf(), &session, flavor)?))
        }
        "input_audio_buffer.append" => append(v, driver, carries_audio)?,
        "input_audio_buffer.commit" => Command::Commit,
        "input_audio_buffer.clear" => Command::Clear,
        "input_image_buffer.append" => image(v, driver)?,
        "conversation.item.create" => create_item(v, driver)?,
        "response.create" => response(v, flavor)?,
        "response.cancel" => Command::Cancel,
        "session.finish" => return Ok(Decoded::Finish),
        other => return Err(ProtocolError::UnknownEvent(format!("unknown event type '{other}'"))),
    };
    Ok(Decoded::Command(command))
}

fn append(v: &Value, driver: &Driver, carries_audio: bool) -> Result<Command, ProtocolError> {
    if carries_audio {
        return Err(invalid(
            "input_audio_buffer.append",
            "this session's audio travels on its call's own track, not in events",
        ));
    }
    let b64 = field_str(v, "audio")?;
    let rate = driver.conf().input_rate;
    if driver.conf().vad.is_none() {
        // About 16000 / rate samples of 4 bytes per 2 bytes of pcm16 sent.
        let estimate = b64.len() / 4 * 3 / 2 * 16000 / rate as usize * 4;
        driver.admit("input_audio_buffer.append", "audio_buffer", estimate)?;
    }
    Ok(Command::Audio { samples: decode_pcm16(b64, "audio")?, rate })
}

fn image(v: &Value, driver: &Driver) -> Result<Command, ProtocolError> {
    driver.image_allowed()?;
    let b64 = field_str(v, "image")?;
    driver.admit("input_image_buffer.append", "images", b64.len() / 4 * 3)?;
    Ok(Command::Image(wire::decode_jpeg(b64, "image")?))
}

/// The bytes an item's content will take once decoded (pcm16 at the input rate becomes
/// 16 kHz float32), from the lengths of its base64 fields.
fn estimate_item(item: &Value, input_rate: u32) -> usize {
    let parts = item.get("content").and_then(Value::as_array).into_iter().flatten();
    parts
        .map(|part| {
            let b64 = |k: &str| part.get(k).and_then(Value::as_str).map_or(0, str::len);
            let decoded = |n: usize| n / 4 * 3;
            let audio_samples = decoded(b64("audio")) / 2 * 16000 / input_rate as usize;
            audio_samples * 4 + decoded(b64("image_url").max(b64("image"))) + b64("text")
        })
        .sum()
}

fn create_item(v: &Value, driver: &Driver) -> Result<Command, ProtocolError> {
    let item = v.get("item").ok_or_else(|| ProtocolError::MissingField("item is required".into()))?;
    if item.get("type").and_then(Value::as_str).unwrap_or("message") != "message" {
        return Err(invalid("item.type", "only message items are supported"));
    }
    let role: Role = field_str(item, "role")
        .map_err(|_| ProtocolError::MissingField("item.role is required".into()))?
        .parse()
        .map_err(|e| invalid("item.role", e))?;
    let input_rate = driver.conf().input_rate;
    // What the item will hold, from the sizes of its fields: refused before any of it is
    // decoded or resampled.
    driver.admit("conversation.item.create", "items", estimate_item(item, input_rate))?;
    let mut message = ChatMessage::text(role, "");
    let mut parts = Vec::new();
    for (i, part) in item.get("content").and_then(Value::as_array).into_iter().flatten().enumerate() {
        let at = format!("item.content[{i}]");
        let kind = part.get("type").and_then(Value::as_str);
        match kind {
            Some(t @ ("input_text" | "text" | "output_text")) => {
                let text = part
                    .get("text")
                    .and_then(Value::as_str)
                    .ok_or_else(|| ProtocolError::MissingField(format!("{at}.text is required")))?;
                message.text.push_str(text);
                let kind = match t {
                    "input_text" => TextKind::InputText,
                    "text" => TextKind::Text,
                    _ => TextKind::OutputText,
                };
                parts.push(Part::Text { kind, text: text.to_string() });
            }
            Some("input_audio") => {
                let b64 = part
                    .get("audio")
                    .and_then(Value::as_str)
                    .ok_or_else(|| ProtocolError::MissingField(format!("{at}.audio is required")))?;
                let pcm = decode_pcm16(b64, &format!("{at}.audio"))?;
                let audio = omni_actors::audio::resample(&pcm, input_rate, 16000).map_err(|e| invalid(&at, e))?;
                message.audios.push(audio);
                let transcript = part.get("transcript").and_then(Value::as_str).map(String::from);
                parts.push(Part::InputAudio { transcript });
            }
            Some("input_image") => {
                let b64 = part
                    .get("image_url")
                    .or_else(|| part.get("image"))
                    .and_then(Value::as_str)
                    .ok_or_else(|| ProtocolError::MissingField(format!("{at}.image_url is required")))?;
                message.images.push(wire::decode_jpeg(b64, &format!("{at}.image_url"))?);
                parts.push(Part::InputImage);
            }
            other => {
                return Err(invalid(
                    &format!("{at}.type"),
                    format!("{other:?} is not supported (input_text, input_audio, input_image)"),
                ));
            }
        }
    }
    let id = item.get("id").and_then(Value::as_str).map(String::from);
    Ok(Command::CreateItem(NewItem { id, message, parts }))
}

fn response(v: &Value, flavor: Flavor) -> Result<Command, ProtocolError> {
    let r = v.get("response").unwrap_or(&Value::Null);
    let audio = match r.get("modalities").or_else(|| r.get("output_modalities")) {
        Some(m) => Some(modalities(m, "response.modalities", flavor)?),
        None => None,
    };
    let instructions = r.get("instructions").and_then(Value::as_str).map(String::from);
    Ok(Command::CreateResponse(ResponseRequest { audio, instructions }))
}
