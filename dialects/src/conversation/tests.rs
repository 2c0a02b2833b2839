//! The driver on typed commands and events, without a codec or a runtime.

use std::time::{Duration, Instant};

use omni_actors::domain::{
    BackendInfo, CallPiece, ChatMessage, Role, SessionKind, StepKind, StepOutcome, Tool, ToolChoice, Tools,
};
use omni_actors::protocol::{Inbound, ProtocolError};
use serde_json::json;

use super::items::{Item, ItemBody, ItemStatus, Part, Place, TextKind};
use super::*;
use crate::settings::Settings;

pub(super) fn conf(vad: bool) -> Conf {
    Conf {
        instructions: String::new(),
        voice: "alloy".into(),
        voice_named: false,
        audio_out: true,
        vad: vad.then(|| Vad {
            kind: "server_vad".into(),
            threshold: 0.5,
            prefix_padding_ms: 300,
            silence_duration_ms: 500,
            eagerness: None,
            create_response: true,
            interrupt_response: true,
            idle_timeout_ms: None,
        }),
        temperature: None,
        max_tokens: None,
        input_rate: 16000,
        input_coding: Default::default(),
        output_coding: Default::default(),
        transcription: Some(json!({"model": "any"})),
        settings: Settings::default(),
        tools: Tools::default(),
        truncation: Truncation::Auto,
        unapplied: Vec::new(),
    }
}

/// A backend of ABI 1.3: it keeps a conversation and calls tools.
fn backend() -> BackendInfo {
    BackendInfo {
        name: "test".into(),
        transcripts: true,
        token_details: true,
        duplex: true,
        turn: true,
        abi_revision: 3,
        tools: true,
        ..BackendInfo::default()
    }
}

/// A backend of ABI 1.2: no calls, no turns in duplex sessions, no prefill-only turns.
pub(super) fn older() -> BackendInfo {
    BackendInfo { abi_revision: 2, tools: false, name: "older".into(), ..backend() }
}

/// A driver whose session is created on `backend`.
fn active_on(vad: bool, backend: &BackendInfo) -> Driver {
    let mut d = Driver::new(conf(vad), Limits::default(), &crate::vad::energy());
    d.queue_done();
    assert!(matches!(d.take_commands()[..], [Inbound::Init(_)]));
    d.created("sess_1", backend);
    d.take_events();
    d
}

/// A driver whose session is created on a 1.3 backend.
fn active(vad: bool) -> Driver {
    active_on(vad, &backend())
}

fn said(id: Option<&str>, role: Role, text: &str) -> NewItem {
    NewItem {
        id: id.map(String::from),
        place: Place::End,
        message: ChatMessage::text(role, text),
        body: ItemBody::Message { role, parts: vec![Part::Text { kind: TextKind::InputText, text: text.into() }] },
    }
}

pub(super) fn create(d: &mut Driver, item: NewItem) {
    d.command(Command::CreateItem(Box::new(item)), Instant::now()).unwrap();
}

pub(super) fn respond(d: &mut Driver, request: ResponseRequest) -> Result<(), ProtocolError> {
    d.command(Command::CreateResponse(Box::new(request)), Instant::now())
}

/// The one turn the driver sent.
fn the_turn(d: &mut Driver) -> omni_actors::domain::TurnInput {
    let commands = d.take_commands();
    let turns: Vec<_> = commands
        .into_iter()
        .filter_map(|c| match c {
            Inbound::Turn { input, streaming: true } => Some(input),
            _ => None,
        })
        .collect();
    let [turn] = &turns[..] else { panic!("one turn expected: {turns:?}") };
    turn.clone()
}

fn texts(turn: &omni_actors::domain::TurnInput) -> Vec<(Role, &str)> {
    turn.messages.iter().map(|m| (m.role, m.text.as_str())).collect()
}

