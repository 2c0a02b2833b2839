//! What a client does to the conversation itself: creates items where it wants them (messages,
//! function calls, what its tools gave back), reads one back, deletes one, and cuts an
//! assistant's answer to what its user heard. Each change the backend's context does not
//! follow on its own puts the backend out of line ([`super::sync`]).

use omni_actors::domain::{ChatMessage, Role};
use omni_actors::protocol::ProtocolError;

use super::Driver;
use super::events::{Event, NewItem};
use super::held::Weigh;
use super::items::{Item, ItemBody, ItemStatus, Part, Place, PlaceError, TextKind};
use super::sync::Pending;

impl Driver {
    /// An item the client wrote: added where it asked, held for the backend's next answer.
    pub(super) fn create_item(&mut self, new: NewItem) -> Result<(), ProtocolError> {
        let NewItem { id, place, message, body } = new;
        self.admit("conversation.item.create", "items", message.weight())?;
        let item_id = id.unwrap_or_else(|| self.conversation.new_item_id());
        let item = Item { id: item_id.clone(), status: ItemStatus::Completed, body };
        let (previous_item_id, inserted) = self.conversation.insert(item.clone(), &place).map_err(|e| match e {
            PlaceError::Duplicate(id) => ProtocolError::Refused {
                code: "item_already_exists",
                message: format!("conversation.item.create: item.id: an item '{id}' is already in the conversation"),
            },
            PlaceError::NoPrevious(id) => ProtocolError::Refused {
                code: "previous_item_not_found",
                message: format!("conversation.item.create: previous_item_id: no item '{id}' in the conversation"),
            },
        })?;
        if inserted {
            // Before items the backend holds: its context is out of line.
            self.sync.stale = true;
        }
        if message.role == Role::User && !message.audios.is_empty() {
            self.responses.audio_item = Some(item_id.clone());
        }
        self.sync.pending.push(Pending { item_id, message });
        self.say(Event::ItemAdded { previous_item_id, item: item.clone() });
        self.say(Event::ItemDone { item });
        Ok(())
    }

    /// A key the caller pressed on a phone: told (as the hosted API tells a SIP call's keys),
    /// and written into the conversation as the caller's, so that the model reads it in its
    /// next answer (a key alone asks for no answer).
    pub(super) fn key(&mut self, key: char) -> Result<(), ProtocolError> {
        let received_at = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        self.say(Event::KeyPressed { key, received_at });
        let text = format!("(the caller pressed {key} on the keypad)");
        self.create_item(NewItem {
            id: None,
            place: Place::End,
            message: ChatMessage::text(Role::User, text.clone()),
            body: ItemBody::Message { role: Role::User, parts: vec![Part::Text { kind: TextKind::InputText, text }] },
        })
    }

    /// The client asks for an item.
    pub(super) fn retrieve(&mut self, item_id: &str) -> Result<(), ProtocolError> {
        let item = self.conversation.get(item_id).cloned().ok_or_else(|| ProtocolError::Refused {
            code: "item_retrieve_invalid_item_id",
            message: format!("conversation.item.retrieve: item_id: no item '{item_id}' in the conversation"),
        })?;
        self.say(Event::ItemRetrieved { item });
        Ok(())
    }

    /// The client removes an item (not one the response in progress is writing).
    pub(super) fn delete(&mut self, item_id: &str) -> Result<(), ProtocolError> {
        if self.in_current_response(item_id) {
            return Err(ProtocolError::Refused {
                code: "item_delete_invalid_item_id",
                message: format!(
                    "conversation.item.delete: item_id: '{item_id}' is being written by the response in progress; \
                     cancel it first"
                ),
            });
        }
        if self.conversation.remove(item_id).is_none() {
            return Err(ProtocolError::Refused {
                code: "item_delete_invalid_item_id",
                message: format!("conversation.item.delete: item_id: no item '{item_id}' in the conversation"),
            });
        }
        let before = self.sync.pending.len();
        let mut pending = self.sync.pending.take();
        pending.retain(|p| p.item_id != item_id);
        let was_pending = pending.len() < before;
        for p in pending {
            self.sync.pending.push(p);
        }
        if self.responses.audio_item.as_deref() == Some(item_id) {
            self.responses.audio_item = None;
        }
        if !was_pending {
            self.sync.stale = true;
        }
        self.say(Event::ItemDeleted { item_id: item_id.to_string() });
        Ok(())
    }

