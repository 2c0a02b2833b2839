//! What clients send in the OpenAI-shaped dialects: audio appended (gathered into duplex
//! steps with server VAD, or buffered until a commit), items, images, responses asked for
//! and cancelled.

use std::time::Instant;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use omni_actors::domain::{ChatMessage, Generation, Role, TurnInput};
use omni_actors::edge::dialect::Outbox;
use omni_actors::protocol::{Inbound, ProtocolError};
use omni_actors::session::messages::ModelAudio;
use serde_json::{Value, json};

use omni_actors::observe::metrics::metrics;

use super::conf::{invalid, modalities};
use super::held::Weigh;
use super::{Phase, Realtime, Turn, UserTurn};
use crate::dialect::wire;
use omni_actors::audio::StreamResampler;
use omni_actors::edge::vad::Edge;

/// pcm16 little-endian base64 into float32 samples.
pub(super) fn decode_pcm16(b64: &str, param: &str) -> Result<Vec<f32>, ProtocolError> {
    let bytes = STANDARD.decode(b64).map_err(|e| invalid(param, format!("not valid base64 ({e})")))?;
    if bytes.len() % 2 != 0 {
        return Err(invalid(param, format!("{} bytes is not a whole number of 16-bit samples", bytes.len())));
    }
    Ok(bytes.chunks_exact(2).map(|c| i16::from_le_bytes([c[0], c[1]]) as f32 / 32768.0).collect())
}

pub(super) fn encode_pcm16(samples: &[f32]) -> String {
    let bytes: Vec<u8> =
        samples.iter().flat_map(|s| ((s.clamp(-1.0, 1.0) * 32767.0).round() as i16).to_le_bytes()).collect();
    STANDARD.encode(bytes)
}

fn field_str<'a>(v: &'a Value, key: &str) -> Result<&'a str, ProtocolError> {
    match v.get(key) {
        None | Some(Value::Null) => Err(ProtocolError::MissingField(format!("{key} is required"))),
        Some(Value::String(s)) => Ok(s),
        Some(_) => Err(invalid(key, "must be a string")),
    }
}

impl Realtime {
    pub(super) fn update(&mut self, v: &Value, out: &mut Outbox) -> Result<(), ProtocolError> {
        let session = v.get("session").ok_or_else(|| ProtocolError::MissingField("session is required".into()))?;
        if self.carries_audio {
            // The edge carries the audio in formats of its own (a call's Opus): the session's
            // formats are not the client's to set.
            self.conf.apply(&without_formats(session))?;
        } else {
            self.conf.apply(session)?;
            self.follow_input_rate()?;
        }
        if self.phase != Phase::Active {
            self.update_pending = true;
        } else if !self.reconfigure_if_changed(true) {
            // Nothing the backend holds changed: confirmed now (else once the backend took it).
            let body = json!({"session": self.session_object()});
            self.reply(out, "session.updated", body);
            self.report_unsupported(out);
        }
        Ok(())
    }

    /// The resampler follows the input format.
    pub(super) fn follow_input_rate(&mut self) -> Result<(), ProtocolError> {
        self.follow_rate(self.conf.input_rate, "session")
    }

    /// The resampler takes audio at `rate` from now on.
    fn follow_rate(&mut self, rate: u32, param: &str) -> Result<(), ProtocolError> {
        if rate != self.resampler_rate {
            self.resampler = StreamResampler::new(rate, 16000).map_err(|e| invalid(param, e))?;
            self.resampler_rate = rate;
        }
        Ok(())
    }

    /// The backend follows the configuration (mode, instructions, voice...): when it changed,
    /// a reconfigure goes out; `announce` owes the client a `session.updated` once it took.
    pub(super) fn reconfigure_if_changed(&mut self, announce: bool) -> bool {
        let setup = self.conf.setup();
        if self.prepared.as_ref() == Some(&setup) {
            return false;
        }
        self.prepared = Some(setup.clone());
        self.response = None;
        self.step.clear();
        self.reconfigures.push_back((announce, self.conf.clone()));
        self.commands.push(Inbound::Reconfigure(setup));
        true
    }

