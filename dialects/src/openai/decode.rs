//! Client events of the OpenAI-shaped dialects, from their JSON into the driver's typed
//! [`Command`]s: every field checked, every refusal naming its field. A payload that would
//! make the session hold more than its bound (audio, items, images) is refused before it is
//! decoded ([`Driver::admit`]).

use std::borrow::Cow;

use omni_actors::domain::{ChatMessage, Role, Tools};
use omni_actors::protocol::ProtocolError;
use serde_json::Value;

use super::conf::{self, invalid, modalities};
use super::{Flavor, coding};
use crate::conversation::items::{ItemBody, Part, Place, TextKind};
use crate::conversation::{Command, Driver, NewItem, ResponseRequest};
use crate::wire;

/// What one client event asks.
pub(super) enum Decoded {
    Command(Command),
    /// `session.finish` (Qwen): the session ends.
    Finish,
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
        "conversation.item.create" => {
            let item = v.get("item").ok_or_else(|| ProtocolError::MissingField("item is required".into()))?;
            let place = match v.get("previous_item_id") {
                None | Some(Value::Null) => Place::End,
                Some(Value::String(id)) if id == "root" => Place::Root,
                Some(Value::String(id)) => Place::After(id.clone()),
                Some(_) => return Err(invalid("previous_item_id", "must be a string")),
            };
            Command::CreateItem(Box::new(new_item(item, place, driver, "item")?))
        }
        "conversation.item.retrieve" => Command::Retrieve { item_id: field_str(v, "item_id")?.to_string() },
        "conversation.item.delete" => Command::Delete { item_id: field_str(v, "item_id")?.to_string() },
        "conversation.item.truncate" => {
            let item_id = field_str(v, "item_id")?.to_string();
            let content_index = match v.get("content_index") {
                None | Some(Value::Null) => 0,
                Some(n) => n
                    .as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .ok_or_else(|| invalid("content_index", "must be a whole number"))?,
            };
            let audio_end_ms = match v.get("audio_end_ms") {
                None | Some(Value::Null) => return Err(ProtocolError::MissingField("audio_end_ms is required".into())),
                Some(n) => {
                    n.as_u64().ok_or_else(|| invalid("audio_end_ms", "must be a whole number of milliseconds"))?
                }
            };
            Command::Truncate { item_id, content_index, audio_end_ms }
        }
        "response.create" => Command::CreateResponse(Box::new(response(v, driver, flavor)?)),
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
    let (rate, coding) = (driver.conf().input_rate, driver.conf().input_coding);
    if driver.conf().vad.is_none() {
        // About 16000 / rate samples of 4 bytes per sample sent (2 bytes of pcm16, 1 of G.711).
        let estimate = b64.len() / 4 * 3 / coding::sample_bytes(coding) * 16000 / rate as usize * 4;
        driver.admit("input_audio_buffer.append", "audio_buffer", estimate)?;
    }
    Ok(Command::Audio { samples: coding::decode(coding, b64, "audio")?, rate })
}

fn image(v: &Value, driver: &Driver) -> Result<Command, ProtocolError> {
    driver.image_allowed()?;
    let b64 = field_str(v, "image")?;
    driver.admit("input_image_buffer.append", "images", b64.len() / 4 * 3)?;
    Ok(Command::Image(wire::decode_jpeg(b64, "image")?))
}

/// The bytes an item's content will take once decoded (audio at the input rate becomes
/// 16 kHz float32), from the lengths of its base64 fields.
fn estimate_item(item: &Value, input_rate: u32, sample_bytes: usize) -> usize {
    let parts = item.get("content").and_then(Value::as_array).into_iter().flatten();
    parts
        .map(|part| {
            let b64 = |k: &str| part.get(k).and_then(Value::as_str).map_or(0, str::len);
            let decoded = |n: usize| n / 4 * 3;
            let audio_samples = decoded(b64("audio")) / sample_bytes * 16000 / input_rate as usize;
            audio_samples * 4 + decoded(b64("image_url").max(b64("image"))) + b64("text")
        })
        .sum()
}

