//! What clients hear in the OpenAI-shaped dialects: responses with their items, content
//! parts and deltas, built from duplex steps or turn-mode answers; errors in the OpenAI shape.

use std::time::Instant;

use omni_actors::domain::StepKind;
use omni_actors::protocol::{ErrorKind, ProtocolError};
use serde_json::{Value, json};

use super::input::encode_pcm16;
use super::{Flavor, OUTPUT_RATE, Realtime, Response, UserTurn};

impl Realtime {
    pub(super) fn response_object(
        &self,
        r: &Response,
        status: &str,
        details: Option<&str>,
        output: Vec<Value>,
    ) -> Value {
        let usage = json!({
            "total_tokens": r.input_tokens + r.output_tokens,
            "input_tokens": r.input_tokens,
            "output_tokens": r.output_tokens,
            "input_token_details": {"text_tokens": 0, "audio_tokens": r.input_tokens, "cached_tokens": 0},
            "output_token_details": {"text_tokens": r.output_tokens, "audio_tokens": r.audio_samples * 50 / OUTPUT_RATE as u64},
        });
        let modalities = if r.audio { vec!["text", "audio"] } else { vec!["text"] };
        let mut obj = json!({
            "id": r.id, "object": "realtime.response", "status": status,
            "status_details": details.map(|reason| json!({"type": status, "reason": reason})),
            "output": output, "conversation_id": self.session_id, "voice": self.conf.voice,
            "usage": if status == "in_progress" { Value::Null } else { usage },
        });
        if self.flavor.ga() {
            obj["output_modalities"] = json!(if r.audio { vec!["audio"] } else { vec!["text"] });
        } else {
            obj["modalities"] = json!(modalities);
            obj["output_audio_format"] = json!(if self.flavor == Flavor::Qwen { "pcm" } else { "pcm16" });
        }
        obj
    }

    pub(super) fn assistant_item(&self, r: &Response, status: &str) -> Value {
        let part = if r.audio {
            json!({"type": self.flavor.part_type(true), "transcript": r.text})
        } else {
            json!({"type": self.flavor.part_type(false), "text": r.text})
        };
        let content = if status == "in_progress" { json!([]) } else { json!([part]) };
        json!({"id": r.item_id, "object": "realtime.item", "type": "message", "status": status, "role": "assistant", "content": content})
    }

    /// Opens a response: for the duplex model, first closes the user's turn.
    pub(super) fn start_response(&mut self, out: &mut Vec<String>, duplex: bool, audio: bool) {
        if duplex {
            // The model takes the floor: whatever the user says from now on is a new turn.
            self.in_speech = false;
            self.voiced_run = 0;
            let end_ms = self.received_ms();
            let mut user = self.user.take().unwrap_or_else(|| UserTurn {
                item_id: self.new_item(),
                start_ms: end_ms.saturating_sub(1000),
                announced: false,
                committed: false,
            });
            let item_id = user.item_id.clone();
            if !user.announced {
                user.announced = true;
                self.reply(
                    out,
                    "input_audio_buffer.speech_started",
                    json!({"audio_start_ms": user.start_ms, "item_id": item_id}),
                );
            }
            self.reply(out, "input_audio_buffer.speech_stopped", json!({"audio_end_ms": end_ms, "item_id": item_id}));
            if !user.committed {
                let previous = self.last_item.replace(item_id.clone());
                self.reply(
                    out,
                    "input_audio_buffer.committed",
                    json!({"item_id": item_id, "previous_item_id": previous}),
                );
                let item = json!({"id": item_id, "object": "realtime.item", "type": "message", "status": "completed",
                                  "role": "user", "content": [{"type": "input_audio", "transcript": null}]});
                self.reply(out, self.flavor.item_created(), json!({"previous_item_id": previous, "item": item}));
            }
        }
        self.responses += 1;
        let r = Response {
            id: format!("resp_{}", self.responses),
            item_id: self.new_item(),
            opened: false,
            duplex,
            audio,
            text: String::new(),
            input_tokens: 0,
            output_tokens: 0,
            audio_samples: 0,
            last_step: Instant::now(),
        };
        let body = json!({"response": self.response_object(&r, "in_progress", None, vec![])});
        self.reply(out, "response.created", body);
        self.response = Some(r);
    }

    /// Output item, conversation item and content part, before the first delta.
    pub(super) fn open_response(&mut self, out: &mut Vec<String>) {
        let Some(r) = self.response.as_mut() else { return };
        if r.opened {
            return;
        }
        r.opened = true;
        let (id, item_id, audio) = (r.id.clone(), r.item_id.clone(), r.audio);
        let r = self.response.as_ref().expect("checked above");
        let item = self.assistant_item(r, "in_progress");
        let previous = self.last_item.replace(item_id.clone());
        self.reply(out, "response.output_item.added", json!({"response_id": id, "output_index": 0, "item": item}));
        self.reply(out, self.flavor.item_created(), json!({"previous_item_id": previous, "item": item}));
        let part = if audio {
            json!({"type": self.flavor.part_type(true), "transcript": ""})
        } else {
            json!({"type": self.flavor.part_type(false), "text": ""})
        };
        self.reply(
            out,
            "response.content_part.added",
            json!({"response_id": id, "item_id": item_id, "output_index": 0, "content_index": 0, "part": part}),
        );
    }

