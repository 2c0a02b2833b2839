//! The traits at the actor system's edges, which the server implements:
//!
//! - [`backend::Backend`]: a model behind a worker (the C ABI, a child process, a node's
//!   worker, a MiniCPM-o worker);
//! - [`dialect::Dialect`]: a wire format a client speaks;
//! - [`coordinator::Coordinator`] and [`coordinator::NodeStore`]: a store that replicas and nodes
//!   of a cluster share (Redis; `coordinator::memory` in tests);
//! - [`transcriber::Transcriber`]: a speech recogniser the gateway runs itself;
//! - [`decider::Decider`]: a text model that decides tool calls for a voice that makes none
//!   (delegation);
//! - [`vad::VoiceDetector`]: how likely a window of a client's audio is speech (an energy
//!   detector, Silero VAD); [`vad::SpeechEdges`] turns it into the edges of speech.

pub mod backend;
pub mod client;
pub mod coordinator;
pub mod decider;
pub mod dialect;
pub mod redact;
pub mod transcriber;
pub mod vad;
