//! Domain types shared by the actors, the backends and the wire dialects.
//!
//! Nothing here knows JSON or C: a dialect turns wire events into these types and back,
//! a backend turns them into calls of its ABI.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The public mode of a connection (`/v1/realtime?mode=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// A conversation answered turn by turn (`SessionKind::Turn`).
    Chat,
    /// Full-duplex audio with camera frames (`SessionKind::Duplex`).
    Video,
    /// Full-duplex audio; camera frames the client sends are ignored (`SessionKind::Duplex`).
    Audio,
}

impl Mode {
    /// Every mode, in the order of [`Mode::index`].
    pub const ALL: [Mode; 3] = [Mode::Chat, Mode::Video, Mode::Audio];

    /// The mode as it is written in the query string and in logs: `chat`, `video` or `audio`.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Chat => "chat",
            Mode::Video => "video",
            Mode::Audio => "audio",
        }
    }

    /// The backend runtime mode this public mode maps to.
    pub fn session_kind(self) -> SessionKind {
        match self {
            Mode::Chat => SessionKind::Turn,
            Mode::Video | Mode::Audio => SessionKind::Duplex,
        }
    }

    /// The mode's position in [`Mode::ALL`] (0 to 2), for arrays kept per mode.
    pub fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "chat" => Ok(Mode::Chat),
            "video" => Ok(Mode::Video),
            "audio" => Ok(Mode::Audio),
            other => Err(format!("unknown mode '{other}' (expected chat, video or audio)")),
        }
    }
}

/// How a backend runs a session: one step per input chunk, or one answer per conversation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum SessionKind {
    /// One step per input chunk; each step listens or speaks.
    Duplex,
    /// A conversation prefilled, then one answer generated in pieces.
    Turn,
}

impl SessionKind {
    /// The name clients see in `session.created.mode`.
    pub fn runtime_name(self) -> &'static str {
        match self {
            SessionKind::Duplex => "full_duplex",
            SessionKind::Turn => "turn_based",
        }
    }
}

/// Generation settings; `None` means the backend's (or the session's) default.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Generation {
    /// The most tokens one answer may generate.
    pub max_new_tokens: Option<u32>,
    /// The length penalty the backend applies to the answer.
    pub length_penalty: Option<f32>,
    /// The sampling temperature.
    pub temperature: Option<f32>,
    /// How many slices the backend may cut an image into (1 to 9).
    pub max_slice_nums: Option<u32>,
    /// The first this many duplex steps listen whatever they hear.
    pub force_listen_count: Option<u32>,
    /// Every further setting the client gave, by name, its value as text (`top_p`,
    /// `top_k`, `seed`...), already checked by the dialect. A backend applies those it lists
    /// in [`BackendInfo::settings`].
    pub settings: Vec<(String, String)>,
}

/// Everything a backend needs to start a session.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionSetup {
    /// Whether the backend runs the session step by step or turn by turn.
    pub kind: SessionKind,
    /// The system prompt the session starts with; may be empty.
    pub system_prompt: String,
    /// The name of a voice the backend knows; empty for its default.
    pub voice: String,
    /// LLM reference audio, 16 kHz mono.
    pub ref_audio: Vec<f32>,
    /// TTS reference audio, 16 kHz mono.
    pub tts_ref_audio: Vec<f32>,
    /// Generation settings for the whole session.
    pub generation: Generation,
    /// The tools the model may call (a backend without [`BackendInfo::tools`] is given none).
    pub tools: Tools,
}

impl SessionSetup {
    /// A setup of `kind` with an empty prompt, no voice, no reference audio and default generation.
    pub fn new(kind: SessionKind) -> Self {
        SessionSetup {
            kind,
            system_prompt: String::new(),
            voice: String::new(),
            ref_audio: Vec::new(),
            tts_ref_audio: Vec::new(),
            generation: Generation::default(),
            tools: Tools::default(),
        }
    }
}

