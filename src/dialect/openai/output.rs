//! What clients hear in the OpenAI-shaped dialects: responses with their items, content
//! parts and deltas, built from duplex steps or turn-mode answers; errors in the OpenAI shape.

use std::time::Instant;

use omni_actors::domain::StepKind;
use omni_actors::edge::dialect::Outbox;
use omni_actors::protocol::{ErrorKind, ProtocolError};
use omni_actors::session::messages::ModelAudio;
use serde_json::{Value, json};

use super::input::encode_pcm16;
use super::{Flavor, OUTPUT_RATE, Realtime, Response, Usage, UserTurn};

impl Realtime {
    /// `usage` of `response.done`: text and audio tokens apart, as the backend counted
    /// them, or for a backend that does not count audio, 25 tokens per second of audio heard
    /// and spoken. Output tokens are text and speech together, as both documents count them.
    fn usage(&self, r: &Response) -> Value {
        let u = r.usage;
        let counted = self.backend.as_ref().is_some_and(|b| b.token_details);
        let (input_audio, output_audio) = if counted {
            (u.input_audio, u.output_audio)
        } else {
            ((u.input_samples * 25 / 16000).min(u.input), u.output_samples * 25 / OUTPUT_RATE as u64)
        };
        let input_text = u.input.saturating_sub(input_audio);
        let output = u.output + output_audio;
        let mut usage = json!({"total_tokens": u.input + output, "input_tokens": u.input, "output_tokens": output});
        let (input_details, output_details) = if self.flavor == Flavor::Qwen {
            // Qwen's spelling.
            ("input_tokens_details", "output_tokens_details")
        } else {
            ("input_token_details", "output_token_details")
        };
        usage[input_details] = json!({"text_tokens": input_text, "audio_tokens": input_audio});
        if self.flavor != Flavor::Qwen {
            usage[input_details]["cached_tokens"] = json!(0);
        }
        usage[output_details] = json!({"text_tokens": u.output, "audio_tokens": output_audio});
        usage
    }

