//! The model's voice on its way out of a call, as rules without a runtime: frames wait here
//! (already encoded) until the call's pacer takes one every 20 ms, and the rules say when to
//! tell the client `output_audio_buffer.started`, `.stopped` and `.cleared`.
//!
//! A response's audio starts playing with its first frame. It has stopped when its audio is
//! done and every frame has left. A clear (the user spoke over it, or the client asked)
//! drops every frame at once, so nothing more of it leaves after the current 20 ms, and
//! whatever more of that response arrives afterwards.

use std::collections::VecDeque;

/// One frame's length.
pub const FRAME_MS: u64 = 20;
/// Frames held at most: five minutes of voice. The model's audio is bounded by the session's
/// limits; this bounds what a call holds whatever they are. Frames past it are dropped.
pub const MAX_FRAMES: usize = 5 * 60 * 1000 / FRAME_MS as usize;

/// What the client is told about the output buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    Started { response_id: String },
    Stopped { response_id: String },
    Cleared { response_id: String },
}

#[derive(Debug)]
pub struct Playout<F> {
    frames: VecDeque<F>,
    /// The response whose audio is queued or playing, once its first frame left.
    playing: Option<String>,
    /// The response whose frames are queued (it may not have started).
    current: Option<String>,
    /// The current response's audio is all here.
    finished: bool,
    /// The response last cleared: the rest of its audio is not played.
    muted: Option<String>,
    /// Frames dropped over [`MAX_FRAMES`].
    pub dropped: u64,
}

impl<F> Default for Playout<F> {
    fn default() -> Self {
        Playout { frames: VecDeque::new(), playing: None, current: None, finished: false, muted: None, dropped: 0 }
    }
}

impl<F> Playout<F> {
    /// Frames of `response_id` arrive.
    pub fn push(&mut self, response_id: &str, frames: impl IntoIterator<Item = F>) {
        if self.muted.as_deref() == Some(response_id) {
            return;
        }
        if self.current.as_deref() != Some(response_id) {
            self.current = Some(response_id.to_string());
            self.finished = false;
        }
        for frame in frames {
            if self.frames.len() >= MAX_FRAMES {
                self.dropped += 1;
                continue;
            }
            self.frames.push_back(frame);
        }
    }

    /// The response's audio is complete: once the queue drains it has stopped.
    pub fn finish(&mut self, response_id: &str) -> Option<Notice> {
        if self.current.as_deref() == Some(response_id) {
            self.finished = true;
        }
        self.stopped_if_drained()
    }

    /// The pacer's tick: the frame to send, and what to tell the client.
    pub fn tick(&mut self) -> (Option<F>, Option<Notice>) {
        let Some(frame) = self.frames.pop_front() else {
            return (None, self.stopped_if_drained());
        };
        let started = match (&self.playing, &self.current) {
            (None, Some(id)) => {
                self.playing = Some(id.clone());
                Some(Notice::Started { response_id: id.clone() })
            }
            _ => None,
        };
        (Some(frame), started)
    }

    fn stopped_if_drained(&mut self) -> Option<Notice> {
        if self.frames.is_empty() && self.finished && self.playing.is_some() {
            self.finished = false;
            self.current = None;
            return self.playing.take().map(|response_id| Notice::Stopped { response_id });
        }
        None
    }

    /// Drops every frame: `Cleared` when some audio was playing or queued.
    pub fn clear(&mut self) -> Option<Notice> {
        let had = !self.frames.is_empty() || self.playing.is_some();
        self.frames.clear();
        self.finished = false;
        let id = self.playing.take().or_else(|| self.current.clone());
        self.current = None;
        if id.is_some() {
            self.muted = id.clone();
        }
        if had { id.map(|response_id| Notice::Cleared { response_id }) } else { None }
    }

    /// Whether the pacer has anything to do.
    pub fn busy(&self) -> bool {
        !self.frames.is_empty() || self.playing.is_some()
    }

    pub fn queued(&self) -> usize {
        self.frames.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn started(id: &str) -> Option<Notice> {
        Some(Notice::Started { response_id: id.into() })
    }

    #[test]
    fn started_with_the_first_frame_and_stopped_when_done_and_drained() {
        let mut p = Playout::default();
        p.push("r1", [1, 2]);
        assert_eq!(p.tick(), (Some(1), started("r1")));
        assert_eq!(p.finish("r1"), None, "a frame is still queued");
        assert_eq!(p.tick(), (Some(2), None));
        assert_eq!(p.tick(), (None, Some(Notice::Stopped { response_id: "r1".into() })));
        assert_eq!(p.tick(), (None, None));
        assert!(!p.busy());
    }

    #[test]
    fn a_response_done_after_its_frames_left_stops_at_once() {
        let mut p = Playout::default();
        p.push("r1", [1]);
        p.tick();
        assert_eq!(p.tick(), (None, None), "more audio may come");
        assert_eq!(p.finish("r1"), Some(Notice::Stopped { response_id: "r1".into() }));
    }

    #[test]
    fn a_clear_drops_everything_queued() {
        let mut p = Playout::default();
        p.push("r1", [1, 2, 3]);
        p.tick();
        assert_eq!(p.clear(), Some(Notice::Cleared { response_id: "r1".into() }));
        assert_eq!(p.tick(), (None, None), "nothing leaves after the clear");
        assert_eq!(p.clear(), None, "nothing to clear");
        p.push("r1", [5]);
        assert_eq!(p.tick(), (None, None), "the rest of the cleared response is not played");
        p.push("r2", [4]);
        assert_eq!(p.tick(), (Some(4), started("r2")), "the next response starts afresh");
    }

    #[test]
    fn frames_past_the_bound_are_dropped_and_counted() {
        let mut p = Playout::default();
        p.push("r1", 0..MAX_FRAMES + 3);
        assert_eq!(p.queued(), MAX_FRAMES);
        assert_eq!(p.dropped, 3);
    }
}
