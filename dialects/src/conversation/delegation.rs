//! Delegation: a text model beside a voice that calls no tools. When the session's backend
//! calls no tools itself (a MiniCPM-o worker, a vLLM-Omni slot, an ABI library without
//! `OMNI_CAP_TOOLS`) and the gateway has a decider (`[delegation]`), each user turn's
//! transcript goes to the decider with the session's instructions, tools and conversation; a
//! call it decides is told to the client as a model's call is (a response with a
//! `function_call` item, checked against the tool's schema first), and its errors as one
//! `error` each. The voice learns what the decider learned by being prepared again: its system
//! prompt holds the instructions, a compact transcript of the conversation and the tools'
//! results word for word ([`Driver::briefed`]) — after a tool's result, when the client asks
//! for a response, and when the instructions change (an agent's handoff).

use omni_actors::domain::{CallPiece, ChatMessage, Role, SessionSetup, ToolChoice, Tools};
use omni_actors::domain::{DecideRequest, DeciderError, Decision};
use omni_actors::observe::metrics::metrics;
use omni_actors::protocol::{Inbound, ProtocolError};

use super::Driver;
use super::events::{Event, ResponseRequest, ResponseStatus};
use super::items::{Item, ItemBody, Part};

/// How long a response the client asked of a voice that takes no typed turns waits for its
/// words (the voice is stepped with silence meanwhile); after it, the response ends
/// `incomplete` (`voice_silent`).
pub const VOICE_WAIT: std::time::Duration = std::time::Duration::from_secs(15);
/// The most bytes of conversation a decider is sent (the oldest messages go first).
pub const MAX_DECIDER_CONVERSATION: usize = 64 << 10;
/// The most bytes of one message (and of the instructions) a decider is sent.
pub const MAX_DECIDER_MESSAGE: usize = 16 << 10;
/// The most bytes of transcript a voice's system prompt holds besides its instructions (the
/// oldest lines go first; the newest line, a tool's result, is kept whole up to this).
pub const MAX_BRIEF: usize = 16 << 10;

/// Whether a decider serves the session, and the decision in flight.
#[derive(Debug, Default)]
pub struct Delegation {
    /// The gateway has a decider for backends that call no tools.
    pub configured: bool,
    /// It serves this session: configured, and its backend calls no tools.
    pub serves: bool,
    /// The decision asked for last and not answered yet (a newer turn's replaces it).
    asked: Option<u64>,
    /// The number of the next decision.
    next: u64,
    /// A call decided while a response was in progress, told when it ends.
    held: Option<(String, String)>,
    /// The user item the decider was last asked about.
    last_item: Option<String>,
    /// A newer turn that came while a decision was in flight: asked when it is answered (one
    /// decision in flight per session; the older answer is then dropped).
    queued: Option<String>,
    /// An out-of-band response the decider answers (the voice answers only aloud, from its
    /// conversation): the decision's number and the response's id.
    answering: Option<(u64, String)>,
    /// The newest user turns the detector did not hear as speech (the voice answered a sound):
    /// not decided, whatever a recogniser makes of them.
    unheard: std::collections::VecDeque<String>,
}

/// How many unheard turns are remembered.
const UNHEARD: usize = 8;

impl Driver {
    /// The gateway has a decider for sessions whose backend calls no tools (`[delegation]`).
    pub fn with_delegation(mut self, on: bool) -> Driver {
        self.delegation.configured = on;
        self
    }

    /// Whether a decider serves this session.
    pub(super) fn delegates(&self) -> bool {
        self.delegation.serves
    }

    /// The backend is known (created, or prepared again): a decider serves it if it calls no tools.
    pub(super) fn delegate_for(&mut self, calls_tools: bool) {
        self.delegation.serves = self.delegation.configured && !calls_tools;
    }

    /// Whether the decider is asked about this session's turns: it serves it, and the session
    /// has tools it may call.
    pub(super) fn decides(&self) -> bool {
        let tools = &self.setup.conf.tools;
        self.delegates() && !tools.functions.is_empty() && tools.choice != ToolChoice::None
    }

    /// The turn `item_id` was not heard as speech: it is not decided.
    pub(super) fn unheard_turn(&mut self, item_id: &str) {
        if self.delegation.unheard.len() == UNHEARD {
            self.delegation.unheard.pop_front();
        }
        self.delegation.unheard.push_back(item_id.to_string());
    }