/// One duplex input chunk: about a second of 16 kHz mono audio, optional JPEG frames.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DuplexChunk {
    /// The chunk's audio, 16 kHz mono samples.
    pub audio: Vec<f32>,
    /// `audio` as the client wrote it (base64 of little-endian float32 at 16 kHz), a slice of
    /// its frame: a backend that takes that format forwards it instead of encoding `audio`
    /// again. Not carried across a process or a node.
    #[serde(skip)]
    pub audio_base64: Option<bytes::Bytes>,
    /// JPEG camera frames that go with the audio, encoded.
    pub frames: Vec<Vec<u8>>,
    /// This step must listen: it ends the model's current speech.
    pub force_listen: bool,
    /// How many slices to cut this chunk's frames into (1 to 9); `None` for the session's setting.
    pub max_slice_nums: Option<u32>,
}

/// Who speaks a [`ChatMessage`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Role {
    /// Instructions for the model.
    System,
    /// The user: the client's side of the conversation.
    User,
    /// The model.
    Assistant,
    /// What a tool gave back for one of the model's calls ([`ChatMessage::call`] names the call).
    Tool,
}

impl FromStr for Role {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "system" => Ok(Role::System),
            "user" => Ok(Role::User),
            "assistant" => Ok(Role::Assistant),
            other => Err(format!("unknown role '{other}' (expected system, user or assistant)")),
        }
    }
}

/// One message of a turn-mode conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// Who said it.
    pub role: Role,
    /// Its text; may be empty.
    pub text: String,
    /// Encoded images (JPEG or PNG).
    pub images: Vec<Vec<u8>>,
    /// Audio clips, 16 kHz mono.
    pub audios: Vec<Vec<f32>>,
    /// The call this message is: with [`Role::Assistant`], the model called a tool (`text`
    /// holds the arguments, JSON); with [`Role::Tool`], what the tool gave back (`text`).
    pub call: Option<CallRef>,
}

impl ChatMessage {
    /// A message of `role` with text only.
    pub fn text(role: Role, text: impl Into<String>) -> Self {
        ChatMessage { role, text: text.into(), images: Vec::new(), audios: Vec::new(), call: None }
    }

    /// The model's call of the tool `name` with `arguments` (JSON text).
    pub fn tool_call(call_id: impl Into<String>, name: impl Into<String>, arguments: impl Into<String>) -> Self {
        ChatMessage {
            call: Some(CallRef { id: call_id.into(), name: name.into() }),
            ..ChatMessage::text(Role::Assistant, arguments)
        }
    }

    /// What the tool gave back (`output`) for the call `call_id` of the tool `name`.
    pub fn tool_result(call_id: impl Into<String>, name: impl Into<String>, output: impl Into<String>) -> Self {
        ChatMessage {
            call: Some(CallRef { id: call_id.into(), name: name.into() }),
            ..ChatMessage::text(Role::Tool, output)
        }
    }
}

/// The call a message is, or answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallRef {
    /// The call's id, which pairs a call and its result.
    pub id: String,
    /// The tool's name; may be empty on a result whose call is not known.
    pub name: String,
}

/// A function the model may call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tool {
    /// Its name, as the model calls it.
    pub name: String,
    /// What it does, for the model.
    pub description: String,
    /// Its parameters: a JSON Schema, as JSON text.
    pub parameters: String,
}

/// Which tools the model may call.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum ToolChoice {
    /// The model decides.
    #[default]
    Auto,
    /// It calls none.
    None,
    /// It calls one of them.
    Required,
    /// It calls this one.
    Function(String),
}

impl ToolChoice {
    /// Its text on the ABI and on the wire: `auto`, `none`, `required`, or the tool's name.
    pub fn as_str(&self) -> &str {
        match self {
            ToolChoice::Auto => "auto",
            ToolChoice::None => "none",
            ToolChoice::Required => "required",
            ToolChoice::Function(name) => name,
        }
    }
}

/// The tools a session or an answer offers the model, and the choice among them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tools {
    /// The functions, in the client's order.
    pub functions: Vec<Tool>,
    /// Which of them the model may call.
    pub choice: ToolChoice,
}

impl Tools {
    /// The functions as the ABI takes them: a JSON array of `{name, description, parameters}`.
    pub fn to_json(&self) -> String {
        let list: Vec<serde_json::Value> = self
            .functions
            .iter()
            .map(|t| {
                let parameters = serde_json::from_str::<serde_json::Value>(&t.parameters)
                    .unwrap_or_else(|_| serde_json::json!({"type": "object", "properties": {}}));
                serde_json::json!({"name": t.name, "description": t.description, "parameters": parameters})
            })
            .collect();
        serde_json::Value::Array(list).to_string()
    }
}

