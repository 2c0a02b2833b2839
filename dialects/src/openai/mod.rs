//! The OpenAI Realtime API shape, in three flavors: OpenAI GA, OpenAI beta
//! (`OpenAI-Beta: realtime=v1`) and Qwen-Omni-Realtime (DashScope). A codec: client events'
//! JSON into the conversation driver's typed commands ([`decode`]), its typed events into each
//! flavor's JSON ([`encode`]); the conversation itself (turns, responses, pacing, what is held
//! before the session is created) is the driver's (`crate::conversation`), shared by
//! every flavor.
//!
//! For an edge that carries audio itself (a WebRTC call), the caller's voice comes as samples
//! and the model's goes as samples: no event carries audio either way, and the session's audio
//! formats are the edge's.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Instant;

use omni_actors::audio::g711::Law;
use omni_actors::edge::client::{CallSettings, CallerAudio, Keypress, ModelAudio, Playback};
use omni_actors::edge::dialect::{DecodeError, Dialect, Outbox};
use omni_actors::edge::redact::RecordedMedia;
use omni_actors::edge::redact::Redact;
use omni_actors::edge::vad::SharedDetectors;
use omni_actors::protocol::{Inbound, Outbound};
use serde_json::Value;

/// A call's voice dropped while it waits is told to the caller only when it is more than
/// digital silence (a page's muted track sends zeros).
const VOICED: f32 = 1e-3;

use super::Limits;
use super::conversation::{Coding, Command, Driver, Event, OUTPUT_RATE};
use super::record::{AudioEncoding, JsonRedactor};
use super::wire;
use decode::Decoded;
use encode::Encoder;

mod coding;
mod conf;
mod decode;
mod encode;
#[cfg(test)]
mod tests;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    Ga,
    Beta,
    Qwen,
}

impl Flavor {
    fn name(self) -> &'static str {
        match self {
            Flavor::Ga => "openai",
            Flavor::Beta => "openai-beta",
            Flavor::Qwen => "qwen",
        }
    }
    fn ga(self) -> bool {
        self == Flavor::Ga
    }
    fn default_input_rate(self) -> u32 {
        if self == Flavor::Qwen { 16000 } else { 24000 }
    }
    fn audio_delta(self) -> &'static str {
        if self.ga() { "response.output_audio.delta" } else { "response.audio.delta" }
    }
    fn audio_done(self) -> &'static str {
        if self.ga() { "response.output_audio.done" } else { "response.audio.done" }
    }
    fn transcript_delta(self) -> &'static str {
        if self.ga() { "response.output_audio_transcript.delta" } else { "response.audio_transcript.delta" }
    }
    fn transcript_done(self) -> &'static str {
        if self.ga() { "response.output_audio_transcript.done" } else { "response.audio_transcript.done" }
    }
    fn text_delta(self) -> &'static str {
        if self.ga() { "response.output_text.delta" } else { "response.text.delta" }
    }
    fn text_done(self) -> &'static str {
        if self.ga() { "response.output_text.done" } else { "response.text.done" }
    }
    fn item_created(self) -> &'static str {
        if self.ga() { "conversation.item.added" } else { "conversation.item.created" }
    }
    /// Content part type of an assistant answer in an item.
    fn part_type(self, audio: bool) -> &'static str {
        match (self.ga(), audio) {
            (true, true) => "output_audio",
            (true, false) => "output_text",
            (false, true) => "audio",
            (false, false) => "text",
        }
    }
}

/// The dialect of one session: its codec and its conversation.
pub struct Realtime {
    encoder: Encoder,
    driver: Driver,
    /// The session's edge carries audio itself.
    carries_audio: bool,
    /// How the model's audio is coded in the frames, for the recording's redactor
    /// ([`AudioEncoding`] as a number).
    recorded_output: Arc<AtomicU8>,
    /// The client's `output_audio_buffer.clear` the next `cleared` answers (its `event_id`).
    clear_asked: Option<Option<String>>,
}

impl Realtime {
    pub fn new(flavor: Flavor, model: &str, limits: Limits, voice: &SharedDetectors) -> Realtime {
        Realtime {
            encoder: Encoder::new(flavor, model),
            driver: Driver::new(conf::defaults(flavor), limits, voice),
            carries_audio: false,
            recorded_output: Arc::new(AtomicU8::new(AudioEncoding::Pcm16 as u8)),
            clear_asked: None,
        }
    }

    /// The gateway transcribes user turns for backends that do not (`[transcription]` is on).
    pub fn with_gateway_transcription(mut self, on: bool) -> Realtime {
        self.driver = self.driver.with_gateway_transcription(on);
        self
    }