fn kind(e: &Event) -> &'static str {
    match e {
        Event::Queued(_) => "queued",
        Event::QueueUpdate(_) => "queue_update",
        Event::SessionCreated(_) => "session_created",
        Event::SessionUpdated(_) => "session_updated",
        Event::Unsupported { .. } => "unsupported",
        Event::Error(_) => "error",
        Event::SpeechStarted { .. } => "speech_started",
        Event::SpeechStopped { .. } => "speech_stopped",
        Event::Committed { .. } => "committed",
        Event::Cleared => "cleared",
        Event::KeyPressed { .. } => "key_pressed",
        Event::IdleTimeout { .. } => "idle_timeout",
        Event::ItemAdded { .. } => "item_added",
        Event::ItemDone { .. } => "item_done",
        Event::ItemRetrieved { .. } => "item_retrieved",
        Event::ItemDeleted { .. } => "item_deleted",
        Event::ItemTruncated { .. } => "item_truncated",
        Event::ArgumentsDelta { .. } => "arguments_delta",
        Event::ArgumentsDone { .. } => "arguments_done",
        Event::TranscriptionDelta { .. } => "transcription_delta",
        Event::TranscriptionCompleted { .. } => "transcription_completed",
        Event::TranscriptionFailed { .. } => "transcription_failed",
        Event::ResponseCreated(_) => "response_created",
        Event::OutputItemAdded { .. } => "output_item_added",
        Event::ContentPartAdded { .. } => "content_part_added",
        Event::TextDelta { .. } => "text_delta",
        Event::AudioDelta { .. } => "audio_delta",
        Event::AudioDone { .. } => "audio_done",
        Event::TextDone { .. } => "text_done",
        Event::ContentPartDone { .. } => "content_part_done",
        Event::OutputItemDone { .. } => "output_item_done",
        Event::ResponseDone(_) => "response_done",
        Event::VoiceDone { .. } => "voice_done",
        Event::VoiceCleared => "voice_cleared",
        Event::Finished => "finished",
        Event::Ended(_) => "ended",
    }
}

pub(super) fn kinds(events: &[Event]) -> Vec<&'static str> {
    events.iter().map(kind).collect()
}

pub(super) fn tone(seconds: f32) -> Vec<f32> {
    (0..(16000.0 * seconds) as usize).map(|i| 0.3 * (i as f32 * 0.1).sin()).collect()
}

pub(super) fn speak(text: &str, end_of_turn: bool) -> StepOutcome {
    StepOutcome {
        kind: StepKind::Speak,
        text: text.into(),
        audio: vec![0.1; 2400],
        end_of_turn,
        input_tokens: 5,
        output_tokens: 1,
        input_audio_tokens: 4,
        output_audio_tokens: 3,
        ..StepOutcome::default()
    }
}

pub(super) fn audio(d: &mut Driver, samples: Vec<f32>) {
    d.command(Command::Audio { samples, rate: 16000 }, Instant::now()).unwrap();
}

#[test]
fn before_the_session_is_created_events_and_input_are_held_then_released_in_order() {
    let mut d = Driver::new(conf(true), Limits::default(), &crate::vad::energy());
    d.queued(
        omni_actors::protocol::QueueInfo {
            ticket: 1,
            position: 1,
            estimated_wait_s: 1.0,
            queue_length: 1,
            measured: false,
        },
        true,
    );
    assert_eq!(kinds(&d.take_events()), ["queued"], "queue news is heard at once");
    audio(&mut d, tone(1.2));
    assert!(d.take_events().is_empty() && d.take_commands().is_empty(), "a waiting client hears nothing");
    d.queue_done();
    assert!(matches!(d.take_commands()[..], [Inbound::Init(_)]));
    d.created("sess_1", &backend());
    assert_eq!(kinds(&d.take_events()), ["session_created", "speech_started"]);
    let commands = d.take_commands();
    assert!(matches!(&commands[..], [Inbound::Chunk(c)] if c.audio.len() == DEFAULT_STEP), "{commands:?}");
}

#[test]
fn a_spoken_turn_is_committed_at_its_end_and_becomes_an_item() {
    let mut d = active(true);
    audio(&mut d, tone(1.0));
    audio(&mut d, vec![0.0; 16000]);
    let events = d.take_events();
    assert_eq!(kinds(&events), ["voice_cleared", "speech_started", "speech_stopped", "committed", "item_added"]);
    let Event::ItemAdded { item, previous_item_id: None } = &events[4] else { panic!("{events:?}") };
    let ItemBody::Message { role: Role::User, parts } = &item.body else { panic!("{item:?}") };
    assert!(matches!(parts[..], [Part::InputAudio { transcript: None, audio_ms: 900..=1100 }]), "{parts:?}");
    assert_eq!(d.conversation.len(), 1);
}