    /// The decider's answers so far are void (the session's tools or instructions changed).
    pub(super) fn forget_decisions(&mut self) {
        self.delegation.asked = None;
        self.delegation.queued = None;
        self.delegation.held = None;
    }

    /// The user's turn `item_id` has its transcript: the decider is asked whether to call a tool
    /// (unless the session has none, or `tool_choice` is `none`). One decision is in flight at
    /// a time: a newer turn waits for it, and is then asked instead of its answer being told.
    pub(super) fn decide_turn(&mut self, item_id: &str) {
        if !self.decides() {
            return;
        }
        if self.delegation.unheard.iter().any(|i| i == item_id) {
            return;
        }
        let said = self.conversation.get(item_id).and_then(|i| i.to_message(|_| String::new()));
        if said.is_some_and(|m| m.role == Role::User && !has_words(&m.text)) {
            // A recogniser's mark for no speech ("[BLANK_AUDIO]", "(wind)"): nothing to decide.
            return;
        }
        // A newer turn replaces a call waiting for the voice to finish.
        self.delegation.held = None;
        self.delegation.last_item = Some(item_id.to_string());
        if self.delegation.asked.is_some() {
            self.delegation.queued = Some(item_id.to_string());
            return;
        }
        let Some(request) = self.decide_request(item_id) else { return };
        let id = self.delegation.next;
        self.delegation.next += 1;
        self.delegation.asked = Some(id);
        self.commands.push(Inbound::Decide { id, request: Box::new(request) });
    }

    /// What the decider is asked about the turn `item_id`: the instructions, the tools, and the
    /// conversation up to that turn as text (what came after it is not what it asks), within
    /// [`MAX_DECIDER_CONVERSATION`]; a call without its result, or a result without its call,
    /// is left out (a chat-completions server refuses either).
    fn decide_request(&self, item_id: &str) -> Option<DecideRequest> {
        let mut messages = Vec::new();
        for item in self.conversation.items() {
            if let Some(m) = item.to_message(|c| self.conversation.tool_of(c)) {
                messages.push(m);
            }
            if item.id == item_id {
                break;
            }
        }
        let messages = well_formed(messages);
        if !messages.iter().any(|m| m.role == Role::User) {
            return None;
        }
        let instructions = clip(&self.setup.conf.instructions, MAX_DECIDER_MESSAGE).to_string();
        Some(DecideRequest { instructions, tools: self.setup.conf.tools.clone(), messages, answer: false })
    }

    /// An out-of-band response (`conversation: "none"`) where the voice takes no typed turns: the
    /// decider answers it in words (or with a call), on the response's own input or the
    /// conversation, with the response's instructions. `response.created` comes at once.
    pub(super) fn answer_out_of_band(&mut self, request: ResponseRequest) -> Result<(), ProtocolError> {
        let messages: Vec<ChatMessage> = match &request.input {
            Some(input) => input
                .iter()
                .map(|i| ChatMessage { images: Vec::new(), audios: Vec::new(), ..i.message.clone() })
                .collect(),
            None => self.conversation.items().filter_map(|i| i.to_message(|c| self.conversation.tool_of(c))).collect(),
        };
        let messages = well_formed(messages);
        if messages.is_empty() {
            return Err(ProtocolError::Refused {
                code: "input_audio_buffer_commit_empty",
                message: "response.create: there is nothing in words to answer (give input, or a conversation with a transcript)"
                    .into(),
            });
        }
        let conf = &self.setup.conf;
        let instructions = request.instructions.clone().unwrap_or_else(|| conf.instructions.clone());
        let tools = match request.tools.clone() {
            Some(t) if t.functions.is_empty() => Tools { functions: conf.tools.functions.clone(), ..t },
            Some(t) => t,
            None => conf.tools.clone(),
        };
        let max_tokens = request.max_tokens.unwrap_or(conf.max_tokens);
        // Words, not the voice: an answer outside the conversation is not spoken.
        self.start_response(false, false, request.metadata, max_tokens, (true, tools.clone()));
        let Some(response) = self.responses.current.as_ref().map(|r| r.id.clone()) else { return Ok(()) };
        let instructions = clip(&instructions, MAX_DECIDER_MESSAGE).to_string();
        let id = self.delegation.next;
        self.delegation.next += 1;
        self.delegation.answering = Some((id, response));
        let request = DecideRequest { instructions, tools, messages, answer: true };
        self.commands.push(Inbound::Decide { id, request: Box::new(request) });
        Ok(())
    }