    /// The backend refused the oldest reconfigure; the session asks it again for the settings
    /// it had, unless a newer reconfigure is on its way. The client hears the error (the
    /// session's), no `session.updated`, and the configuration in force is the previous one.
    pub(super) fn reconfigure_refused(&mut self) {
        self.reconfigures.pop_front();
        if !self.reconfigures.is_empty() {
            return;
        }
        self.conf = self.in_force.clone();
        self.prepared = Some(self.conf.setup());
        if self.follow_input_rate().is_err() {
            log::warn!("openai dialect: the previous input format has no resampler");
        }
        // The session's restore answers like any reconfigure.
        self.reconfigures.push_back((false, self.conf.clone()));
    }

    pub(super) fn append(&mut self, v: &Value, now: Instant, out: &mut Outbox) -> Result<(), ProtocolError> {
        if self.carries_audio {
            return Err(invalid(
                "input_audio_buffer.append",
                "this session's audio travels on its call's own track, not in events",
            ));
        }
        let b64 = field_str(v, "audio")?;
        if self.conf.vad.is_none() {
            // About 16000 / rate samples of 4 bytes per 2 bytes of pcm16 sent.
            let estimate = b64.len() / 4 * 3 / 2 * 16000 / self.conf.input_rate as usize * 4;
            self.admit("input_audio_buffer.append", "audio_buffer", estimate)?;
        }
        let pcm = decode_pcm16(b64, "audio")?;
        self.take_audio(&pcm, now, out)
    }

    /// The caller's voice as samples at `rate`, from an edge that carries audio.
    pub(super) fn hear_samples(
        &mut self,
        pcm: &[f32],
        rate: u32,
        now: Instant,
        out: &mut Outbox,
    ) -> Result<(), ProtocolError> {
        omni_actors::audio::check_rate(rate as u64).map_err(|e| invalid("audio", e))?;
        if self.conf.vad.is_none() {
            self.admit("audio", "audio_buffer", pcm.len() * 16000 / rate as usize * 4)?;
        }
        self.follow_rate(rate, "audio")?;
        self.take_audio(pcm, now, out)
    }

    /// The caller's voice at the resampler's rate, however it came: gathered into steps
    /// (server VAD) or buffered until a commit.
    fn take_audio(&mut self, pcm: &[f32], now: Instant, out: &mut Outbox) -> Result<(), ProtocolError> {
        let mut samples = Vec::with_capacity(pcm.len() * 16000 / self.resampler_rate as usize + 1);
        self.resampler.push(pcm, &mut samples);
        self.heard_audio = true;
        self.last_append = Some(now);
        self.recorded = Some((vec![samples.clone()], Vec::new()));
        if self.conf.vad.is_none() {
            self.buffer.extend_from_slice(&samples);
            return Ok(());
        }
        self.detect_speech(&samples, out);
        self.step.extend_from_slice(&samples);
        // Whole steps go as one chunk of at most a second (or one step): a large append to a
        // backend with small steps is not a burst of chunks its backlog would drop.
        let step = self.step_len();
        let most = step.max(16000) / step * step;
        while self.step.len() >= step {
            let whole = (self.step.len() / step * step).min(most);
            let rest = self.step.split_off(whole);
            let chunk = std::mem::replace(&mut self.step, rest);
            self.send_step(chunk, false);
        }
        Ok(())
    }

    /// The voice activity detector on the 16 kHz input: the edges of the user's speech.
    pub(super) fn detect_speech(&mut self, samples: &[f32], out: &mut Outbox) {
        let Some(rules) = self.conf.edge_rules() else { return };
        let keep = self.gateway_transcribes();
        for edge in self.speech.hear(samples, &rules, keep) {
            match edge {
                Edge::Started { audio_start_ms } => self.speech_started(audio_start_ms, out),
                Edge::Stopped { audio_end_ms } => self.speech_stopped(audio_end_ms, out),
            }
        }
        self.speech.trim(self.user.is_some(), rules.prefix_padding_ms);
    }

    /// The gateway transcribes this session's user turns (its backend does not).
    pub(super) fn gateway_transcribes(&self) -> bool {
        self.gateway_asr && self.conf.transcription.is_some() && self.backend.as_ref().is_some_and(|b| !b.transcripts)
    }