#[test]
fn the_duplex_models_speech_is_a_response_kept_in_the_conversation() {
    let mut d = active(true);
    audio(&mut d, tone(1.0));
    d.take_events();
    d.model_heard("Hi");
    d.step(&speak("Hello", false));
    d.step(&speak(" there", true));
    let events = d.take_events();
    assert_eq!(
        kinds(&events),
        [
            "speech_stopped",
            "committed",
            "item_added",
            "transcription_completed",
            "response_created",
            "output_item_added",
            "item_added",
            "content_part_added",
            "text_delta",
            "audio_delta",
            "text_delta",
            "audio_delta",
            "voice_done",
            "audio_done",
            "text_done",
            "content_part_done",
            "output_item_done",
            "item_done",
            "response_done",
        ]
    );
    let Some(Event::ResponseDone(done)) = events.last() else { panic!() };
    assert_eq!(done.status, ResponseStatus::Completed);
    assert_eq!(
        done.usage,
        Some(Usage { input: 10, input_audio: 8, output: 2 + 6, output_text: 2, output_audio: 6 }),
        "two steps' tokens"
    );
    let items: Vec<_> = d.conversation.items().cloned().collect();
    assert_eq!(items.len(), 2, "the user's turn and the answer");
    let ItemBody::Message { role: Role::User, parts } = &items[0].body else { panic!() };
    assert!(matches!(&parts[..], [Part::InputAudio { transcript: Some(t), .. }] if t == "Hi"), "{parts:?}");
    assert_eq!(items[1].status, ItemStatus::Completed);
    assert_eq!(
        items[1].body,
        ItemBody::Message {
            role: Role::Assistant,
            parts: vec![Part::Answer { audio: true, text: "Hello there".into(), audio_ms: 200 }]
        }
    );
}

#[test]
fn speech_over_the_answer_cuts_it_short_and_the_backend_listens() {
    let mut d = active(true);
    audio(&mut d, tone(1.0));
    d.step(&speak("Hello", false));
    d.take_events();
    d.take_commands();
    audio(&mut d, vec![0.0; 16000]);
    audio(&mut d, tone(0.5));
    let events = d.take_events();
    let names = kinds(&events);
    let done = names.iter().position(|k| *k == "response_done").expect("the answer ends");
    let Event::ResponseDone(view) = &events[done] else { unreachable!() };
    assert_eq!((view.status, view.reason), (ResponseStatus::Cancelled, Some("turn_detected")));
    assert_eq!(names[done..], ["response_done", "voice_cleared", "speech_started"]);
    assert!(d.take_commands().iter().any(|c| matches!(c, Inbound::Interrupt)), "force-listen");
    assert_eq!(d.conversation.items().last().map(|i| i.status), Some(ItemStatus::Incomplete));
}

#[test]
fn a_key_pressed_is_told_and_read_by_the_next_answer_without_asking_for_one() {
    let mut d = active(false);
    d.command(Command::Key('7'), Instant::now()).unwrap();
    assert_eq!(kinds(&d.take_events()), ["key_pressed", "item_added", "item_done"]);
    assert!(d.take_commands().is_empty(), "a key alone asks for no answer");
    respond(&mut d, ResponseRequest { audio: Some(false), ..Default::default() }).unwrap();
    let turn = the_turn(&mut d);
    assert_eq!(texts(&turn), [(Role::User, "(the caller pressed 7 on the keypad)")]);
}

