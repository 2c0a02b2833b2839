//! The conversation as a value: its items in order, each with an id. A user's spoken turn
//! (with what the model heard of it), a user's or system's typed message, an assistant's
//! answer (its text, or the transcript of its voice, as far as the user heard it), the
//! model's function calls and what the client's tools gave back. The driver adds to it as the
//! session goes, the client inserts, deletes and truncates; a codec renders its items, and
//! the driver replays them to a backend that was reset ([`Conversation::replay`]).

use std::collections::VecDeque;

use omni_actors::domain::{ChatMessage, Role};

/// Items kept at most: past it the oldest are forgotten (a session is time-limited, but a
/// chat of short turns could otherwise grow its list for as long as it lasts).
pub const MAX_ITEMS: usize = 1000;
/// What the items weigh at most (their text and ids, [`Item::weight`]): past it the oldest are
/// forgotten too, so that a client creating large items cannot make the gateway hold a
/// thousand frames' worth. (A model's context holds far less.)
pub const MAX_WEIGHT: usize = 4 << 20;

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
    /// The user's audio, `audio_ms` long; what was heard of it, once known.
    InputAudio { transcript: Option<String>, audio_ms: u64 },
    /// An image the user sent (kept by the backend, not here).
    InputImage,
    /// An assistant's answer: its voice's transcript (`audio`), or its text; `audio_ms`, how
    /// long its voice is.
    Answer { audio: bool, text: String, audio_ms: u64 },
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

/// Where a new item goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Place {
    /// After the newest item.
    End,
    /// Before every item (`previous_item_id: "root"`).
    Root,
    /// Right after this item.
    After(String),
}