/// A piece of a function call the model makes: the tool's name on the call's first piece (a
/// new call begins), and a piece of its arguments (JSON text, streamed).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallPiece {
    /// The tool's name, on the first piece of a call only.
    pub name: Option<String>,
    /// A piece of the arguments.
    pub arguments: String,
}

/// One turn-mode request: a conversation to answer.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TurnInput {
    /// The conversation, oldest first.
    pub messages: Vec<ChatMessage>,
    /// Generation settings for this answer; `None` fields take the session's.
    pub generation: Generation,
    /// Produce speech with the text.
    pub speech: bool,
    /// Enable the model's thinking.
    pub thinking: bool,
    /// Use the backend's TTS template.
    pub tts_template: bool,
    /// The messages mix modalities (the backend's omni input mode).
    pub omni: bool,
    /// TTS reference audio for this answer, 16 kHz mono; empty for the session's.
    pub tts_ref_audio: Vec<f32>,
    /// The messages continue the conversation the backend holds; otherwise they are the
    /// whole conversation and replace it.
    pub continues: bool,
    /// Tools for this answer only; `None`: the session's.
    pub tools: Option<Tools>,
    /// Take the messages into the context and answer nothing (a conversation replayed).
    pub prefill_only: bool,
}

/// Whether a duplex output listens or speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum StepKind {
    /// The model listens: nothing to say at this step.
    #[default]
    Listen,
    /// The model speaks: text and/or audio.
    Speak,
}

/// One output of a duplex step (a step may yield several: generate, then drain).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StepPiece {
    /// Whether the model listened or spoke.
    pub kind: StepKind,
    /// Text produced by this piece; empty when it listens.
    pub text: String,
    /// 24 kHz mono.
    pub audio: Vec<f32>,
    /// Set on the last speaking piece of the model's turn.
    pub end_of_turn: bool,
    /// Length of the backend's KV cache after this piece, in tokens.
    pub kv_length: u64,
    /// Tokens the step added from its input.
    pub input_tokens: u32,
    /// Tokens this piece added.
    pub output_tokens: u32,
    /// Time spent prefilling the step's input, in microseconds.
    pub prefill_us: u32,
    /// Time spent producing this piece, in microseconds.
    pub generate_us: u32,
    /// A finished transcript of what the user said, reported at this step.
    pub transcript: Option<String>,
    /// Of `input_tokens`, those from audio; `output_tokens` counts text, this speech.
    pub input_audio_tokens: u32,
    /// Of `output_tokens`, the speech tokens.
    pub output_audio_tokens: u32,
    /// A piece of a function call (then `text` and `audio` are empty).
    pub call: Option<CallPiece>,
}

/// The whole output of one duplex step: all its pieces merged in order.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StepOutcome {
    /// Listen if every piece listened, else speak.
    pub kind: StepKind,
    /// The text of all pieces, concatenated.
    pub text: String,
    /// The audio of all pieces, 24 kHz mono, concatenated.
    pub audio: Vec<f32>,
    /// Set when any piece ended the model's turn.
    pub end_of_turn: bool,
    /// Length of the backend's KV cache after the last piece, in tokens.
    pub kv_length: u64,
    /// Tokens the step added from its input, summed over the pieces.
    pub input_tokens: u32,
    /// Tokens the step's pieces added, summed.
    pub output_tokens: u32,
    /// Time spent prefilling the step's input, in microseconds (as the first piece reported it).
    pub prefill_us: u32,
    /// Time spent producing the pieces, in microseconds, summed.
    pub generate_us: u32,
    /// Finished transcripts of what the user said, reported during the step, joined by spaces;
    /// `None` when there was none.
    pub transcript: Option<String>,
    /// Of `input_tokens`, those from audio, summed over the pieces.
    pub input_audio_tokens: u32,
    /// Of `output_tokens`, the speech tokens, summed over the pieces.
    pub output_audio_tokens: u32,
    /// The pieces of function calls the step made, in order.
    pub calls: Vec<CallPiece>,
}

impl StepOutcome {
    /// A listen that says nothing (a step cut short by an interrupt).
    pub fn listen(kv_length: u64) -> Self {
        StepOutcome { kind: StepKind::Listen, kv_length, ..StepOutcome::default() }
    }