#[test]
fn a_manual_turn_answers_the_items_since_the_last_answer() {
    let mut d = active(false);
    create(&mut d, said(Some("mine"), Role::User, "hi"));
    let request = ResponseRequest { audio: Some(false), instructions: Some("be brief".into()), ..Default::default() };
    respond(&mut d, request).unwrap();
    let turn = the_turn(&mut d);
    assert_eq!(texts(&turn), [(Role::User, "hi"), (Role::System, "be brief")], "the response's own instructions last");
    assert!(!turn.speech && turn.continues);
    let e = respond(&mut d, ResponseRequest::default()).unwrap_err();
    assert_eq!(e.code(), "conversation_already_has_active_response", "one response at a time");
    d.turn_delta("ok", &[], None);
    d.turn_done([3, 1, 0, 0], false);
    let events = d.take_events();
    assert_eq!(kinds(&events)[..3], ["item_added", "item_done", "response_created"]);
    let Event::ItemAdded { item, .. } = &events[0] else { panic!() };
    assert_eq!(item.id, "mine", "the client's own id");
    let Some(Event::ResponseDone(done)) = events.last() else { panic!() };
    assert_eq!((done.status, done.usage.map(|u| u.input)), (ResponseStatus::Completed, Some(3)));
    // The response's own instructions were for it alone: the next answer replays the conversation.
    respond(&mut d, ResponseRequest::default()).unwrap();
    let turn = the_turn(&mut d);
    assert!(!turn.continues);
    assert_eq!(texts(&turn), [(Role::User, "hi"), (Role::Assistant, "ok")]);
    assert_eq!(d.command(Command::Cancel, Instant::now()).map(|_| ()), Ok(()));
    let e = d.command(Command::Cancel, Instant::now()).unwrap_err();
    assert_eq!(e.code(), "response_cancel_not_active");
    let e = d.command(Command::Commit, Instant::now()).unwrap_err();
    assert_eq!(e.code(), "input_audio_buffer_commit_empty");
}

#[test]
fn under_server_vad_a_response_is_a_turn_in_the_duplex_session() {
    let mut d = active(true);
    respond(&mut d, ResponseRequest::default()).unwrap();
    let greeting = the_turn(&mut d);
    assert!(greeting.messages.is_empty() && greeting.continues, "nothing new: the model speaks first");
    d.turn_delta("Hello!", &[0.1; 2400], None);
    d.turn_done([1, 1, 0, 0], false);
    create(&mut d, said(None, Role::System, "typed input"));
    create(&mut d, said(None, Role::User, "What time is it?"));
    respond(&mut d, ResponseRequest::default()).unwrap();
    let turn = the_turn(&mut d);
    assert_eq!(texts(&turn), [(Role::System, "typed input"), (Role::User, "What time is it?")]);
    // The duplex model's words while the turn answers are not the response's.
    d.step(&speak("stray", true));
    d.turn_delta("It is noon.", &[], None);
    d.turn_done([5, 3, 0, 0], false);
    let events = d.take_events();
    let deltas: Vec<_> = events
        .iter()
        .filter_map(|e| if let Event::TextDelta { delta, .. } = e { Some(delta.as_str()) } else { None })
        .collect();
    assert_eq!(deltas, ["Hello!", "It is noon."]);
    let answers: Vec<_> = d.conversation.items().map(|i| i.id.clone()).collect();
    assert_eq!(answers.len(), 4, "answer, two items, answer: {answers:?}");
}

#[test]
fn an_older_backend_under_server_vad_answers_speech_only_and_says_so() {
    let mut d = active_on(true, &older());
    let e = respond(&mut d, ResponseRequest::default()).unwrap_err();
    assert_eq!(e.code(), "response_create_unsupported");
    assert!(e.to_string().contains("older"), "{e}");
    // In manual turns it is given the whole conversation, calls written as words.
    let mut d = active_on(false, &older());
    create(&mut d, said(None, Role::User, "hi"));
    let output = ItemBody::FunctionCallOutput { call_id: "call_9".into(), output: "noon".into() };
    let message = ChatMessage::tool_result("call_9", "get_time", "noon");
    create(&mut d, NewItem { id: None, place: Place::End, message, body: output });
    respond(&mut d, ResponseRequest::default()).unwrap();
    let turn = the_turn(&mut d);
    assert_eq!(texts(&turn), [(Role::User, "hi"), (Role::User, "(the tool get_time answered: noon)")]);
}

fn get_time() -> Tools {
    let tool = Tool { name: "get_time".into(), description: "now".into(), parameters: "{}".into() };
    Tools { functions: vec![tool], choice: ToolChoice::Auto }
}

