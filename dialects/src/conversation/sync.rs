//! The backend's context and the conversation: what the backend holds of it, and how it is
//! brought back in line. The conversation is the session's; the backend holds a copy in its
//! context, which falls behind (items the client created and no answer took yet: pending),
//! or out of line (an item truncated, deleted or inserted before the end, an answer outside
//! the conversation, a reset).
//!
//! - Pending items go with the next answer, appended to the backend's context.
//! - Out of line (`stale`), the next answer replays the whole conversation instead.
//! - After a reset (new instructions, voice or tools; a full context), a backend of ABI 1.3
//!   takes the conversation at once as a turn that only prefills; an older backend in turn
//!   mode gets it with its next answer; an older duplex backend starts over (its model does
//!   not keep typed turns).
//! - A full context drops the oldest items (the session's `truncation`) and replays the rest.

use omni_actors::domain::{ChatMessage, Role, TurnInput};
use omni_actors::observe::metrics::metrics;
use omni_actors::protocol::Inbound;

use super::Driver;
use super::held::{Counted, Weigh};
use super::responses::Turn;

/// The message of an item the backend does not hold yet.
#[derive(Debug)]
pub struct Pending {
    pub item_id: String,
    pub message: ChatMessage,
}

impl Weigh for Pending {
    fn weight(&self) -> usize {
        self.item_id.len() + self.message.weight()
    }
}

/// Whether the backend's context follows the conversation.
#[derive(Default)]
pub struct Sync {
    /// It does not: the next answer replays the whole conversation.
    pub stale: bool,
    /// The messages of the items the backend does not hold yet, in the order they came.
    pub pending: Counted<Pending>,
}

impl Driver {
    /// Whether the backend keeps a conversation the ABI 1.3 way (calls, prefill-only turns,
    /// turns in duplex sessions). Before the session is created, it is not known: no.
    pub(super) fn holds_conversations(&self) -> bool {
        self.life.backend.as_ref().is_some_and(|b| b.holds_conversations())
    }

    /// The whole conversation as the backend's messages: each item with what the backend was
    /// to get of it (audio and images included) while it is pending, else as its text says.
    pub(super) fn replay_messages(&self) -> Vec<ChatMessage> {
        let pending = &self.sync.pending;
        self.conversation.replay(|id| pending.iter().find(|p| p.item_id == id).map(|p| p.message.clone()))
    }

    /// Messages as this session's backend takes them: a backend before ABI 1.3 knows no calls,
    /// so a call and its result are written as words (the assistant's and the user's).
    pub(super) fn for_backend(&self, messages: Vec<ChatMessage>) -> Vec<ChatMessage> {
        if self.holds_conversations() {
            return messages;
        }
        messages
            .into_iter()
            .map(|m| match (m.role, m.call.clone()) {
                (Role::Assistant, Some(call)) => {
                    ChatMessage::text(Role::Assistant, format!("(I called the tool {} with {})", call.name, m.text))
                }
                (Role::Tool, call) => {
                    let name = match call {
                        Some(c) if !c.name.is_empty() => c.name,
                        Some(c) => format!("of call {}", c.id),
                        None => "a tool".into(),
                    };
                    ChatMessage::text(Role::User, format!("(the tool {name} answered: {})", m.text))
                }
                _ => m,
            })
            .collect()
    }

    /// The backend was (or is being) reset: it takes the conversation back. A 1.3 backend
    /// prefills it now; an older one in turn mode gets it with its next answer.
    pub(super) fn resync(&mut self) {
        if !self.holds_conversations() {
            // What the backend had lost: the items it held (pending ones it never had).
            let pending = &self.sync.pending;
            self.sync.stale |= self.conversation.items().any(|i| !pending.iter().any(|p| p.item_id == i.id));
            return;
        }
        let messages = self.replay_messages();
        self.sync.pending.take();
        self.sync.stale = false;
        if messages.is_empty() {
            return;
        }
        metrics().conversation_replays.inc();
        let input = TurnInput { messages, prefill_only: true, continues: false, ..TurnInput::default() };
        self.responses.turns.push_back(Turn::replay());
        self.commands.push(Inbound::Turn { input, streaming: true });
    }

    /// The backend's context is full. Unless the session's truncation is `disabled`, the oldest
    /// items are dropped (until the share `truncation` keeps is left), the backend is prepared
    /// again and the rest replayed; an answer the full context cut short is given again.
    /// Answers whether the session goes on.
    pub fn context_full(&mut self) -> bool {
        let Some(keep) = self.setup.conf.truncation.keep() else { return false };
        if self.setup.reconfigures_in_flight() {
            // Room is being made already: what the backend answered before it is void.
            return true;
        }
        if self.conversation.is_empty() {
            return false;
        }
        let dropped = self.conversation.evict(keep);
        let kept: Vec<String> = self.conversation.items().map(|i| i.id.clone()).collect();
        let mut pending = self.sync.pending.take();
        pending.retain(|p| kept.contains(&p.item_id));
        for p in pending {
            self.sync.pending.push(p);
        }
        log::info!(
            "session {}: context full: the {dropped} oldest items dropped, {} replayed",
            self.life.session_id.as_deref().unwrap_or("-"),
            self.conversation.len()
        );
        // The answer in flight failed: it is given again on the shorter conversation.
        let retry = self.responses.turns.front().is_some_and(|t| self.turn_is_current(t.response.clone()));
        if retry {
            self.responses.turns.pop_front();
        }
        self.prepare_again();
        if retry && self.life.backend.as_ref().is_some_and(|b| b.turn) {
            let messages = self.replay_messages();
            self.sync.pending.take();
            self.sync.stale = false;
            self.answer_again(messages);
        } else {
            self.resync();
        }
        true
    }
}