    /// The decider's answer to an out-of-band response, if `id` is its; answers whether it was.
    fn answered(&mut self, id: u64, result: &Result<Decision, DeciderError>) -> bool {
        let Some((asked, response)) = self.delegation.answering.clone() else { return false };
        if asked != id {
            return false;
        }
        self.delegation.answering = None;
        if self.responses.current.as_ref().is_none_or(|r| r.id != response) {
            // Cancelled meanwhile.
            return true;
        }
        match result {
            Ok(Decision::NoCall(words)) => {
                self.delta(clip(words, MAX_DECIDER_CONVERSATION), &[]);
                self.finish_response(ResponseStatus::Completed, None);
            }
            Ok(Decision::Call { name, arguments }) => {
                self.call_piece(&CallPiece { name: Some(name.clone()), arguments: arguments.clone() });
                self.finish_response(ResponseStatus::Completed, None);
            }
            Err(e) => {
                self.events.push(Event::Error(ProtocolError::Decider(e.clone())));
                self.finish_response(ResponseStatus::Failed, None);
            }
        }
        true
    }

    /// The client asks for a response: its newest user item, if typed (a spoken one was asked
    /// about when its transcript came) and not asked about yet, goes to the decider.
    pub(super) fn decide_typed(&mut self) {
        if !self.delegates() {
            return;
        }
        let typed = |i: &&Item| match &i.body {
            ItemBody::Message { role: Role::User, parts } => parts.iter().any(|p| matches!(p, Part::Text { .. })),
            _ => false,
        };
        let newest =
            self.conversation.items().filter(|i| matches!(&i.body, ItemBody::Message { role: Role::User, .. })).last();
        let Some(item) = newest.filter(typed) else { return };
        if self.delegation.last_item.as_deref() == Some(item.id.as_str()) {
            return;
        }
        let id = item.id.clone();
        self.decide_turn(&id);
    }

    /// The decider's answer: a call is told as the model's would be (after the response in
    /// progress, if one is); no call leaves the answer to the voice; a failure is one error.
    pub fn decided(&mut self, id: u64, result: &Result<Decision, DeciderError>) {
        if self.answered(id, result) {
            return;
        }
        if self.delegation.asked != Some(id) {
            log::debug!("session {:?}: decision {id} is void (the session changed); dropped", self.life.session_id);
            return;
        }
        self.delegation.asked = None;
        if let Some(newer) = self.delegation.queued.take() {
            // A newer turn came meanwhile: its decision, on the whole conversation, is the one.
            log::debug!("session {:?}: decision {id} dropped for a newer turn's", self.life.session_id);
            self.decide_turn(&newer);
            return;
        }
        match result {
            Ok(Decision::Call { name, arguments }) => {
                let call = (name.clone(), arguments.clone());
                if self.responses.current.as_ref().is_some_and(|r| r.awaits_voice()) {
                    // The client's response, not begun by the voice: the call is its output.
                    self.call_piece(&CallPiece { name: Some(call.0), arguments: call.1 });
                    self.finish_response(ResponseStatus::Completed, None);
                } else if self.responses.current.is_some() {
                    // The voice has the floor: the call follows its response.
                    self.delegation.held = Some(call);
                } else {
                    self.tell_decided(call);
                }
            }
            Ok(Decision::NoCall(_)) => {
                let tools = &self.setup.conf.tools;
                let forced = match &tools.choice {
                    ToolChoice::Required => Some("required".to_string()),
                    ToolChoice::Function(f) => Some(f.clone()),
                    ToolChoice::Auto | ToolChoice::None => None,
                };
                if let Some(forced) = forced {
                    let why = format!("tool_choice is '{forced}' and the decider called no tool");
                    metrics().function_calls_refused.with_label_values(&["decider_invalid_output"]).inc();
                    self.events.push(Event::Error(ProtocolError::Decider(DeciderError::InvalidOutput(why))));
                }
            }
            Err(e) => self.events.push(Event::Error(ProtocolError::Decider(e.clone()))),
        }
    }

    /// A response ended: a call decided meanwhile is told now.
    pub(super) fn release_held_call(&mut self) {
        if self.responses.current.is_none()
            && let Some(call) = self.delegation.held.take()
        {
            self.tell_decided(call);
        }
    }