/// Why an item could not be placed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlaceError {
    /// An item with this id is already in the conversation.
    Duplicate(String),
    /// The item to follow is not in the conversation.
    NoPrevious(String),
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

    /// The user's spoken turn, `audio_ms` long.
    pub fn user_audio(id: String, transcript: Option<String>, audio_ms: u64) -> Item {
        Item::message(id, Role::User, vec![Part::InputAudio { transcript, audio_ms }])
    }

    /// An assistant's answer: empty while in progress, its text (and its voice's length)
    /// once done.
    pub fn answer(id: String, status: ItemStatus, audio: bool, text: Option<(&str, u64)>) -> Item {
        let parts =
            text.map(|(t, audio_ms)| Part::Answer { audio, text: t.to_string(), audio_ms }).into_iter().collect();
        Item { id, status, body: ItemBody::Message { role: Role::Assistant, parts } }
    }

    /// The model's call of a tool.
    pub fn function_call(id: String, status: ItemStatus, call_id: &str, name: &str, arguments: &str) -> Item {
        let body = ItemBody::FunctionCall { call_id: call_id.into(), name: name.into(), arguments: arguments.into() };
        Item { id, status, body }
    }

    /// What the item says to a model, as a message (`None`: nothing it could read: audio
    /// nobody transcribed, an image, an answer not yet written). `name_of` names the tool of a
    /// call id.
    pub fn to_message(&self, name_of: impl Fn(&str) -> String) -> Option<ChatMessage> {
        match &self.body {
            ItemBody::Message { role, parts } => {
                let text: Vec<&str> = parts
                    .iter()
                    .filter_map(|p| match p {
                        Part::Text { text, .. } | Part::Answer { text, .. } => Some(text.as_str()),
                        Part::InputAudio { transcript, .. } => transcript.as_deref(),
                        Part::InputImage => None,
                    })
                    .filter(|t| !t.is_empty())
                    .collect();
                (!text.is_empty()).then(|| ChatMessage::text(*role, text.join(" ")))
            }
            ItemBody::FunctionCall { call_id, name, arguments } => {
                Some(ChatMessage::tool_call(call_id.as_str(), name.as_str(), arguments.as_str()))
            }
            ItemBody::FunctionCallOutput { call_id, output } => {
                Some(ChatMessage::tool_result(call_id.as_str(), name_of(call_id), output.as_str()))
            }
        }
    }

    /// Bytes of text it holds (what its place in the list costs, roughly).
    pub fn weight(&self) -> usize {
        let text = match &self.body {
            ItemBody::Message { parts, .. } => parts
                .iter()
                .map(|p| match p {
                    Part::Text { text, .. } | Part::Answer { text, .. } => text.len(),
                    Part::InputAudio { transcript, .. } => transcript.as_ref().map_or(0, String::len),
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
        self.items.push_back(item);
        self.bound();
        previous
    }

    /// Forgets the oldest items past [`MAX_ITEMS`] or [`MAX_WEIGHT`] (the newest always stays).
    fn bound(&mut self) {
        let mut weight: usize = self.items.iter().map(Item::weight).sum();
        while self.items.len() > 1 && (self.items.len() > MAX_ITEMS || weight > MAX_WEIGHT) {
            if let Some(oldest) = self.items.pop_front() {
                weight -= oldest.weight();
            }
        }
    }

    /// Adds an item where the client asked; answers the id of the item it follows, and
    /// whether it went anywhere but the end.
    pub fn insert(&mut self, item: Item, place: &Place) -> Result<(Option<String>, bool), PlaceError> {
        if self.get(&item.id).is_some() {
            return Err(PlaceError::Duplicate(item.id));
        }
        let at = match place {
            Place::End => self.items.len(),
            Place::Root => 0,
            Place::After(id) => self.position(id).ok_or_else(|| PlaceError::NoPrevious(id.clone()))? + 1,
        };
        if at == self.items.len() {
            return Ok((self.push(item), false));
        }
        let previous = at.checked_sub(1).map(|i| self.items[i].id.clone());
        self.items.insert(at, item);
        self.bound();
        Ok((previous, true))
    }

    /// Removes an item; answers it.
    pub fn remove(&mut self, id: &str) -> Option<Item> {
        let at = self.position(id)?;
        self.items.remove(at)
    }

    /// Forgets the oldest items until what is left weighs at most `keep` of the whole (at
    /// least one item goes); answers how many went.
    pub fn evict(&mut self, keep: f64) -> usize {
        let total: usize = self.items.iter().map(Item::weight).sum();
        let target = (total as f64 * keep.clamp(0.0, 1.0)) as usize;
        let mut left = total;
        let mut gone = 0;
        while let Some(oldest) = self.items.front() {
            if gone > 0 && left <= target {
                break;
            }
            left -= oldest.weight();
            self.items.pop_front();
            gone += 1;
        }
        gone
    }

    fn position(&self, id: &str) -> Option<usize> {
        self.items.iter().position(|i| i.id == id)
    }

    pub fn get(&self, id: &str) -> Option<&Item> {
        self.items.iter().find(|i| i.id == id)
    }

    pub fn get_mut(&mut self, id: &str) -> Option<&mut Item> {
        self.items.iter_mut().find(|i| i.id == id)
    }

    /// The tool a call id called (empty when the call is not in the conversation).
    pub fn tool_of(&self, call_id: &str) -> String {
        self.items
            .iter()
            .find_map(|i| match &i.body {
                ItemBody::FunctionCall { call_id: c, name, .. } if c == call_id => Some(name.clone()),
                _ => None,
            })
            .unwrap_or_default()
    }

    /// The conversation as messages, oldest first, for a backend that starts over: each item
    /// as `kept` has it (the message the backend was to get, with its audio and images), or
    /// else as its text says.
    pub fn replay(&self, kept: impl Fn(&str) -> Option<ChatMessage>) -> Vec<ChatMessage> {
        self.items.iter().filter_map(|i| kept(&i.id).or_else(|| i.to_message(|c| self.tool_of(c)))).collect()
    }

    /// Records what was heard of a user's audio item.
    pub fn heard(&mut self, id: &str, transcript: &str) {
        if let Some(Item { body: ItemBody::Message { parts, .. }, .. }) = self.get_mut(id) {
            for part in parts {
                if let Part::InputAudio { transcript: t, .. } = part {
                    *t = Some(transcript.to_string());
                }
            }
        }
    }

    /// How long a user item's audio is, in seconds (0 for an item that holds none).
    pub fn audio_seconds(&self, id: &str) -> f64 {
        let ms: u64 = match self.get(id).map(|i| &i.body) {
            Some(ItemBody::Message { parts, .. }) => {
                parts.iter().map(|p| if let Part::InputAudio { audio_ms, .. } = p { *audio_ms } else { 0 }).sum()
            }
            _ => 0,
        };
        ms as f64 / 1000.0
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
        assert_eq!(c.push(Item::user_audio(first.clone(), None, 1200)), None);
        let second = c.new_item_id();
        assert_eq!(
            c.push(Item::answer(second.clone(), ItemStatus::Completed, true, Some(("hi", 500)))),
            Some(first.clone())
        );
        c.heard(&first, "hello");
        assert_eq!(c.audio_seconds(&first), 1.2);
        assert_eq!(c.get(&first), Some(&Item::user_audio(first.clone(), Some("hello".into()), 1200)));
        assert_eq!(c.last_id(), Some(second.as_str()));
        assert_eq!((c.new_response_id(), c.new_response_id()), ("resp_1".to_string(), "resp_2".to_string()));
    }

    #[test]
    fn the_list_is_bounded_oldest_out() {
        let mut c = Conversation::default();
        for _ in 0..MAX_ITEMS + 5 {
            let id = c.new_item_id();
            c.push(Item::user_audio(id, None, 0));
        }
        assert_eq!(c.len(), MAX_ITEMS);
        assert_eq!(c.items().next().map(|i| i.id.as_str()), Some("item_6"));
        // Large items: the oldest go once the items weigh more than MAX_WEIGHT.
        let big = "x".repeat(1 << 20);
        for i in 0..10 {
            c.push(said(&format!("big_{i}"), Role::User, &big));
        }
        let weight: usize = c.items().map(Item::weight).sum();
        assert!(weight <= MAX_WEIGHT, "{weight}");
        assert_eq!(c.items().filter(|i| i.id.starts_with("big_")).count(), 3, "the newest three of 1 MiB each");
    }

    fn said(id: &str, role: Role, text: &str) -> Item {
        Item::message(id.into(), role, vec![Part::Text { kind: TextKind::InputText, text: text.into() }])
    }

    fn ids(c: &Conversation) -> Vec<&str> {
        c.items().map(|i| i.id.as_str()).collect()
    }

    #[test]
    fn items_go_where_the_client_puts_them() {
        let mut c = Conversation::default();
        assert_eq!(c.insert(said("a", Role::User, "one"), &Place::End), Ok((None, false)));
        assert_eq!(c.insert(said("b", Role::User, "two"), &Place::End), Ok((Some("a".into()), false)));
        assert_eq!(c.insert(said("r", Role::System, "zero"), &Place::Root), Ok((None, true)));
        assert_eq!(c.insert(said("m", Role::User, "mid"), &Place::After("a".into())), Ok((Some("a".into()), true)));
        assert_eq!(c.insert(said("z", Role::User, "end"), &Place::After("b".into())), Ok((Some("b".into()), false)));
        assert_eq!(ids(&c), ["r", "a", "m", "b", "z"]);
        assert_eq!(c.insert(said("a", Role::User, "again"), &Place::End), Err(PlaceError::Duplicate("a".into())));
        assert_eq!(
            c.insert(said("q", Role::User, "?"), &Place::After("nope".into())),
            Err(PlaceError::NoPrevious("nope".into()))
        );
        assert_eq!(c.remove("m").map(|i| i.id), Some("m".into()));
        assert_eq!(c.remove("m"), None);
        assert_eq!(ids(&c), ["r", "a", "b", "z"]);
    }

    #[test]
    fn a_replay_reads_every_item_it_can_as_a_message() {
        let mut c = Conversation::default();
        c.push(said("s", Role::System, "be brief"));
        c.push(Item::user_audio("u".into(), Some("what time is it".into()), 1500));
        c.push(Item::user_audio("mute".into(), None, 700));
        c.push(Item::function_call("f".into(), ItemStatus::Completed, "call_1", "get_time", "{}"));
        let output = ItemBody::FunctionCallOutput { call_id: "call_1".into(), output: "noon".into() };
        c.push(Item { id: "o".into(), status: ItemStatus::Completed, body: output });
        c.push(Item::answer("a".into(), ItemStatus::Completed, true, Some(("It is noon.", 900))));
        let kept = ChatMessage::text(Role::User, "kept whole");
        let messages = c.replay(|id| (id == "mute").then(|| kept.clone()));
        assert_eq!(
            messages,
            [
                ChatMessage::text(Role::System, "be brief"),
                ChatMessage::text(Role::User, "what time is it"),
                kept,
                ChatMessage::tool_call("call_1", "get_time", "{}"),
                ChatMessage::tool_result("call_1", "get_time", "noon"),
                ChatMessage::text(Role::Assistant, "It is noon."),
            ]
        );
    }

    #[test]
    fn eviction_forgets_the_oldest_until_what_is_left_fits() {
        let mut c = Conversation::default();
        for i in 0..10 {
            c.push(said(&format!("i{i}"), Role::User, "0123456789"));
        }
        assert_eq!(c.evict(0.5), 5, "ten equal items, half kept");
        assert_eq!(ids(&c)[0], "i5");
        assert_eq!(c.evict(1.0), 1, "at least one goes");
        let mut empty = Conversation::default();
        assert_eq!(empty.evict(0.5), 0);
    }
}
