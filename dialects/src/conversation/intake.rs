//! The caller's audio on its way to the model, resampled to the backend's 16 kHz: with server
//! VAD gathered into duplex steps (one second, or the backend's own step), without it buffered
//! until the client commits it as a user item; and the images waiting for the next step or
//! item.

use std::time::{Duration, Instant};

use omni_actors::audio::StreamResampler;
use omni_actors::domain::{ChatMessage, DuplexChunk, Role};
use omni_actors::protocol::{Inbound, ProtocolError};

use super::events::Event;
use super::held::Counted;
use super::items::Item;
use super::sync::Pending;
use super::{Driver, Phase};

/// The client counts as idle (it stopped sending) after this long without audio.
pub const IDLE: Duration = Duration::from_millis(300);

pub struct Intake {
    resampler: StreamResampler,
    /// The rate the resampler takes.
    rate: u32,
    /// Server VAD: audio not yet a whole step.
    step: Vec<f32>,
    /// Manual turns: audio not yet committed.
    buffer: Vec<f32>,
    /// Images not yet sent with a step or committed with an item.
    frames: Counted<Vec<u8>>,
    /// Audio came at least once (an image before any is refused).
    heard_audio: bool,
    last_audio: Option<Instant>,
    /// The caller was told its voice is dropped while it waits.
    told_dropped: bool,
}

impl Intake {
    pub fn new(rate: u32) -> Intake {
        Intake {
            resampler: StreamResampler::new(rate, 16000).expect("valid default rates"),
            rate,
            step: Vec::new(),
            buffer: Vec::new(),
            frames: Counted::default(),
            heard_audio: false,
            last_audio: None,
            told_dropped: false,
        }
    }

    /// Bytes held: audio not yet committed, images not yet sent.
    pub fn bytes(&self) -> usize {
        self.buffer.len() * 4 + self.frames.bytes()
    }

    /// The resampler takes audio at `rate` from now on.
    fn follow(&mut self, rate: u32) -> Result<(), ProtocolError> {
        if rate != self.rate {
            self.resampler =
                StreamResampler::new(rate, 16000).map_err(|e| ProtocolError::InvalidPayload(format!("audio: {e}")))?;
            self.rate = rate;
        }
        Ok(())
    }

    /// Forgets what is gathered for the next step (the backend starts over).
    pub fn drop_step(&mut self) {
        self.step.clear();
    }

    /// Forgets the audio not yet committed (`input_audio_buffer.clear`).
    pub fn clear(&mut self) {
        self.buffer.clear();
        self.step.clear();
    }

    /// The client stopped sending audio (or never sent any).
    pub fn client_idle(&self, now: Instant) -> bool {
        self.last_audio.is_none_or(|t| now.duration_since(t) >= IDLE)
    }

    /// Whole steps of what is gathered, each chunk at most a second (or one step): a large
    /// append to a backend with small steps is not a burst of chunks its backlog would drop.
    fn whole_steps(&mut self, step: usize) -> Vec<Vec<f32>> {
        let most = step.max(16000) / step * step;
        let mut chunks = Vec::new();
        while self.step.len() >= step {
            let whole = (self.step.len() / step * step).min(most);
            let rest = self.step.split_off(whole);
            chunks.push(std::mem::replace(&mut self.step, rest));
        }
        chunks
    }

    /// What is gathered, padded with silence to whole steps (at least one).
    fn padded(&mut self, step: usize) -> Vec<f32> {
        let mut samples = std::mem::take(&mut self.step);
        samples.resize(samples.len().div_ceil(step).max(1) * step, 0.0);
        samples
    }
}

impl Driver {
    /// The caller's audio at `rate`: resampled, then gathered into steps (server VAD, its
    /// speech edges found on the way) or buffered until a commit.
    pub(super) fn audio(&mut self, pcm: &[f32], rate: u32, now: Instant) -> Result<(), ProtocolError> {
        omni_actors::audio::check_rate(rate as u64)
            .map_err(|e| ProtocolError::InvalidPayload(format!("audio: {e}")))?;
        if self.setup.conf.vad.is_none() {
            let bytes = (pcm.len() as u64 * 16000 / rate as u64 * 4) as usize;
            self.admit("input_audio_buffer.append", "audio_buffer", bytes)?;
        }
        self.intake.follow(rate)?;
        let mut samples = Vec::with_capacity(pcm.len() * 16000 / rate as usize + 1);
        self.intake.resampler.push(pcm, &mut samples);
        self.intake.heard_audio = true;
        self.intake.last_audio = Some(now);
        self.recorded = Some((vec![samples.clone()], Vec::new()));
        if self.setup.conf.vad.is_none() {
            self.intake.buffer.extend_from_slice(&samples);
            return Ok(());
        }
        self.detect_speech(&samples);
        self.intake.step.extend_from_slice(&samples);
        for chunk in self.intake.whole_steps(self.step_len()) {
            self.send_step(chunk, false);
        }
        Ok(())
    }