    /// A decided call, as a response of its own with one `function_call` item (checked against
    /// the tool's schema first: a call that fails it is one error and no item).
    fn tell_decided(&mut self, (name, arguments): (String, String)) {
        let (audio, max_tokens, tools) =
            (self.setup.conf.audio_out, self.setup.conf.max_tokens, self.setup.conf.tools.clone());
        self.start_response(false, audio, None, max_tokens, (false, tools));
        self.call_piece(&CallPiece { name: Some(name), arguments });
        self.finish_response(ResponseStatus::Completed, None);
    }

    /// The client asks for a response where the voice takes no typed turns (server VAD on a
    /// backend that calls no tools): the voice is prepared again with what the conversation
    /// holds now, the response's own instructions last, and answers when it next speaks.
    pub(super) fn brief_voice(&mut self, instructions: Option<&str>) {
        let mut setup = self.briefed(self.setup.conf.setup());
        if let Some(extra) = instructions.filter(|s| !s.is_empty()) {
            setup.system_prompt.push_str("\n\nNow: ");
            setup.system_prompt.push_str(extra);
        }
        self.reconfigure(setup, false);
    }

    /// `setup` with a system prompt that holds the conversation so far, for a voice a decider
    /// serves (its model takes context only when it is prepared); else as it is.
    pub(super) fn briefed(&self, mut setup: SessionSetup) -> SessionSetup {
        if !self.delegates() {
            return setup;
        }
        let lines: Vec<String> = self
            .conversation
            .items()
            .filter_map(|i| i.to_message(|c| self.conversation.tool_of(c)))
            .filter_map(|m| line(&m))
            .collect();
        if lines.is_empty() {
            return setup;
        }
        // The newest lines, within the bound; the newest one always (clipped to it).
        let mut kept: Vec<&str> = Vec::new();
        let mut bytes = 0;
        for l in lines.iter().rev() {
            if !kept.is_empty() && bytes + l.len() > MAX_BRIEF {
                break;
            }
            bytes += l.len();
            kept.push(clip(l, MAX_BRIEF));
        }
        kept.reverse();
        metrics().conversation_replays.inc();
        let mut prompt = setup.system_prompt.trim_end().to_string();
        if !prompt.is_empty() {
            prompt.push_str("\n\n");
        }
        prompt.push_str("The conversation so far (you are the assistant; tools were called for you):\n");
        prompt.push_str(&kept.join("\n"));
        setup.system_prompt = prompt;
        setup
    }
}

/// `messages` as a decider is sent them: each at most [`MAX_DECIDER_MESSAGE`], a call without its
/// result or a result without its call left out (a chat-completions server refuses either), and
/// within [`MAX_DECIDER_CONVERSATION`], the oldest dropped first (a call with its result).
fn well_formed(mut messages: Vec<ChatMessage>) -> Vec<ChatMessage> {
    for m in &mut messages {
        if m.text.len() > MAX_DECIDER_MESSAGE {
            m.text = clip(&m.text, MAX_DECIDER_MESSAGE).to_string();
        }
    }
    let has =
        |role: Role, id: &str| messages.iter().any(|m| m.role == role && m.call.as_ref().is_some_and(|c| c.id == id));
    let keep: Vec<bool> = messages
        .iter()
        .map(|m| match (m.role, &m.call) {
            (Role::Assistant, Some(c)) => has(Role::Tool, &c.id),
            (Role::Tool, Some(c)) => has(Role::Assistant, &c.id),
            _ => true,
        })
        .collect();
    let mut keep = keep.into_iter();
    messages.retain(|_| keep.next().unwrap_or(false));
    let mut bytes: usize = messages.iter().map(|m| m.text.len()).sum();
    while bytes > MAX_DECIDER_CONVERSATION && messages.len() > 1 {
        bytes -= messages.remove(0).text.len();
        while messages.first().is_some_and(|m| m.role == Role::Tool) && messages.len() > 1 {
            bytes -= messages.remove(0).text.len();
        }
    }
    messages
}

/// Whether a transcript holds words: something besides a recogniser's bracketed marks.
fn has_words(text: &str) -> bool {
    let mut depth = 0i32;
    text.chars().any(|c| {
        match c {
            '[' | '(' => depth += 1,
            ']' | ')' => depth = (depth - 1).max(0),
            c if depth == 0 && c.is_alphanumeric() => return true,
            _ => {}
        }
        false
    })
}