    /// An outcome made of the step's first piece; further pieces are added with
    /// [`StepOutcome::absorb`].
    pub fn from_first(piece: StepPiece) -> Self {
        StepOutcome {
            kind: piece.kind,
            text: piece.text,
            audio: piece.audio,
            end_of_turn: piece.end_of_turn,
            kv_length: piece.kv_length,
            input_tokens: piece.input_tokens,
            output_tokens: piece.output_tokens,
            prefill_us: piece.prefill_us,
            generate_us: piece.generate_us,
            transcript: piece.transcript,
            input_audio_tokens: piece.input_audio_tokens,
            output_audio_tokens: piece.output_audio_tokens,
            calls: piece.call.into_iter().collect(),
        }
    }

    /// Appends a drained piece of the same step.
    pub fn absorb(&mut self, piece: StepPiece) {
        if piece.kind == StepKind::Speak {
            self.kind = StepKind::Speak;
        }
        self.text.push_str(&piece.text);
        self.audio.extend_from_slice(&piece.audio);
        self.end_of_turn |= piece.end_of_turn;
        self.kv_length = piece.kv_length;
        self.input_tokens += piece.input_tokens;
        self.output_tokens += piece.output_tokens;
        self.generate_us += piece.generate_us;
        self.input_audio_tokens += piece.input_audio_tokens;
        self.output_audio_tokens += piece.output_audio_tokens;
        self.calls.extend(piece.call);
        match (&mut self.transcript, piece.transcript) {
            (Some(t), Some(more)) => {
                t.push(' ');
                t.push_str(&more);
            }
            (t @ None, more) => *t = more,
            (Some(_), None) => {}
        }
    }
}

/// One piece of a turn-mode answer.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TurnPiece {
    /// Text of this piece.
    pub text: String,
    /// 24 kHz mono; empty without speech output.
    pub audio: Vec<f32>,
    /// Set on the last piece of the answer.
    pub done: bool,
    /// Length of the backend's KV cache after this piece, in tokens.
    pub kv_length: u64,
    /// On the first piece: the tokens of the prefilled conversation; 0 on the others.
    pub input_tokens: u32,
    /// Tokens in this piece (text; speech is in `output_audio_tokens`).
    pub output_tokens: u32,
    /// Time spent producing this piece, in microseconds.
    pub generate_us: u32,
    /// On the first piece: the transcript of the audio in the newest user message.
    pub transcript: Option<String>,
    /// On the first piece: of `input_tokens`, those from audio.
    pub input_audio_tokens: u32,
    /// Speech tokens of this piece.
    pub output_audio_tokens: u32,
    /// A piece of a function call (then `text` and `audio` are empty).
    pub call: Option<CallPiece>,
}

/// What a backend can do, from its info call.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BackendInfo {
    /// The backend's name, as it reports it.
    pub name: String,
    /// It accepts JPEG frames and images.
    pub vision: bool,
    /// It produces audio.
    pub speech_output: bool,
    /// It runs duplex sessions ([`SessionKind::Duplex`]).
    pub duplex: bool,
    /// It runs turn-mode sessions ([`SessionKind::Turn`]).
    pub turn: bool,
    /// The sample rate of audio into it, in Hz (16000).
    pub input_sample_rate: u32,
    /// The sample rate of audio out of it, in Hz (24000).
    pub output_sample_rate: u32,
    /// Its context size, in tokens.
    pub context_size: u32,
    /// The most audio samples one generate or drain call yields.
    pub max_output_samples: u32,
    /// The most bytes of text one generate or drain call yields.
    pub max_output_text_bytes: u32,
    /// The revision of ABI version 1 it implements (0 for 1.0, 1 for 1.1, 2 for 1.2, 3 for 1.3).
    pub abi_revision: u32,
    /// It reports transcripts of the user's speech.
    pub transcripts: bool,
    /// It reports how many of its tokens are audio.
    pub token_details: bool,
    /// The further generation settings it applies (by name).
    pub settings: Vec<String>,
    /// The duplex chunk it answers best on, in 16 kHz samples (0: one second).
    pub step_samples: u32,
    /// It calls the tools it is given (ABI 1.3, `OMNI_CAP_TOOLS`).
    pub tools: bool,
    /// What of a session's setup it does not apply (a voice by name, for a backend that speaks
    /// only in a reference recording's; a length penalty; image slices): a client that asks for
    /// one hears it is not applied.
    #[serde(default)]
    pub ignored: Vec<SetupField>,
}