    /// A decider calls the session's tools when its backend calls none (`[delegation]` is on).
    pub fn with_delegation(mut self, on: bool) -> Realtime {
        self.driver = self.driver.with_delegation(on);
        self
    }

    /// The public mode sessions of this dialect queue for.
    pub fn mode() -> omni_actors::domain::Mode {
        Driver::mode()
    }

    /// Whether this session tells its client what it heard (`output_audio_buffer.*`): the
    /// OpenAI flavors, on an edge that plays the voice itself (a WebRTC call).
    fn tells_playback(&self) -> bool {
        self.carries_audio && self.encoder.flavor != Flavor::Qwen
    }

    /// Renders what the driver said, in order (text only when it is read).
    fn render(&mut self, out: &mut Outbox) {
        // The model's voice in the coding the client asked for (a change applies from its next
        // piece), and the recording told how to read it.
        let output = self.driver.conf().output_coding;
        self.encoder.output = output;
        let recorded = match output {
            Coding::Pcm16 => AudioEncoding::Pcm16,
            Coding::G711(Law::Mu) => AudioEncoding::Ulaw,
            Coding::G711(Law::A) => AudioEncoding::Alaw,
        };
        self.recorded_output.store(recorded as u8, Ordering::Relaxed);
        for event in self.driver.take_events() {
            match event {
                Event::AudioDelta { at, samples } if self.carries_audio => {
                    out.audio(ModelAudio::Delta { response: at.response_id, samples, rate: OUTPUT_RATE })
                }
                Event::VoiceDone { response_id } if self.carries_audio => {
                    out.audio(ModelAudio::Done { response: response_id })
                }
                Event::VoiceCleared if self.carries_audio => out.audio(ModelAudio::Clear),
                _ if !out.wants_text() => {}
                Event::AudioDelta { at, samples } => {
                    let voiced = self.encoder.audio_delta(&at, &samples);
                    out.push_voiced(voiced.text, voiced.voice, voiced.samples);
                }
                event => {
                    // A G.711 voice's last piece goes before its `audio.done`.
                    if let Event::AudioDone { at } = &event
                        && let Some(tail) = self.encoder.voice_tail(at)
                    {
                        out.push(tail);
                    }
                    if let Some(frame) = self.encoder.encode(event) {
                        out.push(frame);
                    }
                }
            }
        }
    }

    /// Renders what the driver said, then the commands it issued on its own (in answer to an
    /// event or to time: a decode answers its commands itself).
    fn render_and_issue(&mut self, out: &mut Outbox) {
        self.render(out);
        out.commands(self.driver.take_commands());
    }
}

