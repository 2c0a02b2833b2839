//! The user's turns under server VAD: the gateway's voice activity detector finds the edges
//! of the user's speech in the input ([`SpeechFinder`]); a speech onset opens a turn (and cuts
//! a duplex answer short: barge-in), the silence after it commits the turn as a user item,
//! and the model's decision to speak closes any turn still open. What the model heard of a
//! turn (its transcript) comes with its answer, or from the gateway's own recogniser.

use std::time::{Duration, Instant};

use omni_actors::edge::vad::{Edge, SharedDetectors};
use omni_actors::protocol::Inbound;

use super::Driver;
use super::events::{Event, TranscriptionFailure};
use super::items::Item;
use crate::speech::SpeechFinder;

/// The user's spoken turn in progress.
#[derive(Debug)]
pub struct UserTurn {
    pub item_id: String,
    pub start_ms: u64,
    /// Its `speech_started` was sent (a turn the detector did not hear is announced when the
    /// model answers it).
    pub announced: bool,
}

pub struct TurnDetection {
    speech: SpeechFinder,
    /// The user's speech in progress (started, not yet stopped or answered).
    pub user: Option<UserTurn>,
    /// The user spoke and the model has not answered since.
    pub unanswered: bool,
    /// The newest user item committed at the end of its speech, waiting for what the model
    /// heard (it says so when it answers).
    awaiting_transcript: Option<String>,
    /// What the duplex model said it heard since the last user item.
    heard: Option<String>,
    /// The gateway runs a recogniser (`[transcription]`).
    pub gateway_asr: bool,
    /// Since when nobody spoke (the model's answer ended, or the user's speech): what
    /// `idle_timeout_ms` counts from; `None` while someone speaks.
    pub quiet_since: Option<Instant>,
}

impl TurnDetection {
    pub fn new(voice: &SharedDetectors) -> TurnDetection {
        TurnDetection {
            speech: SpeechFinder::new(voice),
            user: None,
            unanswered: false,
            awaiting_transcript: None,
            heard: None,
            gateway_asr: false,
            quiet_since: None,
        }
    }
}

impl Driver {
    /// The voice activity detector on the 16 kHz input: the edges of the user's speech.
    pub(super) fn detect_speech(&mut self, samples: &[f32]) {
        let Some(rules) = self.setup.conf.edge_rules() else { return };
        let keep = self.gateway_transcribes();
        for edge in self.turns.speech.hear(samples, &rules, keep) {
            match edge {
                Edge::Started { audio_start_ms } => self.speech_started(audio_start_ms),
                Edge::Stopped { audio_end_ms } => self.speech_stopped(audio_end_ms),
            }
        }
        self.turns.speech.trim(self.turns.user.is_some(), rules.prefix_padding_ms);
    }

    /// The gateway transcribes this session's user turns (its backend does not): the client
    /// asked for transcripts, or a decider reads them.
    fn gateway_transcribes(&self) -> bool {
        self.turns.gateway_asr
            && (self.setup.conf.transcription.is_some() || self.decides())
            && self.life.backend.as_ref().is_some_and(|b| !b.transcripts)
    }

    /// The user's speech from `start_ms` to `end_ms`, to the gateway's transcription.
    fn transcribe_turn(&mut self, item_id: &str, start_ms: u64, end_ms: u64) {
        let audio = self.turns.speech.speech(start_ms, end_ms);
        self.commands.push(Inbound::Transcribe { item_id: item_id.to_string(), audio });
    }

    /// Speech starts: a new user turn; over the model's answer, a barge-in.
    fn speech_started(&mut self, start_ms: u64) {
        if self.turns.user.is_some() {
            return;
        }
        let interrupts = self.setup.conf.vad.as_ref().is_none_or(|v| v.interrupt_response);
        if interrupts && self.responses.current.is_some() {
            // Barge-in: the answer in flight is cancelled, the backend listens.
            self.cut_response("turn_detected");
        } else if interrupts && self.active() {
            // Whatever of the model's voice an edge still plays stops now.
            self.events.push(Event::VoiceCleared);
        }
        self.turns.quiet_since = None;
        let item_id = self.conversation.new_item_id();
        self.turns.user = Some(UserTurn { item_id: item_id.clone(), start_ms, announced: true });
        self.turns.unanswered = true;
        self.pacer.speech_began();
        self.say(Event::SpeechStarted { audio_start_ms: start_ms, item_id });
    }

