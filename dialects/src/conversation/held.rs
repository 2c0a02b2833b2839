//! What the conversation holds for a client, counted in bytes.
//!
//! A client of the OpenAI-shaped dialects can make the server hold data before anything
//! reaches a backend: replies while it waits in the queue, audio not yet committed, conversation
//! items and images not yet answered, input held while the session is being created. Each
//! container is a [`Counted`] so that the total is known at every moment, and an event
//! that would take it past `limits.max_buffered_bytes` is refused before anything is kept.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};

use omni_actors::domain::{ChatMessage, DuplexChunk, TurnInput};
use omni_actors::protocol::Inbound;

use super::events::Event;

/// Bytes a held value accounts for (its data plus a fixed overhead, so that a flood of
/// empty items is bounded too).
pub trait Weigh {
    fn weight(&self) -> usize;
}

const OVERHEAD: usize = 64;

/// What every session's conversation holds, together, in bytes: one budget for the process
/// (`limits.max_buffered_total_mb`), kept by each conversation's [`Share`].
static HELD: AtomicUsize = AtomicUsize::new(0);

/// A conversation's part of [`HELD`]: what it reported last, given back when it is dropped.
#[derive(Debug, Default)]
pub struct Share(usize);

impl Share {
    /// The conversation holds `now` bytes.
    pub fn report(&mut self, now: usize) {
        if now >= self.0 {
            HELD.fetch_add(now - self.0, Ordering::Relaxed);
        } else {
            HELD.fetch_sub(self.0 - now, Ordering::Relaxed);
        }
        self.0 = now;
        omni_actors::observe::metrics::metrics()
            .buffered_bytes
            .set(HELD.load(Ordering::Relaxed).min(i64::MAX as usize) as i64);
    }

    /// What the other conversations hold, together.
    pub fn others(&self) -> usize {
        HELD.load(Ordering::Relaxed).saturating_sub(self.0)
    }
}

impl Drop for Share {
    fn drop(&mut self) {
        self.report(0);
    }
}

impl Weigh for String {
    fn weight(&self) -> usize {
        self.len() + OVERHEAD
    }
}

impl Weigh for Event {
    fn weight(&self) -> usize {
        Event::weight(self)
    }
}

impl Weigh for Vec<u8> {
    fn weight(&self) -> usize {
        self.len() + OVERHEAD
    }
}

impl Weigh for ChatMessage {
    fn weight(&self) -> usize {
        self.text.len()
            + self.images.iter().map(Vec::len).sum::<usize>()
            + self.audios.iter().map(|a| a.len() * 4).sum::<usize>()
            + OVERHEAD
    }
}

fn chunk_weight(c: &DuplexChunk) -> usize {
    c.audio.len() * 4 + c.frames.iter().map(Vec::len).sum::<usize>()
}

fn turn_weight(t: &TurnInput) -> usize {
    t.messages.iter().map(Weigh::weight).sum::<usize>() + t.tts_ref_audio.len() * 4
}

impl Weigh for Inbound {
    fn weight(&self) -> usize {
        OVERHEAD
            + match self {
                Inbound::Chunk(c) => chunk_weight(c),
                Inbound::Turn { input, .. } => turn_weight(input),
                Inbound::Init(s) | Inbound::Reconfigure(s) => {
                    s.system_prompt.len() + (s.ref_audio.len() + s.tts_ref_audio.len()) * 4
                }
                Inbound::Close { reason } => reason.as_ref().map_or(0, String::len),
                Inbound::Interrupt => 0,
                Inbound::Transcribe { item_id, audio } => item_id.len() + audio.len() * 4,
                Inbound::Decide { request, .. } => request.weight(),
            }
    }
}

/// A queue of held values and their total weight.
pub struct Counted<T> {
    items: VecDeque<T>,
    bytes: usize,
}

impl<T> Default for Counted<T> {
    fn default() -> Self {
        Counted { items: VecDeque::new(), bytes: 0 }
    }
}

impl<T: Weigh> Counted<T> {
    pub fn push(&mut self, item: T) {
        self.bytes += item.weight();
        self.items.push_back(item);
    }

    pub fn pop_front(&mut self) -> Option<T> {
        let item = self.items.pop_front()?;
        self.bytes -= item.weight();
        Some(item)
    }

    /// Everything held, oldest first; the queue is empty afterwards.
    pub fn take(&mut self) -> Vec<T> {
        self.bytes = 0;
        self.items.drain(..).collect()
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.items.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use omni_actors::domain::Role;

    #[test]
    fn the_total_follows_every_change() {
        let mut c: Counted<ChatMessage> = Counted::default();
        let mut m = ChatMessage::text(Role::User, "hello");
        m.audios.push(vec![0.0; 1000]);
        c.push(m.clone());
        c.push(ChatMessage::text(Role::User, ""));
        assert_eq!(c.bytes(), 5 + 4000 + 64 + 64);
        assert_eq!(c.pop_front().unwrap(), m);
        assert_eq!(c.bytes(), 64);
        c.push(m);
        assert_eq!(c.take().len(), 2);
        assert_eq!((c.bytes(), c.len()), (0, 0));
    }
}