impl Dialect for Realtime {
    fn name(&self) -> &'static str {
        self.encoder.flavor.name()
    }

    fn redactor(&self) -> Arc<dyn Redact> {
        JsonRedactor::following(self.recorded_output.clone())
    }

    fn decode(&mut self, text: &bytestring::ByteString, replies: &mut Outbox) -> Result<Vec<Inbound>, DecodeError> {
        let kind = wire::event_type(text)?.into_owned();
        let v: Value = serde_json::from_str(text).map_err(|e| DecodeError::Unparseable(e.to_string()))?;
        self.encoder.client_event_id = v.get("event_id").and_then(Value::as_str).map(String::from);
        if !self.driver.active() && !matches!(kind.as_str(), "session.update" | "session.finish") {
            // Replies to anything else are held until the session is created.
            self.driver.admit(&kind, "replies", 1)?;
        }
        if kind == "output_audio_buffer.clear" && self.tells_playback() {
            // The voice the call plays stops at once; what was cut is told when the call says.
            self.clear_asked = Some(self.encoder.client_event_id.clone());
            replies.audio(ModelAudio::Clear);
            return Ok(Vec::new());
        }
        match decode::command(&kind, &v, &self.driver, self.encoder.flavor, self.carries_audio)? {
            Decoded::Command(command) => self.driver.command(command, Instant::now())?,
            Decoded::Finish => return Ok(vec![Inbound::Close { reason: Some("finished".into()) }]),
        }
        self.render(replies);
        Ok(self.driver.take_commands())
    }

    fn carry_audio(&mut self) -> bool {
        self.carries_audio = true;
        true
    }

    fn hear(&mut self, audio: CallerAudio, replies: &mut Outbox) -> Result<Vec<Inbound>, DecodeError> {
        self.encoder.client_event_id = None;
        if !self.driver.active() {
            // A call's microphone is live while it waits for a worker and while its session is
            // prepared: what is said then is not kept (the model would hear it late, as if just
            // said), and the caller is told once.
            let voiced = audio.samples.iter().any(|s| s.abs() > VOICED);
            self.driver.dropped_before_created(voiced);
            self.render(replies);
            return Ok(Vec::new());
        }
        let CallerAudio { samples, rate } = audio;
        self.driver.command(Command::Audio { samples, rate }, Instant::now())?;
        self.render(replies);
        Ok(self.driver.take_commands())
    }

    fn configure(&mut self, settings: CallSettings, replies: &mut Outbox) -> Result<Vec<Inbound>, DecodeError> {
        self.encoder.client_event_id = None;
        let conf = conf::configured(self.driver.conf(), &settings, self.encoder.flavor)?;
        self.driver.command(Command::Update(Box::new(conf)), Instant::now())?;
        self.render(replies);
        Ok(self.driver.take_commands())
    }

    fn played(&mut self, playback: Playback, out: &mut Outbox) {
        if !self.tells_playback() {
            return;
        }
        let (kind, response, asked) = match playback {
            Playback::Started { response } => ("started", response, None),
            Playback::Stopped { response } => ("stopped", response, None),
            Playback::Cleared { response } => {
                let asked = self.clear_asked.take().flatten();
                match response {
                    Some(response) => ("cleared", response, asked),
                    // Nothing was playing: nothing to tell.
                    None => return,
                }
            }
        };
        if out.wants_text() {
            out.push(self.encoder.playback(kind, &response, asked.as_deref()));
        }
    }

    fn press(&mut self, key: Keypress, replies: &mut Outbox) -> Result<Vec<Inbound>, DecodeError> {
        self.encoder.client_event_id = None;
        // A key pressed while the call waits for a worker is not kept, as its voice is not.
        if self.driver.active() {
            self.driver.command(Command::Key(key.key()), Instant::now())?;
            self.render(replies);
        }
        Ok(self.driver.take_commands())
    }

    fn encode(&mut self, event: Outbound<'_>, out: &mut Outbox) {
        // What the session hears now answers no client event of its own (an error of a
        // setting the backend took refers to no `event_id`, rather than to the last one read);
        // an error is the one of the event just read, when there is one.
        if !matches!(event, Outbound::Error(_)) {
            self.encoder.client_event_id = None;
        }
        let d = &mut self.driver;
        match event {
            Outbound::Queued(q) => d.queued(q, true),
            Outbound::QueueUpdate(q) => d.queued(q, false),
            Outbound::QueueDone => d.queue_done(),
            Outbound::Resumed { session_id, token, replayed, lost, voice_skipped_ms, away_ms } => {
                out.push(self.encoder.resumed(session_id, token, [replayed, lost, voice_skipped_ms, away_ms]))
            }
            Outbound::Created { session_id, backend, .. } => d.created(session_id, backend),
            Outbound::Reconfigured { backend, .. } => d.reconfigured(backend),
            Outbound::ReconfigureFailed(e) => d.reconfigure_failed(e),
            Outbound::UserTranscript { item_id, result } => d.gateway_transcribed(item_id, result),
            Outbound::Decided { id, result } => d.decided(id, result),
            Outbound::Transcript { response_id: None, text, .. } => d.model_heard(text),
            Outbound::Transcript { response_id: Some(_), text, .. } => d.turn_heard(text),
            Outbound::Step { outcome, .. } => d.step(outcome),
            Outbound::TurnDelta { text, audio, call, .. } => d.turn_delta(text, audio, call),
            Outbound::TurnDone {
                input_tokens,
                output_tokens,
                input_audio_tokens,
                output_audio_tokens,
                cancelled,
                ..
            } => d.turn_done([input_tokens, output_tokens, input_audio_tokens, output_audio_tokens], cancelled),
            Outbound::Error(e) => d.error(e),
            Outbound::TurnFailed { error, .. } => d.turn_failed(error),
            Outbound::Closed { reason, .. } => d.ended(reason),
        }
        self.render_and_issue(out);
    }

    fn take_recorded_media(&mut self) -> Option<RecordedMedia> {
        self.driver.take_recorded()
    }

    fn tick_interval(&self) -> Option<std::time::Duration> {
        Some(std::time::Duration::from_millis(100))
    }

    fn tick(&mut self, now: Instant, out: &mut Outbox) {
        self.encoder.client_event_id = None;
        self.driver.tick(now);
        self.render_and_issue(out);
    }

    fn context_full(&mut self, out: &mut Outbox) -> bool {
        self.encoder.client_event_id = None;
        let goes_on = self.driver.context_full();
        self.render_and_issue(out);
        goes_on
    }
}