#[test]
fn a_function_call_is_an_output_item_and_its_result_continues_the_turn() {
    let mut d = active(false);
    let mut next = d.conf().clone();
    next.tools = get_time();
    d.command(Command::Update(Box::new(next)), Instant::now()).unwrap();
    let commands = d.take_commands();
    assert!(matches!(&commands[..], [Inbound::Reconfigure(s)] if s.tools == get_time()), "{commands:?}");
    d.reconfigured(&backend());
    create(&mut d, said(None, Role::User, "What time is it?"));
    respond(&mut d, ResponseRequest { metadata: Some(vec![("k".into(), "v".into())]), ..Default::default() }).unwrap();
    the_turn(&mut d);
    d.take_events();
    d.turn_delta("", &[], Some(&CallPiece { name: Some("get_time".into()), arguments: "{".into() }));
    d.turn_delta("", &[], Some(&CallPiece { name: None, arguments: "}".into() }));
    d.turn_done([4, 2, 0, 0], false);
    let events = d.take_events();
    // The call is told once written whole and checked: its arguments in one delta.
    assert_eq!(
        kinds(&events),
        [
            "output_item_added",
            "item_added",
            "arguments_delta",
            "voice_done",
            "arguments_done",
            "output_item_done",
            "item_done",
            "response_done",
        ]
    );
    let Event::ArgumentsDone { call_id, name, arguments, at } = &events[4] else { panic!() };
    assert_eq!((name.as_str(), arguments.as_str(), at.output_index), ("get_time", "{}", 0));
    let Some(Event::ResponseDone(done)) = events.last() else { panic!() };
    assert_eq!(done.metadata, Some(vec![("k".into(), "v".into())]), "the client's metadata, echoed");
    let [Item { body: ItemBody::FunctionCall { .. }, status: ItemStatus::Completed, .. }] = &done.output[..] else {
        panic!("{:?}", done.output)
    };
    // The client's tool answers; the next response takes its result.
    let output = ItemBody::FunctionCallOutput { call_id: call_id.clone(), output: "noon".into() };
    let message = ChatMessage::tool_result(call_id.as_str(), "get_time", "noon");
    create(&mut d, NewItem { id: None, place: Place::End, message, body: output });
    respond(&mut d, ResponseRequest::default()).unwrap();
    let turn = the_turn(&mut d);
    assert!(turn.continues, "the call is in the backend's context already");
    assert_eq!(turn.messages[0].call.as_ref().map(|c| c.name.as_str()), Some("get_time"));
    assert_eq!(texts(&turn), [(Role::Tool, "noon")]);
}