    /// The user's speech from `start_ms` to `end_ms`, to the gateway's transcription.
    pub(super) fn transcribe_turn(&mut self, item_id: &str, start_ms: u64, end_ms: u64) {
        let audio = self.speech.speech(start_ms, end_ms);
        self.commands.push(Inbound::Transcribe { item_id: item_id.to_string(), audio });
    }

    /// Speech starts: a new user turn; over the model's answer, a barge-in.
    fn speech_started(&mut self, start_ms: u64, out: &mut Outbox) {
        if self.user.is_some() {
            return;
        }
        if self.response.as_ref().is_some_and(|r| r.duplex) {
            // Barge-in: the answer in flight is cancelled, the backend listens.
            self.finish_response(out, "cancelled", Some("turn_detected"));
            self.commands.push(Inbound::Interrupt);
        }
        if self.carries_audio {
            // Whatever of the model's voice the edge still plays stops now.
            out.audio(ModelAudio::Clear);
        }
        let item_id = self.new_item();
        self.user = Some(UserTurn { item_id: item_id.clone(), start_ms, announced: true });
        self.unanswered = true;
        self.pads = 0;
        self.reply(out, "input_audio_buffer.speech_started", json!({"audio_start_ms": start_ms, "item_id": item_id}));
    }

    /// Speech stops: the user's turn is committed as an item, whether or not the model answers.
    fn speech_stopped(&mut self, end_ms: u64, out: &mut Outbox) {
        let Some(user) = self.user.take() else { return };
        let start_ms = user.start_ms;
        let item_id = user.item_id;
        self.reply(out, "input_audio_buffer.speech_stopped", json!({"audio_end_ms": end_ms, "item_id": item_id}));
        let previous = self.last_item.replace(item_id.clone());
        self.reply(out, "input_audio_buffer.committed", json!({"item_id": item_id, "previous_item_id": previous}));
        let item = json!({"id": item_id, "object": "realtime.item", "type": "message", "status": "completed",
                          "role": "user", "content": [{"type": "input_audio", "transcript": null}]});
        self.reply(out, self.flavor.item_created(), json!({"previous_item_id": previous, "item": item}));
        if self.gateway_transcribes() {
            self.transcribe_turn(&item_id, start_ms, end_ms);
        } else if self.backend.as_ref().is_some_and(|b| !b.transcripts) {
            // Nothing will come: says so now.
            self.transcribed(out, &item_id, None);
        } else if let Some(older) = self.awaiting_transcript.replace(item_id) {
            // Two turns before an answer: the older one gets what was heard so far.
            let heard = self.heard.take();
            self.transcribed(out, &older, heard.as_deref());
        }
    }

    pub(super) fn commit(&mut self, now: Instant, out: &mut Outbox) -> Result<(), ProtocolError> {
        if self.conf.vad.is_some() {
            // With server VAD the model decides; a commit only flushes what is gathered.
            if !self.step.is_empty() {
                self.pad_step(now);
            }
            return Ok(());
        }
        self.resampler.flush(&mut self.buffer);
        if self.buffer.is_empty() {
            return Err(ProtocolError::InvalidPayload(
                "input_audio_buffer: nothing to commit (append audio first)".into(),
            ));
        }
        let item_id = self.new_item();
        self.audio_item = Some(item_id.clone());
        let audio = std::mem::take(&mut self.buffer);
        let images = self.frames.take();
        self.items_pending.push(ChatMessage { role: Role::User, text: String::new(), images, audios: vec![audio] });
        let previous = self.last_item.replace(item_id.clone());
        self.reply(out, "input_audio_buffer.committed", json!({"item_id": item_id, "previous_item_id": previous}));
        let item = json!({"id": item_id, "object": "realtime.item", "type": "message", "status": "completed",
                          "role": "user", "content": [{"type": "input_audio", "transcript": null}]});
        self.reply(out, self.flavor.item_created(), json!({"previous_item_id": previous, "item": item}));
        Ok(())
    }

