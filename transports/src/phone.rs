//! What the phone edges (a Twilio or Telnyx stream's, a SIP call's) share: which of their
//! session's notices are worth a log line (a phone line shows the caller none), and the model's
//! voice on its way to a telephony stream ([`StreamVoice`]).

use omni_actors::edge::client::Notice;

/// Logs an error the session told of the call (a setting of its route or its parameters the
/// session refused: a phone line has nowhere to show it): its code, never more (an error may
/// quote what the caller's app sent). `not_ready` (the caller spoke before the session was
/// created) is not worth one.
pub fn log_refusal(label: &str, notice: &Notice) {
    if let Notice::Error(e) = notice
        && e.code() != "not_ready"
    {
        log::warn!("session {label}: the session refused something of the call's: {}", e.code());
    }
}

/// The model's voice on its way to a telephony stream at 8 kHz (a Twilio or a Telnyx stream's
/// G.711), answer by answer: resampled with one stream resampler an answer (no edge at each
/// piece), what the provider may not have played yet (what a clear would cut), and the mark that
/// says it has played.
#[derive(Default)]
pub struct StreamVoice {
    downlink: Option<omni_actors::audio::StreamResampler>,
    /// Voice sent that the provider may not have played yet (no mark of it back).
    unplayed: bool,
    /// The last mark sent after the last voice: when it comes back, that voice has played.
    last_mark: Option<String>,
}

impl StreamVoice {
    /// A piece of an answer's voice (at `rate`), at 8 kHz.
    pub fn delta(&mut self, samples: &[f32], rate: u32) -> Vec<f32> {
        let mut narrow = Vec::with_capacity(samples.len() * 8000 / rate.max(1) as usize + 1);
        if self.downlink.is_none() {
            self.downlink = omni_actors::audio::StreamResampler::new(rate, 8000).ok();
        }
        if let Some(r) = self.downlink.as_mut() {
            r.push(samples, &mut narrow);
        }
        self.unplayed = true;
        // Only a mark sent after this voice says it played.
        self.last_mark = None;
        narrow
    }

    /// The answer's voice is done: the last of it at 8 kHz, to send before the mark named
    /// `response` (the provider sends the mark back once it played what came before).
    pub fn done(&mut self, response: String) -> (Vec<f32>, String) {
        let mut tail = Vec::new();
        if let Some(mut r) = self.downlink.take() {
            r.flush(&mut tail);
        }
        self.last_mark = Some(response.clone());
        (tail, response)
    }

    /// The voice is cleared (the caller spoke over it): whether the provider must be told to
    /// drop what it holds (only voice it may still be playing: a caller starting to speak with
    /// none is no barge-in).
    pub fn clear(&mut self) -> bool {
        self.downlink = None;
        std::mem::take(&mut self.unplayed)
    }

    /// The provider sent back mark `name`: the voice before the last one has played.
    pub fn marked(&mut self, name: &str) {
        if self.last_mark.as_deref() == Some(name) {
            self.unplayed = false;
        }
    }
}