    /// The client's user heard an assistant's answer only up to `audio_end_ms`: the answer
    /// is cut there (its transcript in proportion, at a word), an answer still in progress is
    /// cancelled first, and the backend's context follows at the next answer. An end at or past
    /// the audio's changes nothing.
    pub(super) fn truncate(
        &mut self,
        item_id: &str,
        content_index: u32,
        audio_end_ms: u64,
    ) -> Result<(), ProtocolError> {
        let at = "conversation.item.truncate";
        let Some(item) = self.conversation.get(item_id) else {
            return Err(ProtocolError::Refused {
                code: "item_truncate_invalid_item_id",
                message: format!("{at}: item_id: no item '{item_id}' in the conversation"),
            });
        };
        let is_answer = matches!(&item.body, ItemBody::Message { role: Role::Assistant, .. });
        if !is_answer {
            return Err(ProtocolError::InvalidPayload(format!(
                "{at}: item_id: '{item_id}' is not an assistant's message"
            )));
        }
        if content_index != 0 {
            return Err(ProtocolError::InvalidPayload(format!(
                "{at}: content_index: the answer '{item_id}' has one content part (0), not {content_index}"
            )));
        }
        if self.in_current_response(item_id) {
            // The rest of it will not be heard.
            self.cut_response("client_cancelled");
        }
        let mut cut = false;
        if let Some(Item { body: ItemBody::Message { parts, .. }, .. }) = self.conversation.get_mut(item_id) {
            for part in parts.iter_mut() {
                if let Part::Answer { text, audio_ms, audio: true } = part
                    && audio_end_ms < *audio_ms
                {
                    *text = cut_at(text, audio_end_ms as f64 / *audio_ms as f64);
                    *audio_ms = audio_end_ms;
                    cut = true;
                }
            }
        }
        if cut {
            self.sync.stale = true;
        }
        self.say(Event::ItemTruncated { item_id: item_id.to_string(), content_index, audio_end_ms });
        Ok(())
    }
}

impl Driver {
    /// The tool a call id called (empty when the call is not in the conversation).
    pub fn tool_of(&self, call_id: &str) -> String {
        self.conversation.tool_of(call_id)
    }

    /// An item of the conversation, for a response's own input (`item_reference`).
    pub fn referenced(&self, id: &str) -> Option<NewItem> {
        let item = self.conversation.get(id)?;
        let pending = self.sync.pending.iter().find(|p| p.item_id == id).map(|p| p.message.clone());
        let message = pending
            .or_else(|| item.to_message(|c| self.conversation.tool_of(c)))
            .unwrap_or_else(|| omni_actors::domain::ChatMessage::text(Role::User, ""));
        Some(NewItem { id: Some(id.to_string()), place: Place::End, message, body: item.body.clone() })
    }
}

/// The first `share` of `text`, ending at a whole word.
fn cut_at(text: &str, share: f64) -> String {
    let chars: Vec<char> = text.chars().collect();
    let keep = (chars.len() as f64 * share.clamp(0.0, 1.0)).floor() as usize;
    if keep >= chars.len() {
        return text.to_string();
    }
    let head: String = chars[..keep].iter().collect();
    // A word cut in two is not kept.
    let whole = if chars.get(keep).is_some_and(|c| c.is_whitespace()) {
        head.as_str()
    } else {
        head.rsplit_once(char::is_whitespace).map_or("", |(kept, _)| kept)
    };
    whole.trim_end().to_string()
}

#[cfg(test)]
mod tests {
    use super::cut_at;

    #[test]
    fn an_answer_is_cut_at_the_last_whole_word_heard() {
        assert_eq!(cut_at("It is twelve o'clock now.", 0.5), "It is twelve");
        assert_eq!(cut_at("It is twelve o'clock now.", 0.4), "It is");
        assert_eq!(cut_at("It is twelve o'clock now.", 0.0), "");
        assert_eq!(cut_at("It is twelve o'clock now.", 1.0), "It is twelve o'clock now.");
        assert_eq!(cut_at("Hello there", 0.55), "Hello");
        assert_eq!(cut_at("Élan vital", 0.5), "Élan");
    }
}