    /// Manual turns: the audio so far becomes a user item. With server VAD the model decides;
    /// a commit only flushes what is gathered.
    pub(super) fn commit(&mut self, now: Instant) -> Result<(), ProtocolError> {
        if self.setup.conf.vad.is_some() {
            self.flush_step(now);
            return Ok(());
        }
        self.intake.resampler.flush(&mut self.intake.buffer);
        if self.intake.buffer.is_empty() {
            return Err(ProtocolError::Refused {
                code: "input_audio_buffer_commit_empty",
                message: "input_audio_buffer.commit: the buffer is empty (append audio first)".into(),
            });
        }
        let item_id = self.conversation.new_item_id();
        self.responses.audio_item = Some(item_id.clone());
        let audio = std::mem::take(&mut self.intake.buffer);
        let audio_ms = audio.len() as u64 / 16;
        let images = self.intake.frames.take();
        let message = ChatMessage { images, audios: vec![audio], ..ChatMessage::text(Role::User, "") };
        self.sync.pending.push(Pending { item_id: item_id.clone(), message });
        let item = Item::user_audio(item_id.clone(), None, audio_ms);
        let previous_item_id = self.conversation.push(item.clone());
        self.say(Event::Committed { item_id, previous_item_id: previous_item_id.clone() });
        self.say(Event::ItemAdded { previous_item_id, item });
        Ok(())
    }

    /// Whether an image may come now: not before the first audio.
    pub fn image_allowed(&self) -> Result<(), ProtocolError> {
        if self.intake.heard_audio {
            Ok(())
        } else {
            Err(ProtocolError::NotReady("input_image_buffer.append: send audio before the first image".into()))
        }
    }

    /// An image for the next step (server VAD) or the next committed item.
    pub(super) fn image(&mut self, jpeg: Vec<u8>) -> Result<(), ProtocolError> {
        self.image_allowed()?;
        self.recorded = Some((Vec::new(), vec![jpeg.clone()]));
        self.intake.frames.push(jpeg);
        Ok(())
    }

    /// Sends a duplex step, with the images waiting.
    pub(super) fn send_step(&mut self, samples: Vec<f32>, force_listen: bool) {
        self.pacer.sent(samples.len());
        // Without create_response the model never takes the floor by itself: the client asks
        // (a response asked of a voice that takes no typed turns is its to speak).
        let asked = self.responses.current.as_ref().is_some_and(|r| r.waits_until.is_some());
        let force_listen = force_listen || (!asked && self.setup.conf.vad.as_ref().is_some_and(|v| !v.create_response));
        let frames = self.intake.frames.take();
        self.send(Inbound::Chunk(DuplexChunk {
            audio: samples,
            frames,
            force_listen,
            max_slice_nums: None,
            audio_base64: None,
        }));
    }

    /// Sends what is gathered, padded with silence to whole steps (the client stopped sending).
    pub(super) fn pad_step(&mut self, now: Instant) {
        let samples = self.intake.padded(self.step_len());
        self.pacer.padded(now, self.step_duration());
        self.send_step(samples, false);
    }

    /// Sends what is gathered, if anything (a commit or a response asked for under server VAD).
    pub(super) fn flush_step(&mut self, now: Instant) {
        if !self.intake.step.is_empty() {
            self.pad_step(now);
        }
    }

    /// Whether the session is created (audio goes to the backend as it comes).
    pub fn active(&self) -> bool {
        self.life.phase == Phase::Active
    }

    /// A caller's voice heard before the session was created (queued, or being prepared) was
    /// dropped: the first time it was
    /// `voiced`, the caller is told (`not_ready`, as a WebSocket client's input before
    /// `session.created` is).
    pub fn dropped_before_created(&mut self, voiced: bool) {
        if voiced && !self.intake.told_dropped {
            self.intake.told_dropped = true;
            self.events.push(Event::Error(ProtocolError::NotReady(
                "the caller's voice is not kept until the session is created (it waits for a worker): it is heard from session.created on"
                    .into(),
            )));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gathered_audio_leaves_in_whole_steps_of_at_most_a_second() {
        let mut intake = Intake::new(16000);
        intake.step = vec![0.0; 60000];
        let sizes: Vec<usize> = intake.whole_steps(3200).iter().map(Vec::len).collect();
        assert_eq!(sizes, [16000, 16000, 16000, 9600]);
        assert_eq!(intake.step.len(), 2400, "less than a step waits");
        assert_eq!(intake.padded(3200).len(), 3200, "padded to a whole step");
        assert_eq!(intake.padded(3200).len(), 3200, "nothing gathered: one step of silence");
    }

    #[test]
    fn the_client_is_idle_300_ms_after_its_last_audio() {
        let mut intake = Intake::new(16000);
        let t = Instant::now();
        assert!(intake.client_idle(t), "never sent");
        intake.last_audio = Some(t);
        assert!(!intake.client_idle(t + IDLE / 2));
        assert!(intake.client_idle(t + IDLE));
    }
}
