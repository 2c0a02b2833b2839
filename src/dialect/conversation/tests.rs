//! The driver on typed commands and events, without a codec or a runtime.

use std::time::{Duration, Instant};

use omni_actors::domain::{BackendInfo, ChatMessage, Role, SessionKind, StepKind, StepOutcome};
use omni_actors::protocol::{Inbound, ProtocolError};
use serde_json::json;

use super::items::{ItemBody, ItemStatus, Part, TextKind};
use super::*;
use crate::dialect::settings::Settings;

fn conf(vad: bool) -> Conf {
    Conf {
        instructions: String::new(),
        voice: "alloy".into(),
        audio_out: true,
        vad: vad.then(|| Vad {
            kind: "server_vad".into(),
            threshold: 0.5,
            prefix_padding_ms: 300,
            silence_duration_ms: 500,
        }),
        temperature: None,
        max_tokens: None,
        input_rate: 16000,
        transcription: Some(json!({"model": "any"})),
        settings: Settings::default(),
    }
}

fn backend() -> BackendInfo {
    BackendInfo { name: "test".into(), transcripts: true, token_details: true, ..BackendInfo::default() }
}

/// A driver whose session is created.
fn active(vad: bool) -> Driver {
    let mut d = Driver::new(conf(vad), Limits::default(), &crate::vad::energy());
    d.queue_done();
    assert!(matches!(d.take_commands()[..], [Inbound::Init(_)]));
    d.created("sess_1", &backend());
    d.take_events();
    d
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
        Event::ItemAdded { .. } => "item_added",
        Event::ItemDone { .. } => "item_done",
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

fn kinds(events: &[Event]) -> Vec<&'static str> {
    events.iter().map(kind).collect()
}

fn tone(seconds: f32) -> Vec<f32> {
    (0..(16000.0 * seconds) as usize).map(|i| 0.3 * (i as f32 * 0.1).sin()).collect()
}

fn speak(text: &str, end_of_turn: bool) -> StepOutcome {
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

fn audio(d: &mut Driver, samples: Vec<f32>) {
    d.command(Command::Audio { samples, rate: 16000 }, Instant::now()).unwrap();
}

#[test]
fn before_the_session_is_created_events_and_input_are_held_then_released_in_order() {
    let mut d = Driver::new(conf(true), Limits::default(), &crate::vad::energy());
    d.queued(omni_actors::protocol::QueueInfo { ticket: 1, position: 1, estimated_wait_s: 0.0, queue_length: 1 }, true);
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
    assert_eq!(item.body, ItemBody::Message { role: Role::User, parts: vec![Part::InputAudio { transcript: None }] });
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
    assert_eq!(
        items[0].body,
        ItemBody::Message { role: Role::User, parts: vec![Part::InputAudio { transcript: Some("Hi".into()) }] }
    );
    assert_eq!(items[1].status, ItemStatus::Completed);
    assert_eq!(
        items[1].body,
        ItemBody::Message {
            role: Role::Assistant,
            parts: vec![Part::Answer { audio: true, text: "Hello there".into() }]
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
    assert_eq!(names[done + 1..], ["voice_cleared", "speech_started"]);
    assert!(d.take_commands().iter().any(|c| matches!(c, Inbound::Interrupt)), "force-listen");
    assert_eq!(d.conversation.items().last().map(|i| i.status), Some(ItemStatus::Incomplete));
}

#[test]
fn a_manual_turn_answers_the_items_since_the_last_answer() {
    let mut d = active(false);
    let message = ChatMessage::text(Role::User, "hi");
    let parts = vec![Part::Text { kind: TextKind::InputText, text: "hi".into() }];
    d.command(Command::CreateItem(NewItem { id: Some("mine".into()), message, parts }), Instant::now()).unwrap();
    let request = ResponseRequest { audio: Some(false), instructions: Some("be brief".into()) };
    d.command(Command::CreateResponse(request), Instant::now()).unwrap();
    let commands = d.take_commands();
    let [Inbound::Turn { input, streaming: true }] = &commands[..] else { panic!("{commands:?}") };
    assert_eq!(
        input.messages.iter().map(|m| (m.role, m.text.as_str())).collect::<Vec<_>>(),
        [(Role::System, "be brief"), (Role::User, "hi")]
    );
    assert!(!input.speech && input.continues);
    let e = d.command(Command::CreateResponse(ResponseRequest::default()), Instant::now()).unwrap_err();
    assert_eq!(e.code(), "not_ready", "one response at a time");
    d.turn_delta("ok", &[]);
    d.turn_done([3, 1, 0, 0], false);
    let events = d.take_events();
    assert_eq!(kinds(&events)[..2], ["item_added", "response_created"]);
    let Event::ItemAdded { item, .. } = &events[0] else { panic!() };
    assert_eq!(item.id, "mine", "the client's own id");
    let Some(Event::ResponseDone(done)) = events.last() else { panic!() };
    assert_eq!((done.status, done.usage.map(|u| u.input)), (ResponseStatus::Completed, Some(3)));
    let e = d.command(Command::CreateResponse(ResponseRequest::default()), Instant::now()).unwrap_err();
    assert!(matches!(e, ProtocolError::InvalidPayload(_)), "nothing new to answer: {e}");
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