    /// A response's status as the flavor names it: Qwen lists completed, failed,
    /// in_progress and incomplete, so a response cut short (barge-in, `response.cancel`)
    /// is `incomplete` there and `cancelled` in OpenAI's.
    fn status<'a>(&self, status: &'a str) -> &'a str {
        if self.flavor == Flavor::Qwen && status == "cancelled" { "incomplete" } else { status }
    }

    pub(super) fn response_object(
        &self,
        r: &Response,
        status: &str,
        details: Option<&str>,
        output: Vec<Value>,
    ) -> Value {
        let status = self.status(status);
        let usage = self.usage(r);
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

    /// The answer's content part. Its text is `transcript` for audio in OpenAI's flavors
    /// and in Qwen's `response.done`; Qwen's content part and output item events show it as
    /// `text` (`in_done` false).
    fn part(&self, audio: bool, text: &str, in_done: bool) -> Value {
        let key = if audio && (self.flavor != Flavor::Qwen || in_done) { "transcript" } else { "text" };
        let mut part = json!({"type": self.flavor.part_type(audio)});
        part[key] = json!(text);
        part
    }

    pub(super) fn assistant_item(&self, r: &Response, status: &str, in_done: bool) -> Value {
        let content = if status == "in_progress" { json!([]) } else { json!([self.part(r.audio, &r.text, in_done)]) };
        json!({"id": r.item_id, "object": "realtime.item", "type": "message", "status": status, "role": "assistant", "content": content})
    }

    /// What became of the transcription of a user item's audio: `completed` with the text,
    /// or `failed` saying why (the model does not transcribe, or reported nothing).
    pub(super) fn transcribed(&mut self, out: &mut Outbox, item_id: &str, text: Option<&str>) {
        if self.conf.transcription.is_none() {
            return;
        }
        let at = json!({"item_id": item_id, "content_index": 0});
        let mut body = at;
        let kind = match text {
            Some(text) => {
                body["transcript"] = json!(text);
                "conversation.item.input_audio_transcription.completed"
            }
            None => {
                let (code, message) = match &self.backend {
                    Some(b) if !b.transcripts => {
                        let message = format!(
                            "the model ({}) does not transcribe speech, and the gateway's own transcription is off",
                            b.name
                        );
                        ("transcription_unavailable", message)
                    }
                    _ => ("transcription_failed", "the model reported no transcript of this audio".to_string()),
                };
                body["error"] = json!({"code": code, "message": message, "param": "session.input_audio_transcription"});
                "conversation.item.input_audio_transcription.failed"
            }
        };
        self.reply(out, kind, body);
    }

    /// The user's turn ends as the model answers: its events, with what the model heard.
    fn close_user_turn(&mut self, out: &mut Outbox, mut user: UserTurn, end_ms: u64) {
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
        let previous = self.last_item.replace(item_id.clone());
        self.reply(out, "input_audio_buffer.committed", json!({"item_id": item_id, "previous_item_id": previous}));
        // What the model heard of this turn, when it says.
        let heard = self.heard.take().filter(|_| self.conf.transcription.is_some());
        let item = json!({"id": item_id, "object": "realtime.item", "type": "message", "status": "completed",
                          "role": "user", "content": [{"type": "input_audio", "transcript": heard}]});
        self.reply(out, self.flavor.item_created(), json!({"previous_item_id": previous, "item": item}));
        if self.gateway_transcribes() {
            self.transcribe_turn(&item_id, user.start_ms, end_ms);
        } else {
            self.transcribed(out, &item_id, heard.as_deref());
        }
    }

    /// The gateway's own transcript of a user item (its backend does not transcribe): a delta
    /// (OpenAI's flavors) and `completed`, or `failed` with the reason.
    pub(super) fn gateway_transcribed(&mut self, out: &mut Outbox, item_id: &str, result: Result<&str, &str>) {
        if self.conf.transcription.is_none() {
            return;
        }
        let at = json!({"item_id": item_id, "content_index": 0});
        match result {
            Ok(text) => {
                if self.flavor != Flavor::Qwen {
                    let mut delta = at.clone();
                    delta["delta"] = json!(text);
                    self.reply(out, "conversation.item.input_audio_transcription.delta", delta);
                }
                let mut done = at;
                done["transcript"] = json!(text);
                self.reply(out, "conversation.item.input_audio_transcription.completed", done);
            }
            Err(why) => {
                let mut failed = at;
                failed["error"] = json!({"code": "transcription_failed", "message": why,
                                         "param": "session.input_audio_transcription"});
                self.reply(out, "conversation.item.input_audio_transcription.failed", failed);
            }
        }
    }

    /// Opens a response: for the duplex model, first closes the user's turn.
    pub(super) fn start_response(&mut self, out: &mut Outbox, duplex: bool, audio: bool) {
        if duplex {
            // The model takes the floor: whatever the user says from now on is a new turn.
            let in_speech = self.speech.in_speech();
            self.speech.end();
            let answered_a_turn = std::mem::take(&mut self.unanswered);
            let awaiting = self.awaiting_transcript.take();
            match (self.user.take(), awaiting) {
                (None, Some(item_id)) => {
                    // The turn was committed at the end of its speech; this is what was heard.
                    let heard = self.heard.take();
                    self.transcribed(out, &item_id, heard.as_deref());
                }
                // The turn was committed at the end of its speech, and its transcript is
                // settled (the gateway's, or none from this model).
                (None, None) if answered_a_turn => {}
                (user, awaiting) => {
                    if let Some(older) = awaiting {
                        self.transcribed(out, &older, None);
                    }
                    // Speech in progress ends at its last voiced window; a turn the detector
                    // did not hear (the model answered a sound it took for speech) ends now.
                    let received = self.received_ms();
                    let end_ms = if in_speech { self.speech.speech_end_ms() } else { received };
                    let user = user.unwrap_or_else(|| UserTurn {
                        item_id: self.new_item(),
                        start_ms: received.saturating_sub(1000),
                        announced: false,
                    });
                    self.close_user_turn(out, user, end_ms);
                }
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
            usage: Usage::default(),
            last_step: Instant::now(),
        };
        let body = json!({"response": self.response_object(&r, "in_progress", None, vec![])});
        self.reply(out, "response.created", body);
        self.response = Some(r);
    }

    /// Output item, conversation item and content part, before the first delta.
    pub(super) fn open_response(&mut self, out: &mut Outbox) {
        let Some(r) = self.response.as_mut() else { return };
        if r.opened {
            return;
        }
        r.opened = true;
        let (id, item_id, audio) = (r.id.clone(), r.item_id.clone(), r.audio);
        let r = self.response.as_ref().expect("checked above");
        let item = self.assistant_item(r, "in_progress", false);
        let previous = self.last_item.replace(item_id.clone());
        self.reply(out, "response.output_item.added", json!({"response_id": id, "output_index": 0, "item": item}));
        self.reply(out, self.flavor.item_created(), json!({"previous_item_id": previous, "item": item}));
        let part = self.part(audio, "", false);
        self.reply(
            out,
            "response.content_part.added",
            json!({"response_id": id, "item_id": item_id, "output_index": 0, "content_index": 0, "part": part}),
        );
    }

    pub(super) fn delta(&mut self, out: &mut Outbox, text: &str, audio: &[f32]) {
        self.open_response(out);
        let Some(r) = self.response.as_mut() else { return };
        r.text.push_str(text);
        r.usage.output_samples += audio.len() as u64;
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
            if self.carries_audio {
                let samples = audio.to_vec();
                out.audio(ModelAudio::Delta { response: id, samples, rate: OUTPUT_RATE });
            } else {
                self.reply(out, self.flavor.audio_delta(), with(at, "delta", json!(encode_pcm16(audio))));
            }
        }
    }

    /// Closes the response in progress with its done events.
    pub(super) fn finish_response(&mut self, out: &mut Outbox, status: &str, reason: Option<&str>) {
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
                if self.carries_audio {
                    out.audio(ModelAudio::Done { response: r.id.clone() });
                }
                self.reply(out, self.flavor.audio_done(), at.clone());
                self.reply(out, self.flavor.transcript_done(), with(at.clone(), "transcript", json!(r.text)));
            } else {
                self.reply(out, self.flavor.text_done(), with(at.clone(), "text", json!(r.text)));
            }
            let item = self.assistant_item(&r, item_status, false);
            let part = item["content"][0].clone();
            self.reply(out, "response.content_part.done", with(at, "part", part));
            self.reply(out, "response.output_item.done", json!({"response_id": r.id, "output_index": 0, "item": item}));
            if self.flavor.ga() {
                self.reply(out, "conversation.item.done", json!({"item": item}));
            }
            output.push(self.assistant_item(&r, item_status, true));
        } else if self.carries_audio {
            out.audio(ModelAudio::Done { response: r.id.clone() });
        }
        let body = json!({"response": self.response_object(&r, status, reason, output)});
        self.reply(out, "response.done", body);
    }

    pub(super) fn on_step(&mut self, outcome: &omni_actors::domain::StepOutcome, out: &mut Outbox) {
        let heard = std::mem::take(&mut self.sent_since_step);
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
                    r.usage.input += outcome.input_tokens as u64;
                    r.usage.output += outcome.output_tokens as u64;
                    r.usage.input_audio += outcome.input_audio_tokens as u64;
                    r.usage.output_audio += outcome.output_audio_tokens as u64;
                    // The audio this step answered: what was sent since the step before.
                    r.usage.input_samples += heard;
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
        let code = match (self.flavor, e.code()) {
            // The names Qwen's document uses.
            (Flavor::Qwen, "invalid_payload") => "invalid_value",
            (Flavor::Qwen, "missing_field") => "missing_required_parameter",
            (_, code) => code,
        };
        self.event("error", json!({"error": {"type": kind, "code": code, "message": message, "param": param, "event_id": client_event}}))
    }
}