/// A part of a session's setup ([`SessionSetup`], its [`Generation`]) that a backend may not
/// apply, so that a dialect tells its client so in its own words.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SetupField {
    /// [`SessionSetup::voice`]: a voice by name.
    Voice,
    /// [`Generation::length_penalty`].
    LengthPenalty,
    /// [`Generation::max_slice_nums`].
    MaxSliceNums,
    /// [`Generation::temperature`].
    Temperature,
    /// [`Generation::max_new_tokens`].
    MaxNewTokens,
}

impl BackendInfo {
    /// Samples per duplex step for clients that do not chunk their audio themselves: the
    /// backend's preferred chunk, 100 ms to one second, else one second.
    pub fn duplex_chunk_samples(&self) -> usize {
        match self.step_samples {
            0 => 16000,
            n => n.clamp(1600, 16000) as usize,
        }
    }

    /// Whether it keeps a conversation the ABI 1.3 way: the model's calls and their results as
    /// messages, turns that only prefill, and turns between the steps of a duplex session.
    pub fn holds_conversations(&self) -> bool {
        self.abi_revision >= 3 && self.turn
    }

    /// Whether this backend can run sessions of `kind`.
    pub fn supports(&self, kind: SessionKind) -> bool {
        match kind {
            SessionKind::Duplex => self.duplex,
            SessionKind::Turn => self.turn,
        }
    }
}

/// How a turn-mode answer went, once its last piece is out.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TurnSummary {
    /// Tokens of the prefilled conversation.
    pub input_tokens: u32,
    /// Text tokens of the answer, summed over its pieces.
    pub output_tokens: u32,
    /// Of `input_tokens`, those from audio.
    pub input_audio_tokens: u32,
    /// Speech tokens of the answer, summed over its pieces.
    pub output_audio_tokens: u32,
    /// Length of the backend's KV cache after the last piece, in tokens.
    pub kv_length: u64,
    /// Time from the start of the prefill to the last piece.
    pub duration: std::time::Duration,
}

/// What a decider is asked: one session's instructions, tools and conversation, nothing of any
/// other session's.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DecideRequest {
    /// The session's instructions.
    pub instructions: String,
    /// The session's tools, and which of them may be called.
    pub tools: Tools,
    /// The conversation so far as text, oldest first; the newest user turn is the last.
    pub messages: Vec<ChatMessage>,
    /// The decider answers the messages itself, in words (an out-of-band response the voice
    /// cannot give), with `instructions` as its own: it is not deciding for a voice.
    pub answer: bool,
}

impl DecideRequest {
    /// Roughly how many bytes it holds (for the session's budget).
    pub fn weight(&self) -> usize {
        self.instructions.len()
            + self
                .tools
                .functions
                .iter()
                .map(|t| t.name.len() + t.description.len() + t.parameters.len())
                .sum::<usize>()
            + self.messages.iter().map(|m| m.text.len() + 16).sum::<usize>()
    }
}

/// What the decider decided for a user turn.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Call the tool `name` with `arguments` (JSON text, as the decider wrote it: the session
    /// checks it against the tool's schema).
    Call {
        /// The tool.
        name: String,
        /// Its arguments, JSON text.
        arguments: String,
    },
    /// No call: the voice answers by itself (what the decider wrote instead, if anything).
    NoCall(String),
}

/// Why a decider gave no decision; each is told to the client once, by its code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeciderError {
    /// It could not be reached, or refused the request (`decider_unavailable`).
    #[error("{0}")]
    Unavailable(String),
    /// It did not answer in time (`decider_timeout`).
    #[error("{0}")]
    Timeout(String),
    /// It answered with what is not a decision: malformed, too long (`decider_invalid_output`).
    #[error("{0}")]
    InvalidOutput(String),
}

impl DeciderError {
    /// The code of the `error` event the client gets.
    pub fn code(&self) -> &'static str {
        match self {
            DeciderError::Unavailable(_) => "decider_unavailable",
            DeciderError::Timeout(_) => "decider_timeout",
            DeciderError::InvalidOutput(_) => "decider_invalid_output",
        }
    }
}