    /// Speech stops: the user's turn is committed as an item, whether or not the model answers.
    fn speech_stopped(&mut self, end_ms: u64) {
        let Some(user) = self.turns.user.take() else { return };
        self.turns.quiet_since = Some(Instant::now());
        let UserTurn { item_id, start_ms, .. } = user;
        self.say(Event::SpeechStopped { audio_end_ms: end_ms, item_id: item_id.clone() });
        let item = Item::user_audio(item_id.clone(), None, end_ms.saturating_sub(start_ms));
        let previous_item_id = self.conversation.push(item.clone());
        self.say(Event::Committed { item_id: item_id.clone(), previous_item_id: previous_item_id.clone() });
        self.say(Event::ItemAdded { previous_item_id, item });
        if self.gateway_transcribes() {
            self.transcribe_turn(&item_id, start_ms, end_ms);
        } else if self.life.backend.as_ref().is_some_and(|b| !b.transcripts) {
            // Nothing will come: says so now.
            self.transcribed(&item_id, None);
        } else if let Some(older) = self.turns.awaiting_transcript.replace(item_id) {
            // Two turns before an answer: the older one gets what was heard so far.
            let heard = self.turns.heard.take();
            self.transcribed(&older, heard.as_deref());
        }
    }

    /// The duplex model takes the floor: whatever the user says from now on is a new turn, and
    /// the turn it answers is closed (with what it heard) if the detector had not closed it.
    pub(super) fn model_takes_the_floor(&mut self) {
        let in_speech = self.turns.speech.in_speech();
        self.turns.speech.end();
        let answered_a_turn = std::mem::take(&mut self.turns.unanswered);
        let awaiting = self.turns.awaiting_transcript.take();
        match (self.turns.user.take(), awaiting) {
            (None, Some(item_id)) => {
                // The turn was committed at the end of its speech; this is what was heard.
                let heard = self.turns.heard.take();
                self.transcribed(&item_id, heard.as_deref());
            }
            // The turn was committed at the end of its speech, and its transcript is settled
            // (the gateway's, or none from this model).
            (None, None) if answered_a_turn => {}
            (user, awaiting) => {
                if let Some(older) = awaiting {
                    self.transcribed(&older, None);
                }
                // Speech in progress ends at its last voiced window; a turn the detector did not
                // hear (the model answered a sound it took for speech) ends now.
                let received = self.turns.speech.received_ms();
                let end_ms = if in_speech { self.turns.speech.speech_end_ms() } else { received };
                let user = user.unwrap_or_else(|| UserTurn {
                    item_id: self.conversation.new_item_id(),
                    start_ms: received.saturating_sub(1000),
                    announced: false,
                });
                self.close_user_turn(user, end_ms);
            }
        }
    }

    /// The user's turn ends as the model answers: its events, with what the model heard.
    fn close_user_turn(&mut self, user: UserTurn, end_ms: u64) {
        let UserTurn { item_id, start_ms, announced } = user;
        if !announced {
            self.unheard_turn(&item_id);
            self.say(Event::SpeechStarted { audio_start_ms: start_ms, item_id: item_id.clone() });
        }
        self.say(Event::SpeechStopped { audio_end_ms: end_ms, item_id: item_id.clone() });
        // What the model heard of this turn, when it says.
        let heard = self.turns.heard.take().filter(|_| self.setup.conf.transcription.is_some() || self.decides());
        let item = Item::user_audio(item_id.clone(), heard.clone(), end_ms.saturating_sub(start_ms));
        let previous_item_id = self.conversation.push(item.clone());
        self.say(Event::Committed { item_id: item_id.clone(), previous_item_id: previous_item_id.clone() });
        self.say(Event::ItemAdded { previous_item_id, item });
        if self.gateway_transcribes() {
            self.transcribe_turn(&item_id, start_ms, end_ms);
        } else {
            self.transcribed(&item_id, heard.as_deref());
        }
    }