/// An item a client wrote (`conversation.item.create`, or a response's own `input`): a
/// message, a function call, or what a tool gave back.
fn new_item(item: &Value, place: Place, driver: &Driver, at: &str) -> Result<NewItem, ProtocolError> {
    if !item.is_object() {
        return Err(invalid(at, "must be an object"));
    }
    let id = match item.get("id") {
        None | Some(Value::Null) => None,
        Some(Value::String(id)) if (1..=64).contains(&id.len()) => Some(id.clone()),
        Some(_) => return Err(invalid(&format!("{at}.id"), "a string of 1 to 64 characters")),
    };
    let text_of = |key: &str| -> Result<String, ProtocolError> {
        match item.get(key) {
            Some(Value::String(s)) => Ok(s.clone()),
            None | Some(Value::Null) => Err(ProtocolError::MissingField(format!("{at}.{key} is required"))),
            Some(_) => Err(invalid(&format!("{at}.{key}"), "must be a string")),
        }
    };
    match item.get("type").and_then(Value::as_str).unwrap_or("message") {
        "message" => {}
        "function_call_output" => {
            let (call_id, output) = (text_of("call_id")?, text_of("output")?);
            driver.admit("conversation.item.create", "items", output.len())?;
            let name = driver.tool_of(&call_id);
            let message = ChatMessage::tool_result(call_id.as_str(), name, output.as_str());
            return Ok(NewItem { id, place, message, body: ItemBody::FunctionCallOutput { call_id, output } });
        }
        "function_call" => {
            let (call_id, name, arguments) = (text_of("call_id")?, text_of("name")?, text_of("arguments")?);
            driver.admit("conversation.item.create", "items", arguments.len())?;
            let message = ChatMessage::tool_call(call_id.as_str(), name.as_str(), arguments.as_str());
            return Ok(NewItem { id, place, message, body: ItemBody::FunctionCall { call_id, name, arguments } });
        }
        other => {
            return Err(invalid(
                &format!("{at}.type"),
                format!("'{other}' is not supported (message, function_call, function_call_output)"),
            ));
        }
    }
    let role: Role = field_str(item, "role")
        .map_err(|_| ProtocolError::MissingField(format!("{at}.role is required")))?
        .parse()
        .map_err(|e| invalid(&format!("{at}.role"), e))?;
    let (input_rate, input_coding) = (driver.conf().input_rate, driver.conf().input_coding);
    // What the item will hold, from the sizes of its fields: refused before any of it is
    // decoded or resampled.
    let estimate = estimate_item(item, input_rate, coding::sample_bytes(input_coding));
    driver.admit("conversation.item.create", "items", estimate)?;
    let mut message = ChatMessage::text(role, "");
    let mut parts = Vec::new();
    for (i, part) in item.get("content").and_then(Value::as_array).into_iter().flatten().enumerate() {
        let at = format!("{at}.content[{i}]");
        let kind = part.get("type").and_then(Value::as_str);
        match kind {
            Some(t @ ("input_text" | "text" | "output_text")) => {
                let text = part
                    .get("text")
                    .and_then(Value::as_str)
                    .ok_or_else(|| ProtocolError::MissingField(format!("{at}.text is required")))?;
                if !message.text.is_empty() {
                    message.text.push('\n');
                }
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
                let pcm = coding::decode(input_coding, b64, &format!("{at}.audio"))?;
                let audio = omni_actors::audio::resample(&pcm, input_rate, 16000).map_err(|e| invalid(&at, e))?;
                let audio_ms = audio.len() as u64 / 16;
                message.audios.push(audio);
                let transcript = part.get("transcript").and_then(Value::as_str).map(String::from);
                parts.push(Part::InputAudio { transcript, audio_ms });
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
    Ok(NewItem { id, place, message, body: ItemBody::Message { role, parts } })
}

/// `response.create`'s `response`: what this response does differently from the session.
fn response(v: &Value, driver: &Driver, flavor: Flavor) -> Result<ResponseRequest, ProtocolError> {
    let r = match v.get("response") {
        None | Some(Value::Null) => return Ok(ResponseRequest::default()),
        Some(r @ Value::Object(_)) => r,
        Some(_) => return Err(invalid("response", "must be an object")),
    };
    let audio = match r.get("modalities").or_else(|| r.get("output_modalities")) {
        Some(m) => Some(modalities(m, "response.output_modalities", flavor)?),
        None => None,
    };
    let instructions = match r.get("instructions") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => return Err(invalid("response.instructions", "must be a string or null")),
    };
    let session = &driver.conf().tools;
    let tools = match (r.get("tools"), r.get("tool_choice")) {
        (None, None) => None,
        (t, c) => {
            let functions = match t {
                Some(t) => conf::tools(t, "response.tools")?,
                None => session.functions.clone(),
            };
            let choice = match c {
                Some(c) => conf::tool_choice(c, "response.tool_choice")?,
                None => session.choice.clone(),
            };
            let tools = Tools { functions, choice };
            conf::check_choice(&tools, "response.tool_choice")?;
            Some(tools)
        }
    };
    let mut max_tokens = None;
    for key in ["max_output_tokens", "max_response_output_tokens"] {
        if let Some(m) = r.get(key) {
            max_tokens = Some(conf::max_tokens(m, &format!("response.{key}"))?);
        }
    }
    let metadata = match r.get("metadata") {
        None | Some(Value::Null) => None,
        Some(Value::Object(m)) if m.len() <= 16 => Some(
            m.iter()
                .map(|(k, v)| match v {
                    Value::String(s) if k.len() <= 64 && s.len() <= 512 => Ok((k.clone(), s.clone())),
                    _ => Err(invalid(
                        &format!("response.metadata.{k}"),
                        "keys of at most 64 characters, string values of at most 512",
                    )),
                })
                .collect::<Result<Vec<_>, _>>()?,
        ),
        Some(_) => return Err(invalid("response.metadata", "an object of at most 16 string values")),
    };
    let out_of_band = match r.get("conversation") {
        None | Some(Value::Null) => false,
        Some(Value::String(c)) if c == "auto" => false,
        Some(Value::String(c)) if c == "none" => true,
        Some(_) => return Err(invalid("response.conversation", "must be auto or none")),
    };
    let input = match r.get("input") {
        None | Some(Value::Null) => None,
        Some(Value::Array(items)) => Some(
            items
                .iter()
                .enumerate()
                .map(|(i, item)| input_item(item, driver, &format!("response.input[{i}]")))
                .collect::<Result<Vec<_>, _>>()?,
        ),
        Some(_) => return Err(invalid("response.input", "must be a list of items")),
    };
    Ok(ResponseRequest { audio, instructions, tools, max_tokens, metadata, out_of_band, input })
}

/// One item of a response's own input: an item written out, or a reference to one of the
/// conversation's (`{type: "item_reference", id}`).
fn input_item(item: &Value, driver: &Driver, at: &str) -> Result<NewItem, ProtocolError> {
    if item.get("type").and_then(Value::as_str) != Some("item_reference") {
        return new_item(item, Place::End, driver, at);
    }
    let id = field_str(item, "id").map_err(|_| ProtocolError::MissingField(format!("{at}.id is required")))?;
    driver.referenced(id).ok_or_else(|| invalid(&format!("{at}.id"), format!("no item '{id}' in the conversation")))
}