/// One message as a line of the voice's transcript.
fn line(m: &ChatMessage) -> Option<String> {
    let text = m.text.trim();
    match (m.role, &m.call) {
        (Role::Assistant, Some(call)) => Some(format!("Assistant called the tool {} with {text}", call.name)),
        (Role::Tool, call) => {
            let name = call.as_ref().map_or("a tool", |c| if c.name.is_empty() { "a tool" } else { c.name.as_str() });
            Some(format!("The tool {name} answered: {text}"))
        }
        _ if text.is_empty() => None,
        (Role::User, _) => Some(format!("User: {text}")),
        (Role::Assistant, _) => Some(format!("Assistant: {text}")),
        (Role::System, _) => Some(format!("System: {text}")),
    }
}

/// At most `max` bytes of `s`, cut at a character boundary.
fn clip(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut at = max;
    while !s.is_char_boundary(at) {
        at -= 1;
    }
    &s[..at]
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use omni_actors::domain::{BackendInfo, StepOutcome, Tool, Tools};

    use super::super::tests::{audio, conf, create, kinds, older, respond, speak, tone};
    use super::super::{Command, Limits, NewItem, ResponseRequest};
    use super::*;
    use crate::conversation::items::{ItemBody, Place};

    fn weather() -> Tools {
        let city = r#"{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}"#;
        Tools {
            functions: vec![Tool {
                name: "get_weather".into(),
                description: "weather".into(),
                parameters: city.into(),
            }],
            choice: ToolChoice::Auto,
        }
    }

    /// A session under server VAD on a backend that calls no tools, with a decider.
    fn delegated(tools: Tools) -> Driver {
        let mut c = conf(true);
        c.instructions = "Be brief.".into();
        c.transcription = None;
        c.tools = tools;
        let mut d = Driver::new(c, Limits::default(), &crate::vad::energy())
            .with_gateway_transcription(true)
            .with_delegation(true);
        d.queue_done();
        d.take_commands();
        // A MiniCPM-o worker: no tools, no typed turns, no transcripts of its own.
        d.created("sess_1", &BackendInfo { transcripts: false, ..older() });
        d.take_events();
        d.take_commands();
        d
    }

    /// The user speaks a turn the gateway transcribes as `words` (though the client asked for no
    /// transcripts: the decider reads them): the decision asked, if any. None is asked, and the
    /// turn not transcribed, when there is nothing to decide.
    fn user_says(d: &mut Driver, words: &str) -> Option<(u64, DecideRequest)> {
        audio(d, tone(1.0));
        audio(d, vec![0.0; 16000]);
        let item_id = d.take_commands().into_iter().find_map(|c| match c {
            Inbound::Transcribe { item_id, .. } => Some(item_id),
            _ => None,
        })?;
        d.gateway_transcribed(&item_id, Ok(words));
        d.take_commands().into_iter().find_map(|c| match c {
            Inbound::Decide { id, request } => Some((id, *request)),
            _ => None,
        })
    }

    fn call(name: &str, arguments: &str) -> Result<Decision, DeciderError> {
        Ok(Decision::Call { name: name.into(), arguments: arguments.into() })
    }

    fn codes(events: &[Event]) -> Vec<&'static str> {
        events
            .iter()
            .filter_map(|e| match e {
                Event::Error(e) => Some(e.code()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_decided_call_is_told_as_a_models_and_its_result_briefs_the_voice() {
        let mut d = delegated(weather());
        assert!(d.delegates());
        let (id, request) = user_says(&mut d, "What is the weather in Paris?").expect("a decision is asked");
        assert_eq!(request.instructions, "Be brief.");
        assert_eq!(request.tools, weather());
        let last = request.messages.last().unwrap();
        assert_eq!((last.role, last.text.as_str()), (Role::User, "What is the weather in Paris?"));
        d.take_events();
        d.decided(id, &call("get_weather", r#"{"city":"Paris"}"#));
        let events = d.take_events();
        assert_eq!(
            kinds(&events),
            [
                "response_created",
                "output_item_added",
                "item_added",
                "arguments_delta",
                "voice_done",
                "arguments_done",
                "output_item_done",
                "item_done",
                "response_done"
            ]
        );
        let Event::ArgumentsDone { call_id, .. } = &events[5] else { panic!() };
        // The client's tool answers and asks for a response: the voice is prepared again with
        // the conversation and the result, word for word.
        let output = ItemBody::FunctionCallOutput { call_id: call_id.clone(), output: "21 C and sunny".into() };
        let message = ChatMessage::tool_result(call_id.as_str(), "get_weather", "21 C and sunny");
        create(&mut d, NewItem { id: None, place: Place::End, message, body: output });
        respond(&mut d, ResponseRequest::default()).expect("response.create under VAD works with a decider");
        let commands = d.take_commands();
        let [Inbound::Reconfigure(setup)] = &commands[..] else { panic!("{commands:?}") };
        let prompt = &setup.system_prompt;
        assert!(prompt.starts_with("Be brief.\n\n"), "{prompt}");
        assert!(prompt.contains("User: What is the weather in Paris?"), "{prompt}");
        assert!(prompt.contains(r#"Assistant called the tool get_weather with {"city":"Paris"}"#), "{prompt}");
        assert!(prompt.ends_with("The tool get_weather answered: 21 C and sunny"), "{prompt}");
        // No error, and the tools are not reported unsupported.
        assert!(codes(&d.take_events()).is_empty());
    }

    #[test]
    fn each_failed_turn_is_one_error_and_the_session_goes_on() {
        let mut d = delegated(weather());
        let failures = [
            (Err(DeciderError::Unavailable("down".into())), "decider_unavailable"),
            (Err(DeciderError::Timeout("slow".into())), "decider_timeout"),
            (Err(DeciderError::InvalidOutput("junk".into())), "decider_invalid_output"),
            (call("get_stock", "{}"), "tool_not_found"),
            (call("get_weather", r#"{"town":"Paris"}"#), "invalid_tool_arguments"),
        ];
        for (result, code) in failures {
            let (id, _) = user_says(&mut d, "Weather?").unwrap();
            d.take_events();
            d.decided(id, &result);
            let events = d.take_events();
            assert_eq!(codes(&events), [code], "{events:?}");
            assert!(!events.iter().any(|e| matches!(e, Event::ArgumentsDone { .. })), "no call reaches the client");
        }
        // No call: the voice answers by itself, nothing is said.
        let (id, _) = user_says(&mut d, "Hello").unwrap();
        d.take_events();
        d.decided(id, &Ok(Decision::NoCall("Hi!".into())));
        assert!(d.take_events().is_empty());
    }

    #[test]
    fn a_newer_turn_replaces_the_decision_in_flight_and_a_call_waits_for_the_voice() {
        let mut d = delegated(weather());
        let (first, _) = user_says(&mut d, "Weather in Oslo?").unwrap();
        assert!(user_says(&mut d, "No, in Paris.").is_none(), "one decision in flight a session");
        d.take_events();
        // The first answer is void: the newer turn is asked instead, on both turns.
        d.decided(first, &call("get_weather", r#"{"city":"Oslo"}"#));
        assert!(d.take_events().is_empty(), "the older turn's call is not told: {:?}", d.take_events());
        let commands = d.take_commands();
        let [Inbound::Decide { id: second, request }] = &commands[..] else { panic!("{commands:?}") };
        let second = *second;
        let words: Vec<&str> = request.messages.iter().map(|m| m.text.as_str()).collect();
        assert_eq!(words, ["Weather in Oslo?", "No, in Paris."], "both turns, the newest last");
        // The voice speaks meanwhile: the call is told after its response.
        d.step(&speak("Let me check.", false));
        d.take_events();
        d.decided(second, &call("get_weather", r#"{"city":"Paris"}"#));
        assert!(!kinds(&d.take_events()).contains(&"arguments_done"), "the voice has the floor");
        d.step(&speak(" One moment.", true));
        let events = d.take_events();
        let told: Vec<&str> = events
            .iter()
            .filter_map(|e| match e {
                Event::ArgumentsDone { arguments, .. } => Some(arguments.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(told, [r#"{"city":"Paris"}"#], "only the newest turn's call");
    }

    #[test]
    fn a_call_without_its_result_and_a_message_past_the_bound_are_not_sent_whole() {
        let mut d = delegated(weather());
        // A call the client never answered, then one it did.
        for (id, answered) in [("call_a", false), ("call_b", true)] {
            let body =
                ItemBody::FunctionCall { call_id: id.into(), name: "get_weather".into(), arguments: "{}".into() };
            let message = ChatMessage::tool_call(id, "get_weather", "{}");
            create(&mut d, NewItem { id: None, place: Place::End, message, body });
            if answered {
                let body = ItemBody::FunctionCallOutput { call_id: id.into(), output: "cold".into() };
                let message = ChatMessage::tool_result(id, "get_weather", "cold");
                create(&mut d, NewItem { id: None, place: Place::End, message, body });
            }
        }
        let (_, request) = user_says(&mut d, &"long ".repeat(10_000)).unwrap();
        let calls: Vec<&str> = request.messages.iter().filter_map(|m| m.call.as_ref().map(|c| c.id.as_str())).collect();
        assert_eq!(calls, ["call_b", "call_b"], "the answered call and its result only");
        assert!(request.messages.last().unwrap().text.len() <= MAX_DECIDER_MESSAGE);
    }

    #[test]
    fn without_create_response_the_voice_may_speak_what_the_client_asked_for() {
        let mut d = delegated(weather());
        let mut next = d.conf().clone();
        if let Some(v) = next.vad.as_mut() {
            v.create_response = false;
        }
        d.command(Command::Update(Box::new(next)), Instant::now()).unwrap();
        d.take_commands();
        let forced = |d: &mut Driver| -> Vec<bool> {
            audio(d, vec![0.0; 16000]);
            d.take_commands()
                .iter()
                .filter_map(|c| match c {
                    Inbound::Chunk(c) => Some(c.force_listen),
                    _ => None,
                })
                .collect()
        };
        assert_eq!(forced(&mut d), [true], "the model never takes the floor by itself");
        respond(&mut d, ResponseRequest::default()).unwrap();
        d.take_commands();
        assert_eq!(forced(&mut d), [false], "it may speak the response asked of it");
        d.step(&speak("Hello.", false));
        assert_eq!(forced(&mut d), [false], "and go on speaking it");
        d.step(&speak(" Bye.", true));
        assert_eq!(forced(&mut d), [true]);
    }

    #[test]
    fn an_out_of_band_response_is_the_deciders_words_outside_the_conversation() {
        let mut d = delegated(weather());
        // Nothing in words yet: refused with the reason, nothing asked.
        let e = respond(&mut d, ResponseRequest { out_of_band: true, ..Default::default() }).unwrap_err();
        assert_eq!(e.code(), "input_audio_buffer_commit_empty");
        let (id, _) = user_says(&mut d, "I would like to book a table.").unwrap();
        d.decided(id, &Ok(Decision::NoCall(String::new())));
        d.take_events();
        let request = ResponseRequest {
            out_of_band: true,
            instructions: Some("Classify the user's intent in one word.".into()),
            metadata: Some(vec![("topic".into(), "intent".into())]),
            ..Default::default()
        };
        respond(&mut d, request).unwrap();
        let commands = d.take_commands();
        let [Inbound::Decide { id, request }] = &commands[..] else { panic!("{commands:?}") };
        assert!(request.answer && request.instructions == "Classify the user's intent in one word.");
        assert_eq!(request.messages.last().map(|m| m.text.as_str()), Some("I would like to book a table."));
        assert_eq!(kinds(&d.take_events()), ["response_created"]);
        let items = d.conversation.len();
        d.decided(*id, &Ok(Decision::NoCall("booking".into())));
        let events = d.take_events();
        let Some(Event::ResponseDone(done)) = events.last() else { panic!("{events:?}") };
        assert_eq!(
            (done.status, done.audio, done.conversation_id.as_deref()),
            (ResponseStatus::Completed, false, None)
        );
        assert!(events.iter().any(|e| matches!(e, Event::TextDelta { delta, .. } if delta == "booking")), "{events:?}");
        assert_eq!(d.conversation.len(), items, "outside the conversation");
        // The decider failing it: one error, the response failed.
        respond(&mut d, ResponseRequest { out_of_band: true, ..Default::default() }).unwrap();
        let commands = d.take_commands();
        let [Inbound::Decide { id, .. }] = &commands[..] else { panic!("{commands:?}") };
        d.take_events();
        d.decided(*id, &Err(DeciderError::Timeout("slow".into())));
        let events = d.take_events();
        assert_eq!(codes(&events), ["decider_timeout"]);
        let Some(Event::ResponseDone(done)) = events.last() else { panic!("{events:?}") };
        assert_eq!(done.status, ResponseStatus::Failed);
    }

    #[test]
    fn a_turn_with_no_words_is_not_decided() {
        let mut d = delegated(weather());
        assert!(user_says(&mut d, "[BLANK_AUDIO]").is_none());
        assert!(user_says(&mut d, " (wind blowing) ").is_none());
        assert!(user_says(&mut d, "[music] Paris?").is_some());
    }

    #[test]
    fn tool_choice_none_asks_nothing_and_required_wants_a_call() {
        let mut d = delegated(Tools { choice: ToolChoice::None, ..weather() });
        assert!(user_says(&mut d, "Weather?").is_none());
        let mut d = delegated(Tools { choice: ToolChoice::Required, ..weather() });
        let (id, _) = user_says(&mut d, "Weather?").unwrap();
        d.take_events();
        d.decided(id, &Ok(Decision::NoCall("no".into())));
        assert_eq!(codes(&d.take_events()), ["decider_invalid_output"]);
    }

    #[test]
    fn new_instructions_keep_the_conversation_in_the_voices_prompt() {
        let mut d = delegated(weather());
        let (id, _) = user_says(&mut d, "My name is Ada.").unwrap();
        d.decided(id, &Ok(Decision::NoCall(String::new())));
        d.step(&speak("Hello Ada.", true));
        d.take_events();
        let mut next = d.conf().clone();
        next.instructions = "You are the billing agent.".into();
        d.command(Command::Update(Box::new(next)), Instant::now()).unwrap();
        let commands = d.take_commands();
        let [Inbound::Reconfigure(setup)] = &commands[..] else { panic!("{commands:?}") };
        let prompt = &setup.system_prompt;
        assert!(prompt.starts_with("You are the billing agent."), "{prompt}");
        assert!(prompt.contains("User: My name is Ada.\nAssistant: Hello Ada."), "{prompt}");
    }

    #[test]
    fn a_typed_turn_is_decided_when_the_client_asks_for_a_response_once() {
        use crate::conversation::items::{Part, TextKind};
        let mut d = delegated(weather());
        let text = "What is the weather in Oslo?";
        let body = ItemBody::Message {
            role: Role::User,
            parts: vec![Part::Text { kind: TextKind::InputText, text: text.into() }],
        };
        let message = ChatMessage::text(Role::User, text);
        create(&mut d, NewItem { id: None, place: Place::End, message, body });
        assert!(d.take_commands().is_empty(), "nothing is asked before the client asks for a response");
        d.take_events();
        respond(&mut d, ResponseRequest::default()).unwrap();
        let commands = d.take_commands();
        let [Inbound::Decide { request, .. }, Inbound::Reconfigure(_)] = &commands[..] else { panic!("{commands:?}") };
        assert_eq!(request.messages.last().map(|m| m.text.as_str()), Some(text));
        let created = d.take_events();
        assert_eq!(kinds(&created), ["response_created"], "the client's response is open at once");
        // Listen steps do not end it: it waits for the voice or a call. The call is its output.
        d.step(&StepOutcome::default());
        assert!(d.take_events().is_empty());
        let Inbound::Decide { id, .. } = &commands[0] else { unreachable!() };
        d.decided(*id, &call("get_weather", r#"{"city":"Oslo"}"#));
        let events = d.take_events();
        assert_eq!(kinds(&events)[..2], ["output_item_added", "item_added"], "{events:?}");
        let Some(Event::ResponseDone(done)) = events.last() else { panic!("{events:?}") };
        let Event::ResponseCreated(opened) = &created[0] else { panic!("{created:?}") };
        assert_eq!(
            (done.id.as_str(), done.output.len()),
            (opened.id.as_str(), 1),
            "the same response, the call its output"
        );
        // Asked once: a second response.create on the same turn asks nothing more; the voice's
        // words are its answer.
        respond(&mut d, ResponseRequest::default()).unwrap();
        assert!(!d.take_commands().iter().any(|c| matches!(c, Inbound::Decide { .. })));
        d.step(&speak("It is cold.", true));
        let events = d.take_events();
        let Some(Event::ResponseDone(done)) = events.last() else { panic!("{events:?}") };
        assert_eq!(done.status, ResponseStatus::Completed);
    }

    #[test]
    fn what_a_voice_and_a_decider_are_given_is_bounded() {
        let mut d = delegated(weather());
        for _ in 0..40 {
            let long = "word ".repeat(1000);
            let (id, request) = user_says(&mut d, &long).unwrap();
            assert!(request.messages.iter().map(|m| m.text.len()).sum::<usize>() <= MAX_DECIDER_CONVERSATION);
            d.decided(id, &Ok(Decision::NoCall(String::new())));
        }
        respond(&mut d, ResponseRequest::default()).unwrap();
        let commands = d.take_commands();
        let [Inbound::Reconfigure(setup)] = &commands[..] else { panic!("{commands:?}") };
        assert!(setup.system_prompt.len() <= MAX_BRIEF + 200, "{}", setup.system_prompt.len());
    }
}
