//! The model's voice on its way out of a call, as rules without a runtime: frames wait here
//! (already encoded), each with the response it belongs to, until the call's pacer takes one
//! every 20 ms; the rules say when a response's voice started playing, stopped, or was
//! cleared (what the session is told, as `Playback`, for its dialect to tell the client).
//!
//! A response's audio starts playing with its first frame. It has stopped when its audio is
//! done and every frame of it has left, or when the next response's first frame leaves. A
//! clear (the user spoke over it, or the client asked) drops every frame at once, so nothing
//! more of it leaves after the current 20 ms, and whatever more of that response arrives
//! afterwards is not played either.

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
    /// Frames, each with the number of its response in `responses`.
    frames: VecDeque<(u64, F)>,
    /// The responses with frames queued or playing, oldest first, by number.
    responses: VecDeque<(u64, String)>,
    next_number: u64,
    /// The response playing (its first frame has left), by number.
    playing: Option<u64>,
    /// Responses whose audio is all here, by number.
    finished: Vec<u64>,
    /// The response last cleared: the rest of its audio is not played.
    muted: Option<String>,
    /// Frames dropped over [`MAX_FRAMES`].
    pub dropped: u64,
}

impl<F> Default for Playout<F> {
    fn default() -> Self {
        Playout {
            frames: VecDeque::new(),
            responses: VecDeque::new(),
            next_number: 0,
            playing: None,
            finished: Vec::new(),
            muted: None,
            dropped: 0,
        }
    }
}

impl<F> Playout<F> {
    /// Whether the rest of `response_id`'s audio is to be dropped (it was cleared).
    pub fn muted(&self, response_id: &str) -> bool {
        self.muted.as_deref() == Some(response_id)
    }

    fn number(&mut self, response_id: &str) -> u64 {
        if let Some((n, _)) = self.responses.iter().find(|(_, id)| id == response_id) {
            return *n;
        }
        let n = self.next_number;
        self.next_number += 1;
        self.responses.push_back((n, response_id.to_string()));
        n
    }

    fn id(&self, number: u64) -> String {
        self.responses.iter().find(|(n, _)| *n == number).map(|(_, id)| id.clone()).unwrap_or_default()
    }

    fn forget(&mut self, number: u64) {
        self.responses.retain(|(n, _)| *n != number);
        self.finished.retain(|n| *n != number);
    }

    /// Frames of `response_id` arrive.
    pub fn push(&mut self, response_id: &str, frames: impl IntoIterator<Item = F>) {
        if self.muted(response_id) {
            return;
        }
        let n = self.number(response_id);
        for frame in frames {
            if self.frames.len() >= MAX_FRAMES {
                self.dropped += 1;
                continue;
            }
            self.frames.push_back((n, frame));
        }
    }

    /// The response's audio is complete: once its frames have left it has stopped.
    pub fn finish(&mut self, response_id: &str) -> Option<Notice> {
        let n = self.responses.iter().find(|(_, id)| id == response_id).map(|(n, _)| *n)?;
        if !self.finished.contains(&n) {
            self.finished.push(n);
        }
        self.stopped_if_done()
    }

    /// The playing response has stopped if it is finished and none of its frames wait.
    fn stopped_if_done(&mut self) -> Option<Notice> {
        let n = self.playing?;
        if !self.finished.contains(&n) || self.frames.iter().any(|(f, _)| *f == n) {
            return None;
        }
        let response_id = self.id(n);
        self.forget(n);
        self.playing = None;
        Some(Notice::Stopped { response_id })
    }

    /// The pacer's tick: the frame to send, and what to tell the client (a response that
    /// stopped, then one that started).
    pub fn tick(&mut self) -> (Option<F>, Vec<Notice>) {
        let mut notices = Vec::new();
        let Some((n, frame)) = self.frames.pop_front() else {
            notices.extend(self.stopped_if_done());
            return (None, notices);
        };
        if self.playing != Some(n) {
            if let Some(old) = self.playing.take() {
                // The next response plays: the previous one is over, whatever it said.
                notices.push(Notice::Stopped { response_id: self.id(old) });
                self.forget(old);
            }
            self.playing = Some(n);
            notices.push(Notice::Started { response_id: self.id(n) });
        }
        notices.extend(self.stopped_if_done());
        (Some(frame), notices)
    }

    /// Drops every frame: `Cleared` for the response playing (or the first queued).
    pub fn clear(&mut self) -> Option<Notice> {
        let cut = self.playing.or_else(|| self.frames.front().map(|(n, _)| *n));
        self.frames.clear();
        self.playing = None;
        let response_id = cut.map(|n| self.id(n));
        self.responses.clear();
        self.finished.clear();
        let response_id = response_id?;
        self.muted = Some(response_id.clone());
        Some(Notice::Cleared { response_id })
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

    fn started(id: &str) -> Notice {
        Notice::Started { response_id: id.into() }
    }

    fn stopped(id: &str) -> Notice {
        Notice::Stopped { response_id: id.into() }
    }

    #[test]
    fn started_with_the_first_frame_and_stopped_when_done_and_drained() {
        let mut p = Playout::default();
        p.push("r1", [1, 2]);
        assert_eq!(p.tick(), (Some(1), vec![started("r1")]));
        assert_eq!(p.finish("r1"), None, "a frame is still queued");
        assert_eq!(p.tick(), (Some(2), vec![stopped("r1")]), "its last frame left");
        assert_eq!(p.tick(), (None, vec![]));
        assert!(!p.busy());
    }

    #[test]
    fn a_response_done_after_its_frames_left_stops_at_once() {
        let mut p = Playout::default();
        p.push("r1", [1]);
        p.tick();
        assert_eq!(p.tick(), (None, vec![]), "more audio may come");
        assert_eq!(p.finish("r1"), Some(stopped("r1")));
    }

    #[test]
    fn the_next_responses_first_frame_stops_the_previous_one() {
        let mut p = Playout::default();
        p.push("r1", [1]);
        p.push("r2", [2]);
        assert_eq!(p.tick(), (Some(1), vec![started("r1")]));
        assert_eq!(p.tick(), (Some(2), vec![stopped("r1"), started("r2")]));
        assert_eq!(p.finish("r2"), Some(stopped("r2")));
    }

    #[test]
    fn a_clear_drops_everything_queued() {
        let mut p = Playout::default();
        p.push("r1", [1, 2, 3]);
        p.tick();
        assert_eq!(p.clear(), Some(Notice::Cleared { response_id: "r1".into() }));
        assert_eq!(p.tick(), (None, vec![]), "nothing leaves after the clear");
        assert_eq!(p.clear(), None, "nothing to clear");
        assert!(p.muted("r1"));
        p.push("r1", [5]);
        assert_eq!(p.tick(), (None, vec![]), "the rest of the cleared response is not played");
        p.push("r2", [4]);
        assert_eq!(p.tick(), (Some(4), vec![started("r2")]), "the next response starts afresh");
    }

    #[test]
    fn frames_past_the_bound_are_dropped_and_counted() {
        let mut p = Playout::default();
        p.push("r1", 0..MAX_FRAMES + 3);
        assert_eq!(p.queued(), MAX_FRAMES);
        assert_eq!(p.dropped, 3);
    }
}
