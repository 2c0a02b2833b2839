//! The driver's events as the OpenAI-shaped dialects' JSON, in each flavor's names and shapes:
//! GA (`response.output_audio.delta`, `conversation.item.added`, `output_modalities`), beta
//! (`response.audio.delta`, `conversation.item.created`, `modalities`) and Qwen (beta's names,
//! its own session fields, usage spelling and statuses).

use omni_actors::domain::{Role, ToolChoice, Tools};
use omni_actors::edge::dialect::Voiced;
use omni_actors::protocol::{CloseReason, ErrorKind, ProtocolError, QueueInfo};
use serde_json::{Map, Value, json};

use super::coding::G711Downlink;
use super::{Flavor, coding};
use crate::conversation::Coding;
use crate::conversation::events::TranscriptionFailure;
use crate::conversation::items::{Item, ItemBody, Part};
use crate::conversation::{Event, OUTPUT_RATE, Output, ResponseStatus, ResponseView, SessionView, Truncation, Usage};

/// The token limit a Qwen session object shows when the client set none (Qwen's document).
const QWEN_MAX_TOKENS: u32 = 16384;

/// What a Qwen session object shows for the sampling settings a client did not set: the values
/// Qwen's `session.updated` documents (`seed: -1`: no fixed seed). A client's own replace them.
fn qwen_defaults() -> [(&'static str, Value); 5] {
    [
        ("top_p", json!(1.0)),
        ("top_k", json!(50)),
        ("repetition_penalty", json!(1.05)),
        ("presence_penalty", json!(0.0)),
        ("seed", json!(-1)),
    ]
}

/// Where an output is, as its events name it.
fn at_fields(o: &Output) -> Value {
    json!({"response_id": o.response_id, "item_id": o.item_id, "output_index": o.output_index, "content_index": 0})
}

/// A GA audio format: 16-bit PCM with its rate, or G.711 (8 kHz, no rate).
fn ga_format(coding: Coding, rate: u32) -> Value {
    match coding {
        Coding::Pcm16 => json!({"type": "audio/pcm", "rate": rate}),
        _ => json!({"type": coding::name(coding, Flavor::Ga)}),
    }
}

/// Renders events in one flavor, numbering them.
pub(super) struct Encoder {
    pub flavor: Flavor,
    pub model: String,
    /// Events sent so far (their ids are `event_N`).
    events: u64,
    /// The `event_id` of the client's last event, named in errors.
    pub client_event_id: Option<String>,
    /// How the model's voice is coded in `response.output_audio.delta`.
    pub output: Coding,
    /// The response's voice on its way down to G.711's 8 kHz.
    downlink: Option<G711Downlink>,
}

impl Encoder {
    pub(super) fn new(flavor: Flavor, model: &str) -> Encoder {
        Encoder {
            flavor,
            model: model.to_string(),
            events: 0,
            client_event_id: None,
            output: Coding::Pcm16,
            downlink: None,
        }
    }

    fn event(&mut self, kind: &str, fields: Value) -> String {
        self.events += 1;
        let mut obj = Map::new();
        obj.insert("type".into(), json!(kind));
        obj.insert("event_id".into(), json!(format!("event_{}", self.events)));
        if let Value::Object(f) = fields {
            obj.extend(f);
        }
        Value::Object(obj).to_string()
    }

    /// The last piece of a response's G.711 voice (what its resampler held), as one more audio
    /// delta before its `audio.done`; `None` when there is none.
    pub(super) fn voice_tail(&mut self, at: &Output) -> Option<String> {
        let tail = G711Downlink::tail(&mut self.downlink, &at.response_id);
        if tail.is_empty() || self.output == Coding::Pcm16 {
            return None;
        }
        let delta = coding::compand(self.output, &tail);
        let mut fields = at_fields(at);
        fields["delta"] = json!(delta);
        Some(self.event(self.flavor.audio_delta(), fields))
    }

    /// The model's voice as an audio delta, coded as the session's output asks; where the voice
    /// is in the frame, for a session that keeps it without (its resume).
    pub(super) fn audio_delta(&mut self, at: &Output, samples: &[f32]) -> Voiced {
        let delta = match self.output {
            Coding::Pcm16 => coding::encode(Coding::Pcm16, samples, OUTPUT_RATE),
            g711 => {
                let narrow = G711Downlink::push(&mut self.downlink, &at.response_id, samples, OUTPUT_RATE);
                coding::compand(g711, &narrow)
            }
        };
        let len = delta.len();
        let mut fields = at_fields(at);
        fields["delta"] = json!(delta);
        let text = self.event(self.flavor.audio_delta(), fields);
        // Base64 needs no escapes: the delta is its string's contents as they are.
        const KEY: &str = "\"delta\":\"";
        let start = text.find(KEY).map_or(0, |at| at + KEY.len());
        let voice =
            if text.get(start..start + len).is_some_and(|v| !v.contains('"')) { start..start + len } else { 0..0 };
        Voiced { text, voice, samples: samples.len() }
    }

    /// `output_audio_buffer.{kind}` for response `response_id`: what the caller heard of the
    /// model's voice on an edge that plays it; a `cleared` the client asked for names its event.
    pub(super) fn playback(&mut self, kind: &str, response_id: &str, client_event_id: Option<&str>) -> String {
        let mut fields = json!({"response_id": response_id});
        if let Some(id) = client_event_id {
            fields["client_event_id"] = json!(id);
        }
        self.event(&format!("output_audio_buffer.{kind}"), fields)
    }

    /// The event's JSON, or `None` for one this flavor does not send. The voice's own events
    /// (`AudioDelta` for an edge that plays it, `VoiceDone`, `VoiceCleared`) are its caller's.
    pub(super) fn encode(&mut self, event: Event) -> Option<String> {
        let f = self.flavor;
        let at = at_fields;
        let with = |mut v: Value, k: &str, x: Value| {
            v[k] = x;
            v
        };
        Some(match event {
            Event::Queued(q) => self.queue_event("session.queued", q),
            Event::QueueUpdate(q) => self.queue_event("session.queue_update", q),
            Event::SessionCreated(view) => {
                let session = self.session_object(&view);
                let mut fields = json!({"session": session});
                if let Some(backend) = &view.backend {
                    // What answers (a gateway field beside the session, as the queue's events are).
                    fields["backend"] = json!(backend);
                }
                self.event("session.created", fields)
            }
            Event::SessionUpdated(view) => {
                let session = self.session_object(&view);
                self.event("session.updated", json!({"session": session}))
            }
            Event::Unsupported { setting, model } => {
                let message =
                    format!("session.{setting}: the model ({model}) does not apply this setting; it is ignored");
                let error = json!({"type": "invalid_request_error", "code": "unsupported_setting", "message": message,
                                   "param": format!("session.{setting}"), "event_id": self.client_event_id});
                self.event("error", json!({"error": error}))
            }
            Event::Error(e) => self.error_event(&e),
            Event::SpeechStarted { audio_start_ms, item_id } => self.event(
                "input_audio_buffer.speech_started",
                json!({"audio_start_ms": audio_start_ms, "item_id": item_id}),
            ),
            Event::SpeechStopped { audio_end_ms, item_id } => self
                .event("input_audio_buffer.speech_stopped", json!({"audio_end_ms": audio_end_ms, "item_id": item_id})),
            Event::Committed { item_id, previous_item_id } => self.event(
                "input_audio_buffer.committed",
                json!({"item_id": item_id, "previous_item_id": previous_item_id}),
            ),
            Event::Cleared => self.event("input_audio_buffer.cleared", json!({})),
            Event::KeyPressed { key, received_at } => self.event(
                "input_audio_buffer.dtmf_event_received",
                json!({"event": key.to_string(), "received_at": received_at}),
            ),
            Event::IdleTimeout { item_id, audio_start_ms, audio_end_ms } => self.event(
                "input_audio_buffer.timeout_triggered",
                json!({"item_id": item_id, "audio_start_ms": audio_start_ms, "audio_end_ms": audio_end_ms}),
            ),
            Event::ItemAdded { previous_item_id, item } => {
                let item = self.item(&item, false);
                self.event(f.item_created(), json!({"previous_item_id": previous_item_id, "item": item}))
            }
            // GA only.
            Event::ItemDone { item } => {
                if !f.ga() {
                    return None;
                }
                let item = self.item(&item, false);
                self.event("conversation.item.done", json!({"item": item}))
            }
            Event::ItemRetrieved { item } => {
                let item = self.item(&item, false);
                self.event("conversation.item.retrieved", json!({"item": item}))
            }
            Event::ItemDeleted { item_id } => self.event("conversation.item.deleted", json!({"item_id": item_id})),
            Event::ItemTruncated { item_id, content_index, audio_end_ms } => self.event(
                "conversation.item.truncated",
                json!({"item_id": item_id, "content_index": content_index, "audio_end_ms": audio_end_ms}),
            ),
            // Qwen documents no delta.
            Event::TranscriptionDelta { item_id, delta } => {
                if f == Flavor::Qwen {
                    return None;
                }
                self.event(
                    "conversation.item.input_audio_transcription.delta",
                    json!({"item_id": item_id, "content_index": 0, "delta": delta}),
                )
            }
            Event::TranscriptionCompleted { item_id, transcript, seconds } => {
                let mut fields = json!({"item_id": item_id, "content_index": 0, "transcript": transcript});
                if f != Flavor::Qwen {
                    // What the transcription cost: the seconds of audio it read.
                    fields["usage"] = json!({"type": "duration", "seconds": (seconds * 1000.0).round() / 1000.0});
                }
                self.event("conversation.item.input_audio_transcription.completed", fields)
            }
            Event::TranscriptionFailed { item_id, failure, message } => {
                let code = match failure {
                    TranscriptionFailure::Unavailable => "transcription_unavailable",
                    TranscriptionFailure::Failed => "transcription_failed",
                };
                let error = json!({"type": "transcription_error", "code": code, "message": message,
                                   "param": "session.input_audio_transcription"});
                self.event(
                    "conversation.item.input_audio_transcription.failed",
                    json!({"item_id": item_id, "content_index": 0, "error": error}),
                )
            }
            Event::ResponseCreated(view) => {
                let response = self.response_object(&view);
                self.event("response.created", json!({"response": response}))
            }
            Event::OutputItemAdded { at: o, item } => {
                let item = self.item(&item, false);
                self.event(
                    "response.output_item.added",
                    json!({"response_id": o.response_id, "output_index": o.output_index, "item": item}),
                )
            }
            Event::ContentPartAdded { at: o, audio } => {
                let part = self.content_part(audio, "", false);
                self.event("response.content_part.added", with(at(&o), "part", part))
            }
            Event::TextDelta { at: o, audio, delta } => {
                let kind = if audio { f.transcript_delta() } else { f.text_delta() };
                self.event(kind, with(at(&o), "delta", json!(delta)))
            }
            Event::AudioDelta { at: o, samples } => return Some(self.audio_delta(&o, &samples).text),
            Event::AudioDone { at: o } => self.event(f.audio_done(), at(&o)),
            Event::TextDone { at: o, audio, text } => {
                if audio {
                    self.event(f.transcript_done(), with(at(&o), "transcript", json!(text)))
                } else {
                    self.event(f.text_done(), with(at(&o), "text", json!(text)))
                }
            }
            Event::ContentPartDone { at: o, part } => {
                let part = match part {
                    Part::Answer { audio, text, .. } => self.content_part(audio, &text, true),
                    other => self.part(&other, false),
                };
                self.event("response.content_part.done", with(at(&o), "part", part))
            }
            Event::ArgumentsDelta { at: o, call_id, delta } => self.event(
                "response.function_call_arguments.delta",
                json!({"response_id": o.response_id, "item_id": o.item_id, "output_index": o.output_index,
                       "call_id": call_id, "delta": delta}),
            ),
            Event::ArgumentsDone { at: o, call_id, name, arguments } => self.event(
                "response.function_call_arguments.done",
                json!({"response_id": o.response_id, "item_id": o.item_id, "output_index": o.output_index,
                       "call_id": call_id, "name": name, "arguments": arguments}),
            ),
            Event::OutputItemDone { at: o, item } => {
                let item = self.item(&item, false);
                self.event(
                    "response.output_item.done",
                    json!({"response_id": o.response_id, "output_index": o.output_index, "item": item}),
                )
            }
            Event::ResponseDone(view) => {
                let response = self.response_object(&view);
                self.event("response.done", json!({"response": response}))
            }
            Event::Finished => self.event("session.finished", json!({})),
            Event::Ended(reason) => {
                let code = if reason == CloseReason::Timeout { "session_expired" } else { reason.as_str() };
                let message = format!("the session ended: {}", reason.as_str());
                self.event("error", json!({"error": {"type": "server_error", "code": code, "message": message, "param": null, "event_id": null}}))
            }
            Event::VoiceCleared => {
                self.downlink = None;
                return None;
            }
            Event::VoiceDone { .. } => return None,
        })
    }

    /// `session.resumed` (a gateway event, as the queue's are): the next resume token and
    /// what the resumed client missed.
    /// Its `event_id` is outside the session's numbering (`event_N`, which the client's
    /// `received` counts): `event_resumed_` and the number of the last event said.
    pub(super) fn resumed(&mut self, session_id: Option<&str>, token: &str, counts: [u64; 4]) -> String {
        let [replayed, lost, audio_skipped_ms, away_ms] = counts;
        json!({"type": "session.resumed", "event_id": format!("event_resumed_{}", self.events),
               "session_id": session_id, "resume_token": token, "replayed": replayed, "lost": lost,
               "audio_skipped_ms": audio_skipped_ms, "away_ms": away_ms})
        .to_string()
    }

    fn queue_event(&mut self, kind: &str, q: QueueInfo) -> String {
        let QueueInfo { ticket, position, estimated_wait_s, queue_length, measured } = q;
        self.event(
            kind,
            json!({"position": position, "estimated_wait_s": (estimated_wait_s * 10.0).round() / 10.0,
                   "estimate": if measured { "measured" } else { "typical" },
                   "ticket_id": format!("ticket_{ticket}"), "queue_length": queue_length}),
        )
    }

    fn session_object(&self, view: &SessionView) -> Value {
        let c = &view.conf;
        let vad = c.vad.as_ref().map(|v| {
            if v.kind == "semantic_vad" {
                json!({"type": v.kind, "eagerness": v.eagerness.as_deref().unwrap_or("auto"),
                       "create_response": v.create_response, "interrupt_response": v.interrupt_response})
            } else {
                let mut vad = json!({"type": v.kind, "threshold": v.threshold, "prefix_padding_ms": v.prefix_padding_ms,
                       "silence_duration_ms": v.silence_duration_ms,
                       "create_response": v.create_response, "interrupt_response": v.interrupt_response});
                if let Some(ms) = v.idle_timeout_ms {
                    vad["idle_timeout_ms"] = json!(ms);
                }
                vad
            }
        });
        let tools = self.tools(&c.tools);
        let tool_choice = self.tool_choice(&c.tools.choice);
        let unapplied = |name: &str| c.unapplied(name).cloned().unwrap_or(Value::Null);
        let truncation = match c.truncation {
            Truncation::Auto => json!("auto"),
            Truncation::Disabled => json!("disabled"),
            Truncation::Retain(r) => json!({"type": "retention_ratio", "retention_ratio": r}),
        };
        let id = &view.id;
        let tokens = c.max_tokens.map_or(json!("inf"), |n| json!(n));
        let mut session = match self.flavor {
            Flavor::Ga => json!({
                "type": "realtime", "object": "realtime.session", "id": id, "model": self.model,
                "output_modalities": if c.audio_out { vec!["audio"] } else { vec!["text"] },
                "instructions": c.instructions,
                "audio": {
                    "input": {"format": ga_format(c.input_coding, c.input_rate), "turn_detection": vad,
                              "transcription": c.transcription,
                              "noise_reduction": unapplied("audio.input.noise_reduction")},
                    "output": {"format": ga_format(c.output_coding, OUTPUT_RATE), "voice": c.voice,
                               "speed": c.unapplied("audio.output.speed").cloned().unwrap_or(json!(1.0))},
                },
                "tools": tools, "tool_choice": tool_choice, "max_output_tokens": tokens,
                "tracing": unapplied("tracing"), "truncation": truncation, "prompt": unapplied("prompt"),
            }),
            Flavor::Beta | Flavor::Qwen => {
                let (input, output) =
                    (coding::name(c.input_coding, self.flavor), coding::name(c.output_coding, self.flavor));
                let mut session = json!({
                    "id": id, "object": "realtime.session", "model": self.model,
                    "modalities": if c.audio_out { vec!["text", "audio"] } else { vec!["text"] },
                    "instructions": c.instructions, "voice": c.voice,
                    "input_audio_format": input, "output_audio_format": output,
                    "input_audio_transcription": c.transcription, "turn_detection": vad,
                    "tools": tools, "tool_choice": tool_choice, "temperature": c.temperature.unwrap_or(0.8),
                });
                if self.flavor == Flavor::Beta {
                    session["input_audio_noise_reduction"] = unapplied("input_audio_noise_reduction");
                    session["speed"] = c.unapplied("speed").cloned().unwrap_or(json!(1.0));
                    session["tracing"] = unapplied("tracing");
                    session["truncation"] = truncation;
                }
                if self.flavor == Flavor::Qwen {
                    // Qwen's session objects always show search and the sampling settings (the
                    // values in force: the client's, else the document's defaults), and spell the
                    // token limit so.
                    session["enable_search"] = json!(false);
                    session["search_options"] = json!({});
                    session["max_response_output_token"] = tokens;
                    session["max_tokens"] = json!(c.max_tokens.unwrap_or(QWEN_MAX_TOKENS));
                    for (name, value) in qwen_defaults() {
                        session[name] = value;
                    }
                } else {
                    session["max_response_output_tokens"] = tokens;
                }
                session
            }
        };
        // The settings given by name, as given.
        for (name, value) in c.settings.iter() {
            session[name] = value.clone();
        }
        session
    }

    /// An assistant's answer as an item's content part (GA: `output_audio`/`output_text`). Its
    /// text is `transcript` for audio in OpenAI's flavors and in Qwen's `response.done`; Qwen's
    /// content part and output item events show it as `text` (`in_done` false).
    fn answer_part(&self, audio: bool, text: &str, in_done: bool) -> Value {
        let key = if audio && (self.flavor != Flavor::Qwen || in_done) { "transcript" } else { "text" };
        let mut part = json!({"type": self.flavor.part_type(audio)});
        part[key] = json!(text);
        part
    }

    /// An answer's part in `response.content_part.*` events: `audio` or `text` in every
    /// flavor (the GA types take those there, and `output_*` only in items).
    fn content_part(&self, audio: bool, text: &str, in_done: bool) -> Value {
        let mut part = self.answer_part(audio, text, in_done && self.flavor != Flavor::Qwen);
        part["type"] = json!(if audio { "audio" } else { "text" });
        part
    }

    fn part(&self, part: &Part, in_done: bool) -> Value {
        match part {
            Part::Text { kind, text } => json!({"type": kind.as_str(), "text": text}),
            Part::InputAudio { transcript, .. } => json!({"type": "input_audio", "transcript": transcript}),
            Part::InputImage => json!({"type": "input_image"}),
            Part::Answer { audio, text, .. } => self.answer_part(*audio, text, in_done),
        }
    }

    /// The tools in the flavor's shape: OpenAI's flat functions, Qwen's nested ones.
    fn tools(&self, tools: &Tools) -> Value {
        let list = tools.functions.iter().map(|t| {
            let parameters: Value = serde_json::from_str(&t.parameters).unwrap_or(Value::Null);
            let f = json!({"name": t.name, "description": t.description, "parameters": parameters});
            if self.flavor == Flavor::Qwen {
                json!({"type": "function", "function": f})
            } else {
                let mut f = f;
                f["type"] = json!("function");
                f
            }
        });
        Value::Array(list.collect())
    }

    fn tool_choice(&self, choice: &ToolChoice) -> Value {
        match choice {
            ToolChoice::Function(name) => json!({"type": "function", "name": name}),
            other => json!(other.as_str()),
        }
    }

    /// An item as the flavor shows it (`in_done`: in `response.done`'s output).
    fn item(&self, item: &Item, in_done: bool) -> Value {
        let status = item.status.as_str();
        match &item.body {
            ItemBody::Message { role, parts } => {
                let role = match role {
                    Role::System => "system",
                    Role::User | Role::Tool => "user",
                    Role::Assistant => "assistant",
                };
                let content: Vec<Value> = parts.iter().map(|p| self.part(p, in_done)).collect();
                json!({"id": item.id, "object": "realtime.item", "type": "message", "status": status,
                       "role": role, "content": content})
            }
            ItemBody::FunctionCall { call_id, name, arguments } => json!({
                "id": item.id, "object": "realtime.item", "type": "function_call", "status": status,
                "call_id": call_id, "name": name, "arguments": arguments,
            }),
            ItemBody::FunctionCallOutput { call_id, output } => json!({
                "id": item.id, "object": "realtime.item", "type": "function_call_output", "status": status,
                "call_id": call_id, "output": output,
            }),
        }
    }

    /// A response's status as the flavor names it: Qwen lists completed, failed, in_progress
    /// and incomplete, so a response cut short (barge-in, `response.cancel`) is `incomplete`
    /// there and `cancelled` in OpenAI's.
    fn status(&self, status: ResponseStatus) -> &'static str {
        match status {
            ResponseStatus::InProgress => "in_progress",
            ResponseStatus::Completed => "completed",
            ResponseStatus::Failed => "failed",
            ResponseStatus::Cancelled if self.flavor == Flavor::Qwen => "incomplete",
            ResponseStatus::Cancelled => "cancelled",
            ResponseStatus::Incomplete => "incomplete",
        }
    }

    /// `usage` of `response.done`, in the flavor's spelling.
    fn usage(&self, u: &Usage) -> Value {
        let mut usage = json!({"total_tokens": u.input + u.output, "input_tokens": u.input, "output_tokens": u.output});
        let (input_details, output_details) = if self.flavor == Flavor::Qwen {
            // Qwen's spelling.
            ("input_tokens_details", "output_tokens_details")
        } else {
            ("input_token_details", "output_token_details")
        };
        usage[input_details] =
            json!({"text_tokens": u.input.saturating_sub(u.input_audio), "audio_tokens": u.input_audio});
        if self.flavor != Flavor::Qwen {
            usage[input_details]["cached_tokens"] = json!(0);
        }
        usage[output_details] = json!({"text_tokens": u.output_text, "audio_tokens": u.output_audio});
        usage
    }

    fn response_object(&self, r: &ResponseView) -> Value {
        let status = self.status(r.status);
        let output: Vec<Value> = r.output.iter().map(|i| self.item(i, true)).collect();
        let status_details = match (r.status, r.reason) {
            (ResponseStatus::Failed, reason) => Some(json!({"type": "failed",
                "error": {"type": "server_error", "code": reason.unwrap_or("inference_error")}})),
            (_, Some(reason)) => Some(json!({"type": status, "reason": reason})),
            (_, None) => None,
        };
        let metadata =
            r.metadata.as_ref().map(|m| Value::Object(m.iter().map(|(k, v)| (k.clone(), json!(v))).collect()));
        let mut obj = json!({
            "id": r.id, "object": "realtime.response", "status": status,
            "status_details": status_details, "metadata": metadata,
            "output": output, "conversation_id": r.conversation_id, "voice": r.voice,
            "usage": r.usage.as_ref().map_or(Value::Null, |u| self.usage(u)),
        });
        if self.flavor != Flavor::Qwen {
            obj["max_output_tokens"] = r.max_tokens.map_or(json!("inf"), |n| json!(n));
        }
        if self.flavor.ga() {
            obj["output_modalities"] = json!(if r.audio { vec!["audio"] } else { vec!["text"] });
        } else {
            obj["modalities"] = json!(if r.audio { vec!["text", "audio"] } else { vec!["text"] });
            obj["output_audio_format"] = json!(coding::name(self.output, self.flavor));
        }
        obj
    }

    /// An error in the OpenAI shape, its `param` taken from the message, its code in the
    /// flavor's names.
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
        let code = match e.code() {
            // The names OpenAI's and Qwen's documents use.
            "invalid_payload" => "invalid_value",
            "missing_field" => "missing_required_parameter",
            code => code,
        };
        self.event(
            "error",
            json!({"error": {"type": kind, "code": code, "message": message, "param": param, "event_id": client_event}}),
        )
    }
}