#[test]
fn a_call_of_a_tool_not_given_or_with_arguments_its_schema_refuses_is_one_error_and_no_call() {
    let mut d = active(false);
    let mut next = d.conf().clone();
    let city = r#"{"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}"#;
    next.tools = Tools {
        functions: vec![Tool { name: "get_weather".into(), description: String::new(), parameters: city.into() }],
        choice: ToolChoice::Auto,
    };
    d.command(Command::Update(Box::new(next)), Instant::now()).unwrap();
    d.take_commands();
    d.reconfigured(&backend());
    for (name, arguments, code) in
        [("get_stock", "{}", "tool_not_found"), ("get_weather", "{}", "invalid_tool_arguments")]
    {
        create(&mut d, said(None, Role::User, "Weather in Paris?"));
        respond(&mut d, ResponseRequest::default()).unwrap();
        the_turn(&mut d);
        d.take_events();
        d.turn_delta("", &[], Some(&CallPiece { name: Some(name.into()), arguments: arguments.into() }));
        d.turn_done([4, 2, 0, 0], false);
        let events = d.take_events();
        assert_eq!(kinds(&events), ["error", "voice_done", "response_done"], "{name}");
        let Event::Error(e) = &events[0] else { panic!() };
        assert_eq!(e.code(), code);
        let Some(Event::ResponseDone(done)) = events.last() else { panic!() };
        assert!(done.output.is_empty(), "no call reaches the client: {:?}", done.output);
    }
    assert!(
        !d.conversation.items().any(|i| matches!(i.body, ItemBody::FunctionCall { .. })),
        "and none is kept in the conversation"
    );
    // A call the schema takes goes out.
    create(&mut d, said(None, Role::User, "Weather in Paris?"));
    respond(&mut d, ResponseRequest::default()).unwrap();
    the_turn(&mut d);
    d.take_events();
    d.turn_delta("", &[], Some(&CallPiece { name: Some("get_weather".into()), arguments: r#"{"city":"#.into() }));
    d.turn_delta("", &[], Some(&CallPiece { name: None, arguments: r#" "Paris"}"#.into() }));
    d.turn_done([4, 2, 0, 0], false);
    assert!(kinds(&d.take_events()).contains(&"arguments_done"));
}

#[test]
fn the_client_edits_the_conversation_and_the_next_answer_replays_it() {
    let mut d = active(false);
    create(&mut d, said(Some("a"), Role::User, "one"));
    respond(&mut d, ResponseRequest::default()).unwrap();
    the_turn(&mut d);
    d.turn_delta("First answer here", &[0.1; 24000], None);
    d.turn_done([1, 3, 0, 0], false);
    let answer = d.conversation.items().last().unwrap().id.clone();
    d.take_events();
    // Heard up to three quarters of its second of voice: its words in proportion.
    d.command(Command::Truncate { item_id: answer.clone(), content_index: 0, audio_end_ms: 750 }, Instant::now())
        .unwrap();
    d.command(Command::Retrieve { item_id: answer.clone() }, Instant::now()).unwrap();
    let events = d.take_events();
    assert_eq!(kinds(&events), ["item_truncated", "item_retrieved"]);
    let Event::ItemRetrieved { item } = &events[1] else { panic!() };
    assert_eq!(
        item.body,
        ItemBody::Message {
            role: Role::Assistant,
            parts: vec![Part::Answer { audio: true, text: "First answer".into(), audio_ms: 750 }]
        }
    );
    let mut first = said(Some("r"), Role::System, "zero");
    first.place = Place::Root;
    create(&mut d, first);
    d.command(Command::Delete { item_id: "a".into() }, Instant::now()).unwrap();
    let e = d.command(Command::Delete { item_id: "a".into() }, Instant::now()).unwrap_err();
    assert_eq!(e.code(), "item_delete_invalid_item_id");
    let e = d.command(Command::Retrieve { item_id: "a".into() }, Instant::now()).unwrap_err();
    assert_eq!(e.code(), "item_retrieve_invalid_item_id");
    let e = d
        .command(Command::Truncate { item_id: "r".into(), content_index: 0, audio_end_ms: 0 }, Instant::now())
        .unwrap_err();
    assert_eq!(e.code(), "invalid_payload", "a system message has no audio to cut");
    let mut lost = said(None, Role::User, "?");
    lost.place = Place::After("nope".into());
    let e = d.command(Command::CreateItem(Box::new(lost)), Instant::now()).unwrap_err();
    assert_eq!(e.code(), "previous_item_not_found");
    create(&mut d, said(None, Role::User, "two"));
    respond(&mut d, ResponseRequest::default()).unwrap();
    let turn = the_turn(&mut d);
    assert!(!turn.continues, "out of line: the whole conversation");
    assert_eq!(texts(&turn), [(Role::System, "zero"), (Role::Assistant, "First answer"), (Role::User, "two")]);
    // A truncate at or past the end changes nothing, and is no error.
    d.turn_done([0, 0, 0, 0], false);
    d.take_events();
    d.command(Command::Truncate { item_id: answer, content_index: 0, audio_end_ms: 10_000 }, Instant::now()).unwrap();
    create(&mut d, said(None, Role::User, "three"));
    respond(&mut d, ResponseRequest::default()).unwrap();
    assert!(the_turn(&mut d).continues);
}

#[test]
fn an_out_of_band_response_leaves_the_conversation_alone() {
    let mut d = active(false);
    create(&mut d, said(None, Role::User, "keep me"));
    let input = vec![said(None, Role::User, "Classify: fine")];
    let request = ResponseRequest { out_of_band: true, input: Some(input), ..Default::default() };
    respond(&mut d, request).unwrap();
    let turn = the_turn(&mut d);
    assert_eq!((texts(&turn), turn.continues), (vec![(Role::User, "Classify: fine")], false));
    d.turn_delta("positive", &[], None);
    d.turn_done([1, 1, 0, 0], false);
    let events = d.take_events();
    assert!(
        !kinds(&events).contains(&"item_done") || kinds(&events).iter().filter(|k| **k == "item_done").count() == 1
    );
    let Some(Event::ResponseDone(done)) = events.last() else { panic!() };
    assert_eq!((done.conversation_id.as_deref(), done.output.len()), (None, 1));
    assert_eq!(d.conversation.len(), 1, "only the client's item");
    respond(&mut d, ResponseRequest::default()).unwrap();
    let turn = the_turn(&mut d);
    assert_eq!((texts(&turn), turn.continues), (vec![(Role::User, "keep me")], false));
}

#[test]
fn new_instructions_prepare_the_backend_again_and_replay_the_conversation() {
    let mut d = active(true);
    create(&mut d, said(None, Role::User, "My name is Ada."));
    respond(&mut d, ResponseRequest::default()).unwrap();
    the_turn(&mut d);
    d.turn_delta("Hello Ada.", &[], None);
    d.turn_done([1, 1, 0, 0], false);
    let mut next = d.conf().clone();
    next.instructions = "Speak Spanish.".into();
    d.command(Command::Update(Box::new(next)), Instant::now()).unwrap();
    let commands = d.take_commands();
    let [Inbound::Reconfigure(setup), Inbound::Turn { input, .. }] = &commands[..] else { panic!("{commands:?}") };
    assert_eq!(setup.system_prompt, "Speak Spanish.");
    assert!(input.prefill_only && !input.continues);
    assert_eq!(texts(input), [(Role::User, "My name is Ada."), (Role::Assistant, "Hello Ada.")]);
    d.turn_done([0, 0, 0, 0], false);
    d.reconfigured(&backend());
    assert!(kinds(&d.take_events()).contains(&"session_updated"));
}

#[test]
fn a_full_context_drops_the_oldest_items_and_answers_again() {
    let mut d = active(false);
    for i in 0..4 {
        create(&mut d, said(Some(&format!("u{i}")), Role::User, "0123456789"));
    }
    respond(&mut d, ResponseRequest::default()).unwrap();
    the_turn(&mut d);
    d.take_events();
    assert!(d.context_full(), "the session goes on");
    let commands = d.take_commands();
    let [Inbound::Reconfigure(_), Inbound::Turn { input, .. }] = &commands[..] else { panic!("{commands:?}") };
    assert!(!input.prefill_only && !input.continues, "the answer again, on what is left");
    assert_eq!(texts(input), [(Role::User, "0123456789"), (Role::User, "0123456789")], "half kept");
    assert!(d.context_full(), "room is being made already");
    assert!(d.take_commands().is_empty());
    d.reconfigured(&backend());
    d.turn_delta("ok", &[], None);
    d.turn_done([1, 1, 0, 0], false);
    assert!(matches!(d.take_events().last(), Some(Event::ResponseDone(r)) if r.status == ResponseStatus::Completed));
    let mut disabled = active(false);
    let mut next = disabled.conf().clone();
    next.truncation = Truncation::Disabled;
    disabled.command(Command::Update(Box::new(next)), Instant::now()).unwrap();
    create(&mut disabled, said(None, Role::User, "x"));
    assert!(!disabled.context_full(), "truncation disabled: the session ends");
}

#[test]
fn turn_detection_options_shape_who_takes_the_floor() {
    // Without create_response the duplex model never speaks by itself.
    let mut d = active(true);
    let mut next = d.conf().clone();
    next.vad.as_mut().unwrap().create_response = false;
    next.vad.as_mut().unwrap().interrupt_response = false;
    d.command(Command::Update(Box::new(next)), Instant::now()).unwrap();
    d.take_commands();
    audio(&mut d, tone(1.0));
    let commands = d.take_commands();
    assert!(commands.iter().all(|c| matches!(c, Inbound::Chunk(c) if c.force_listen)), "{commands:?}");
    // Without interrupt_response the user's speech does not cut an answer.
    respond(&mut d, ResponseRequest::default()).unwrap();
    the_turn(&mut d);
    audio(&mut d, vec![0.0; 16000]);
    audio(&mut d, tone(0.6));
    assert!(d.responses.current.is_some(), "still answering");
    // Semantic VAD's eagerness is the silence that ends a turn.
    let mut vad = conf(true).vad.unwrap();
    vad.kind = "semantic_vad".into();
    assert_eq!(vad.silence_ms(), 500);
    vad.eagerness = Some("low".into());
    assert_eq!(vad.silence_ms(), 1000);
    vad.eagerness = Some("high".into());
    assert_eq!(vad.silence_ms(), 250);
}

#[test]
fn a_long_silence_becomes_a_turn_the_model_answers() {
    let mut d = active(true);
    let mut next = d.conf().clone();
    next.vad.as_mut().unwrap().idle_timeout_ms = Some(5000);
    d.command(Command::Update(Box::new(next)), Instant::now()).unwrap();
    d.take_commands();
    d.take_events();
    let t0 = Instant::now();
    d.tick(t0);
    d.tick(t0 + Duration::from_millis(4999));
    assert!(!kinds(&d.take_events()).contains(&"idle_timeout"));
    d.tick(t0 + Duration::from_millis(5001));
    let events = d.take_events();
    assert_eq!(kinds(&events)[..4], ["idle_timeout", "committed", "item_added", "response_created"]);
    assert!(the_turn(&mut d).messages.is_empty(), "the model speaks after the silence");
}

#[test]
fn a_response_asked_before_the_session_is_created_waits_for_it() {
    let mut d = Driver::new(conf(true), Limits::default(), &crate::vad::energy());
    respond(&mut d, ResponseRequest::default()).unwrap();
    d.queue_done();
    d.take_commands();
    d.created("sess_1", &backend());
    assert_eq!(kinds(&d.take_events()), ["session_created", "response_created"]);
    assert!(the_turn(&mut d).messages.is_empty());
}

#[test]
fn a_refused_reconfigure_restores_the_configuration_in_force() {
    let mut d = active(true);
    let mut next = d.conf().clone();
    next.instructions = "Be brief.".into();
    d.command(Command::Update(Box::new(next)), Instant::now()).unwrap();
    assert!(matches!(&d.take_commands()[..], [Inbound::Reconfigure(s)] if s.system_prompt == "Be brief."));
    d.reconfigured(&backend());
    assert_eq!(kinds(&d.take_events()), ["session_updated"]);
    let mut next = d.conf().clone();
    next.instructions = "Be verbose.".into();
    next.vad = None;
    d.command(Command::Update(Box::new(next)), Instant::now()).unwrap();
    d.take_commands();
    d.reconfigure_failed(&ProtocolError::InvalidPayload("no".into()));
    assert_eq!(kinds(&d.take_events()), ["error"]);
    assert_eq!(d.conf().instructions, "Be brief.", "the configuration the backend took");
    assert_eq!(d.conf().setup().kind, SessionKind::Duplex);
    d.reconfigured(&backend());
    assert!(d.take_events().is_empty(), "the restore owes the client nothing");
}

#[test]
fn what_is_held_for_a_client_is_bounded() {
    let limits = Limits { max_buffered_bytes: 64_000, ..Limits::default() };
    let mut d = Driver::new(conf(false), limits, &crate::vad::energy());
    // Manual turns, still waiting: the audio buffer grows until the bound.
    let mut refused = None;
    for i in 0..10 {
        if let Err(e) = d.command(Command::Audio { samples: vec![0.1; 4000], rate: 16000 }, Instant::now()) {
            refused = Some((i, e));
            break;
        }
    }
    let (at, e) = refused.expect("refused before 160,000 bytes");
    assert_eq!((at, e.code()), (4, "buffer_full"), "16,000 bytes an append: the fifth would pass 64,000");
    d.command(Command::Clear, Instant::now()).unwrap();
    assert!(d.admit("x", "test", 60_000).is_ok(), "cleared: room again (less the held reply)");
}

#[test]
fn the_pause_after_speech_is_padded_once_the_client_is_idle() {
    let mut d = active(true);
    audio(&mut d, tone(1.0));
    let sent = Instant::now();
    d.take_commands();
    d.tick(sent);
    assert!(d.take_commands().is_empty(), "the client is still sending");
    // The client stops sending with the user's turn open: the model hears the pause.
    d.tick(sent + super::intake::IDLE + Duration::from_millis(1));
    let commands = d.take_commands();
    assert!(matches!(&commands[..], [Inbound::Chunk(c)] if c.audio.iter().all(|s| *s == 0.0)), "{commands:?}");
}