    pub(super) fn create_item(&mut self, v: &Value, out: &mut Outbox) -> Result<(), ProtocolError> {
        let item = v.get("item").ok_or_else(|| ProtocolError::MissingField("item is required".into()))?;
        if item.get("type").and_then(Value::as_str).unwrap_or("message") != "message" {
            return Err(invalid("item.type", "only message items are supported"));
        }
        let role: Role = field_str(item, "role")
            .map_err(|_| ProtocolError::MissingField("item.role is required".into()))?
            .parse()
            .map_err(|e| invalid("item.role", e))?;
        // What the item will hold, from the sizes of its fields: refused before any of it is
        // decoded or resampled.
        self.admit("conversation.item.create", "items", self.estimate_item(item))?;
        let mut message = ChatMessage::text(role, "");
        for (i, part) in item.get("content").and_then(Value::as_array).into_iter().flatten().enumerate() {
            let at = format!("item.content[{i}]");
            match part.get("type").and_then(Value::as_str) {
                Some("input_text" | "text" | "output_text") => {
                    let text = part
                        .get("text")
                        .and_then(Value::as_str)
                        .ok_or_else(|| ProtocolError::MissingField(format!("{at}.text is required")))?;
                    message.text.push_str(text);
                }
                Some("input_audio") => {
                    let b64 = part
                        .get("audio")
                        .and_then(Value::as_str)
                        .ok_or_else(|| ProtocolError::MissingField(format!("{at}.audio is required")))?;
                    let pcm = decode_pcm16(b64, &format!("{at}.audio"))?;
                    let audio =
                        omni_actors::audio::resample(&pcm, self.conf.input_rate, 16000).map_err(|e| invalid(&at, e))?;
                    message.audios.push(audio);
                }
                Some("input_image") => {
                    let b64 = part
                        .get("image_url")
                        .or_else(|| part.get("image"))
                        .and_then(Value::as_str)
                        .ok_or_else(|| ProtocolError::MissingField(format!("{at}.image_url is required")))?;
                    message.images.push(wire::decode_jpeg(b64, &format!("{at}.image_url"))?);
                }
                other => {
                    return Err(invalid(
                        &format!("{at}.type"),
                        format!("{other:?} is not supported (input_text, input_audio, input_image)"),
                    ));
                }
            }
        }
        self.admit("conversation.item.create", "items", message.weight())?;
        let item_id = item.get("id").and_then(Value::as_str).map(String::from).unwrap_or_else(|| self.new_item());
        if role == Role::User && !message.audios.is_empty() {
            self.audio_item = Some(item_id.clone());
        }
        let previous = self.last_item.replace(item_id.clone());
        let echoed = echo_item(item, &item_id);
        self.items_pending.push(message);
        self.reply(out, self.flavor.item_created(), json!({"previous_item_id": previous, "item": echoed}));
        Ok(())
    }

    /// The bytes an item's content will take once decoded (pcm16 at the input rate becomes
    /// 16 kHz float32), from the lengths of its base64 fields.
    fn estimate_item(&self, item: &Value) -> usize {
        let parts = item.get("content").and_then(Value::as_array).into_iter().flatten();
        parts
            .map(|part| {
                let b64 = |k: &str| part.get(k).and_then(Value::as_str).map_or(0, str::len);
                let decoded = |n: usize| n / 4 * 3;
                let audio_samples = decoded(b64("audio")) / 2 * 16000 / self.conf.input_rate as usize;
                audio_samples * 4 + decoded(b64("image_url").max(b64("image"))) + b64("text")
            })
            .sum()
    }