    pub(super) fn delta(&mut self, out: &mut Vec<String>, text: &str, audio: &[f32]) {
        self.open_response(out);
        let Some(r) = self.response.as_mut() else { return };
        r.text.push_str(text);
        r.audio_samples += audio.len() as u64;
        let (id, item_id, with_audio) = (r.id.clone(), r.item_id.clone(), r.audio);
        let at = json!({"response_id": id, "item_id": item_id, "output_index": 0, "content_index": 0});
        let with = |mut v: Value, k: &str, x: Value| {
            v[k] = x;
            v
        };
        if !text.is_empty() {
            let kind = if with_audio { self.flavor.transcript_delta() } else { self.flavor.text_delta() };
            self.reply(out, kind, with(at.clone(), "delta", json!(text)));
        }
        if with_audio && !audio.is_empty() {
            self.reply(out, self.flavor.audio_delta(), with(at, "delta", json!(encode_pcm16(audio))));
        }
    }

    /// Closes the response in progress with its done events.
    pub(super) fn finish_response(&mut self, out: &mut Vec<String>, status: &str, reason: Option<&str>) {
        let Some(r) = self.response.take() else { return };
        let item_status = if status == "completed" { "completed" } else { "incomplete" };
        let mut output = Vec::new();
        if r.opened {
            let at = json!({"response_id": r.id, "item_id": r.item_id, "output_index": 0, "content_index": 0});
            let with = |mut v: Value, k: &str, x: Value| {
                v[k] = x;
                v
            };
            if r.audio {
                self.reply(out, self.flavor.audio_done(), at.clone());
                self.reply(out, self.flavor.transcript_done(), with(at.clone(), "transcript", json!(r.text)));
            } else {
                self.reply(out, self.flavor.text_done(), with(at.clone(), "text", json!(r.text)));
            }
            let item = self.assistant_item(&r, item_status);
            let part = item["content"][0].clone();
            self.reply(out, "response.content_part.done", with(at, "part", part));
            self.reply(out, "response.output_item.done", json!({"response_id": r.id, "output_index": 0, "item": item}));
            if self.flavor.ga() {
                self.reply(out, "conversation.item.done", json!({"item": item}));
            }
            output.push(item);
        }
        let body = json!({"response": self.response_object(&r, status, reason, output)});
        self.reply(out, "response.done", body);
    }

    pub(super) fn on_step(&mut self, outcome: &omni_actors::domain::StepOutcome, out: &mut Vec<String>) {
        match outcome.kind {
            StepKind::Listen => {
                if self.response.as_ref().is_some_and(|r| r.duplex) {
                    self.finish_response(out, "completed", None);
                }
            }
            StepKind::Speak => {
                if self.response.is_none() {
                    let audio = self.conf.audio_out;
                    self.start_response(out, true, audio);
                }
                if let Some(r) = self.response.as_mut() {
                    r.input_tokens += outcome.input_tokens as u64;
                    r.output_tokens += outcome.output_tokens as u64;
                    r.last_step = Instant::now();
                }
                self.delta(out, &outcome.text, &outcome.audio);
                if outcome.end_of_turn {
                    self.finish_response(out, "completed", None);
                }
            }
        }
        // The backend's pace: while it speaks and the client is silent, step on silence.
        let now = Instant::now();
        if self.response.as_ref().is_some_and(|r| r.duplex) && self.client_idle(now) {
            self.pad_step(now);
        }
    }

    /// Whether a turn-mode answer belongs to the response in progress.
    pub(super) fn turn_is_current(&self, owner: Option<String>) -> bool {
        owner.is_some() && self.response.as_ref().map(|r| &r.id) == owner.as_ref()
    }

    pub(super) fn error_event(&mut self, e: &ProtocolError) -> String {
        let message = e.to_string();
        let param = message
            .split_once(": ")
            .map(|(p, _)| p)
            .or_else(|| message.strip_suffix(" is required"))
            .filter(|p| !p.contains(' '))
            .map(String::from);
        let kind = match e.kind() {
            ErrorKind::Client => "invalid_request_error",
            ErrorKind::Server => "server_error",
        };
        let client_event = self.client_event_id.clone();
        self.event("error", json!({"error": {"type": kind, "code": e.code(), "message": message, "param": param, "event_id": client_event}}))
    }
}
