//! The conversation as a value: its items in order, each with an id. A user's spoken turn
//! (with what the model heard of it), a user's or system's typed message, an assistant's
//! answer (its text, or the transcript of its voice), and the kinds a function call and its
//! output will take. The driver adds to it as the session goes; a codec renders its items.

use std::collections::VecDeque;

use omni_actors::domain::Role;

/// Items kept at most: past it the oldest are forgotten (a session is time-limited, but a
/// chat of short turns could otherwise grow its list for as long as it lasts).
pub const MAX_ITEMS: usize = 1000;

/// Where an item is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ItemStatus {
    /// An answer being written.
    InProgress,
    Completed,
    /// An answer cut short.
    Incomplete,
}

impl ItemStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            ItemStatus::InProgress => "in_progress",
            ItemStatus::Completed => "completed",
            ItemStatus::Incomplete => "incomplete",
        }
    }
}

/// One piece of a message's content.
#[derive(Debug, Clone, PartialEq)]
pub enum Part {
    /// Text a client wrote, under the part type it gave (`input_text`, `text`, `output_text`).
    Text { kind: TextKind, text: String },
    /// The user's audio; what was heard of it, once known.
    InputAudio { transcript: Option<String> },
    /// An image the user sent (kept by the backend, not here).
    InputImage,
    /// An assistant's answer: its voice's transcript (`audio`), or its text.
    Answer { audio: bool, text: String },
}

/// The part type a client gave its text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TextKind {
    InputText,
    Text,
    OutputText,
}

impl TextKind {
    pub fn as_str(self) -> &'static str {
        match self {
            TextKind::InputText => "input_text",
            TextKind::Text => "text",
            TextKind::OutputText => "output_text",
        }
    }
}

/// What an item is.
#[derive(Debug, Clone, PartialEq)]
pub enum ItemBody {
    Message {
        role: Role,
        parts: Vec<Part>,
    },
    /// A call of one of the session's tools the model made: its arguments as JSON text.
    FunctionCall {
        call_id: String,
        name: String,
        arguments: String,
    },
    /// What the client's tool answered to call `call_id`.
    FunctionCallOutput {
        call_id: String,
        output: String,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub struct Item {
    pub id: String,
    pub status: ItemStatus,
    pub body: ItemBody,
}

impl Item {
    /// A completed message.
    pub fn message(id: String, role: Role, parts: Vec<Part>) -> Item {
        Item { id, status: ItemStatus::Completed, body: ItemBody::Message { role, parts } }
    }

    /// The user's spoken turn.
    pub fn user_audio(id: String, transcript: Option<String>) -> Item {
        Item::message(id, Role::User, vec![Part::InputAudio { transcript }])
    }

    /// An assistant's answer: empty while in progress, its text once done.
    pub fn answer(id: String, status: ItemStatus, audio: bool, text: Option<&str>) -> Item {
        let parts = text.map(|t| Part::Answer { audio, text: t.to_string() }).into_iter().collect();
        Item { id, status, body: ItemBody::Message { role: Role::Assistant, parts } }
    }

    /// Bytes of text it holds (what its place in the list costs, roughly).
    pub fn weight(&self) -> usize {
        let text = match &self.body {
            ItemBody::Message { parts, .. } => parts
                .iter()
                .map(|p| match p {
                    Part::Text { text, .. } | Part::Answer { text, .. } => text.len(),
                    Part::InputAudio { transcript } => transcript.as_ref().map_or(0, String::len),
                    Part::InputImage => 0,
                })
                .sum(),
            ItemBody::FunctionCall { call_id, name, arguments } => call_id.len() + name.len() + arguments.len(),
            ItemBody::FunctionCallOutput { call_id, output } => call_id.len() + output.len(),
        };
        self.id.len() + text + 64
    }
}

/// The items of one session, oldest first, and the ids it hands out.
#[derive(Debug, Default)]
pub struct Conversation {
    items: VecDeque<Item>,
    /// Ids handed out so far (`item_N`).
    issued: u64,
    /// Responses begun so far (`resp_N`).
    responses: u64,
}

impl Conversation {
    /// A new item id.
    pub fn new_item_id(&mut self) -> String {
        self.issued += 1;
        format!("item_{}", self.issued)
    }

    /// A new response id.
    pub fn new_response_id(&mut self) -> String {
        self.responses += 1;
        format!("resp_{}", self.responses)
    }

    /// The newest item's id: what the next item follows.
    pub fn last_id(&self) -> Option<&str> {
        self.items.back().map(|i| i.id.as_str())
    }

    /// Adds an item at the end; answers the id of the item it follows.
    pub fn push(&mut self, item: Item) -> Option<String> {
        let previous = self.last_id().map(String::from);
        if self.items.len() >= MAX_ITEMS {
            self.items.pop_front();
        }
        self.items.push_back(item);
        previous
    }

    pub fn get(&self, id: &str) -> Option<&Item> {
        self.items.iter().find(|i| i.id == id)
    }

    pub fn get_mut(&mut self, id: &str) -> Option<&mut Item> {
        self.items.iter_mut().find(|i| i.id == id)
    }

    /// Records what was heard of a user's audio item.
    pub fn heard(&mut self, id: &str, transcript: &str) {
        if let Some(Item { body: ItemBody::Message { parts, .. }, .. }) = self.get_mut(id) {
            for part in parts {
                if let Part::InputAudio { transcript: t } = part {
                    *t = Some(transcript.to_string());
                }
            }
        }
    }

    /// The items, oldest first.
    pub fn items(&self) -> impl Iterator<Item = &Item> {
        self.items.iter()
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_follow_one_another_and_keep_what_was_heard() {
        let mut c = Conversation::default();
        let first = c.new_item_id();
        assert_eq!(c.push(Item::user_audio(first.clone(), None)), None);
        let second = c.new_item_id();
        assert_eq!(c.push(Item::answer(second.clone(), ItemStatus::Completed, true, Some("hi"))), Some(first.clone()));
        c.heard(&first, "hello");
        assert_eq!(c.get(&first), Some(&Item::user_audio(first.clone(), Some("hello".into()))));
        assert_eq!(c.last_id(), Some(second.as_str()));
        assert_eq!((c.new_response_id(), c.new_response_id()), ("resp_1".to_string(), "resp_2".to_string()));
    }

    #[test]
    fn the_list_is_bounded_oldest_out() {
        let mut c = Conversation::default();
        for _ in 0..MAX_ITEMS + 5 {
            let id = c.new_item_id();
            c.push(Item::user_audio(id, None));
        }
        assert_eq!(c.len(), MAX_ITEMS);
        assert_eq!(c.items().next().map(|i| i.id.as_str()), Some("item_6"));
    }
}