    pub(super) fn create_response(&mut self, v: &Value, now: Instant, out: &mut Outbox) -> Result<(), ProtocolError> {
        if self.response.is_some() {
            return Err(ProtocolError::NotReady(
                "a response is already in progress (conversation_already_has_active_response)".into(),
            ));
        }
        if self.conf.vad.is_some() {
            // The duplex model decides when it speaks; this only flushes gathered audio.
            if !self.step.is_empty() {
                self.pad_step(now);
            }
            return Ok(());
        }
        let r = v.get("response").cloned().unwrap_or(Value::Null);
        let audio = match r.get("modalities").or_else(|| r.get("output_modalities")) {
            Some(m) => modalities(m, "response.modalities", self.flavor)?,
            None => self.conf.audio_out,
        };
        if !self.items_pending.iter().any(|m| m.role == Role::User) {
            return Err(ProtocolError::InvalidPayload(
                "response: there is no new user input to answer (commit audio or create an item)".into(),
            ));
        }
        if self.turns.len() >= self.limits.max_turns {
            metrics().buffer_refusals.with_label_values(&["turns"]).inc();
            return Err(ProtocolError::BufferFull(format!(
                "response.create: {} answers are already in progress or waiting (at most {}, limits.max_pending_turns)",
                self.turns.len(),
                self.limits.max_turns
            )));
        }
        let mut messages = self.items_pending.take();
        // The newest user audio is the one the answer's transcript will be of.
        let audio_item = self.audio_item.take().filter(|_| self.conf.transcription.is_some());
        if let Some(extra) = r.get("instructions").and_then(Value::as_str).filter(|s| !s.is_empty()) {
            messages.insert(0, ChatMessage::text(Role::System, extra));
        }
        let input_samples = messages.iter().flat_map(|m| &m.audios).map(|a| a.len() as u64).sum();
        let input = TurnInput {
            messages,
            generation: Generation {
                max_new_tokens: self.conf.max_tokens,
                temperature: self.conf.temperature.map(|t| t as f32),
                ..Generation::default()
            },
            speech: audio,
            // The items continue the conversation the backend holds.
            continues: true,
            ..TurnInput::default()
        };
        self.start_response(out, false, audio);
        let response = self.response.as_ref().map(|r| r.id.clone());
        self.turns.push_back(Turn { response, transcript_item: audio_item, input_samples });
        self.command(Inbound::Turn { input, streaming: true });
        Ok(())
    }

    pub(super) fn cancel(&mut self, out: &mut Outbox) -> Result<(), ProtocolError> {
        if self.response.is_none() {
            return Err(ProtocolError::NotReady(
                "there is no response in progress to cancel (response_cancel_not_active)".into(),
            ));
        }
        if let Some(r) = &self.response {
            let id = r.id.clone();
            for turn in self.turns.iter_mut().filter(|t| t.response.as_deref() == Some(id.as_str())) {
                turn.response = None;
            }
        }
        self.finish_response(out, "cancelled", Some("client_cancelled"));
        self.commands.push(Inbound::Interrupt);
        if self.carries_audio {
            out.audio(ModelAudio::Clear);
        }
        Ok(())
    }

    pub(super) fn image(&mut self, v: &Value) -> Result<(), ProtocolError> {
        if !self.heard_audio {
            return Err(ProtocolError::NotReady("input_image_buffer.append: send audio before the first image".into()));
        }
        let b64 = field_str(v, "image")?;
        self.admit("input_image_buffer.append", "images", b64.len() / 4 * 3)?;
        let image = wire::decode_jpeg(b64, "image")?;
        self.recorded = Some((Vec::new(), vec![image.clone()]));
        self.frames.push(image);
        Ok(())
    }
}

/// A `session` object without its audio formats (`input_audio_format`,
/// `output_audio_format`, `audio.input.format`, `audio.output.format`).
fn without_formats(session: &Value) -> Value {
    let mut session = session.clone();
    if let Some(s) = session.as_object_mut() {
        s.remove("input_audio_format");
        s.remove("output_audio_format");
        if let Some(audio) = s.get_mut("audio").and_then(Value::as_object_mut) {
            for side in ["input", "output"] {
                if let Some(side) = audio.get_mut(side).and_then(Value::as_object_mut) {
                    side.remove("format");
                }
            }
        }
    }
    session
}

/// The item as echoed in `conversation.item.created` / `.added`: the client's own fields,
/// without the audio and image data it carried (as the OpenAI API does), so that an echo
/// never doubles what a client sent.
fn echo_item(item: &Value, item_id: &str) -> Value {
    let mut echoed = item.clone();
    echoed["id"] = json!(item_id);
    echoed["object"] = json!("realtime.item");
    echoed["status"] = json!("completed");
    if let Some(parts) = echoed.get_mut("content").and_then(Value::as_array_mut) {
        for part in parts {
            if let Some(obj) = part.as_object_mut() {
                match obj.get("type").and_then(Value::as_str) {
                    Some("input_audio") => {
                        obj.remove("audio");
                        obj.entry("transcript").or_insert(Value::Null);
                    }
                    Some("input_image") => {
                        obj.remove("image_url");
                        obj.remove("image");
                    }
                    _ => {}
                }
            }
        }
    }
    echoed
}