    /// What became of the transcription of a user item's audio: the words, or that there are
    /// none (the model does not transcribe, or reported nothing).
    pub(super) fn transcribed(&mut self, item_id: &str, text: Option<&str>) {
        if let Some(text) = text.filter(|_| self.decides()) {
            self.conversation.heard(item_id, text);
            self.decide_turn(item_id);
        }
        if self.setup.conf.transcription.is_none() {
            return;
        }
        let item_id = item_id.to_string();
        let event = match text {
            Some(text) => {
                self.conversation.heard(&item_id, text);
                let seconds = self.conversation.audio_seconds(&item_id);
                Event::TranscriptionCompleted { item_id, transcript: text.to_string(), seconds }
            }
            None => match &self.life.backend {
                Some(b) if !b.transcripts => Event::TranscriptionFailed {
                    item_id,
                    failure: TranscriptionFailure::Unavailable,
                    message: format!(
                        "the model ({}) does not transcribe speech, and the gateway's own transcription is off",
                        b.name
                    ),
                },
                _ => Event::TranscriptionFailed {
                    item_id,
                    failure: TranscriptionFailure::Failed,
                    message: "the model reported no transcript of this audio".into(),
                },
            },
        };
        self.say(event);
    }

    /// Time passes under server VAD with `idle_timeout_ms`: after that long without speech (once
    /// the model is done), the silence becomes a user item and the model is asked to answer
    /// (`input_audio_buffer.timeout_triggered`).
    pub(super) fn idle_timeout(&mut self, now: Instant) {
        let Some(timeout) = self.setup.conf.vad.as_ref().and_then(|v| v.idle_timeout_ms) else { return };
        if self.turns.user.is_some() || self.responses.current.is_some() {
            return;
        }
        let since = *self.turns.quiet_since.get_or_insert(now);
        if now.duration_since(since) < Duration::from_millis(timeout) {
            return;
        }
        self.turns.quiet_since = None;
        let audio_end_ms = self.turns.speech.received_ms();
        let audio_start_ms = audio_end_ms.saturating_sub(timeout);
        let item_id = self.conversation.new_item_id();
        self.say(Event::IdleTimeout { item_id: item_id.clone(), audio_start_ms, audio_end_ms });
        let item = Item::user_audio(item_id.clone(), None, audio_end_ms - audio_start_ms);
        let previous_item_id = self.conversation.push(item.clone());
        self.say(Event::Committed { item_id, previous_item_id: previous_item_id.clone() });
        self.say(Event::ItemAdded { previous_item_id, item });
        if self.holds_conversations() {
            if let Err(e) = self.create_response(super::ResponseRequest::default(), now) {
                self.events.push(Event::Error(e));
            }
        } else {
            // A duplex model decides for itself: it hears the silence at once.
            self.pad_step(now);
        }
    }

    /// What the duplex model heard the user say (reported with a step): it belongs to the user
    /// item the next response commits.
    pub fn model_heard(&mut self, text: &str) {
        let heard = self.turns.heard.get_or_insert_with(String::new);
        if !heard.is_empty() {
            heard.push(' ');
        }
        heard.push_str(text);
    }

    /// What the model heard of a turn-mode answer's newest user audio item.
    pub fn turn_heard(&mut self, text: &str) {
        if let Some(item) = self.responses.turns.front_mut().and_then(|t| t.transcript_item.take()) {
            self.transcribed(&item, Some(text));
        }
    }

    /// The gateway's own transcript of a user item (its backend does not transcribe): a delta
    /// and `completed`, or `failed` with the reason.
    pub fn gateway_transcribed(&mut self, item_id: &str, result: Result<&str, &str>) {
        if let Ok(text) = result
            && !text.trim().is_empty()
            && self.decides()
        {
            // The decider reads it whether or not the client asked for transcripts.
            self.conversation.heard(item_id, text);
            self.decide_turn(item_id);
        }
        if self.setup.conf.transcription.is_none() {
            return;
        }
        let item_id = item_id.to_string();
        match result {
            Ok(text) => {
                self.conversation.heard(&item_id, text);
                let seconds = self.conversation.audio_seconds(&item_id);
                self.say(Event::TranscriptionDelta { item_id: item_id.clone(), delta: text.to_string() });
                self.say(Event::TranscriptionCompleted { item_id, transcript: text.to_string(), seconds });
            }
            Err(why) => self.say(Event::TranscriptionFailed {
                item_id,
                failure: TranscriptionFailure::Failed,
                message: why.to_string(),
            }),
        }
    }
}
