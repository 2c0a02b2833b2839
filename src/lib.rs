//! omni-gateway: the server around the actor system of `omni-actors`.
//!
//! # Layout
//!
//! - [`config`]: `config.toml` into typed sections, each checking itself.
//! - [`roles`]: what the binary runs as: a single [`roles::gateway`], a [`roles::replica`] of a
//!   cluster, or a [`roles::node`] serving its workers to gateways. Each starts the same actors.
//! - [`http`]: the HTTP server of a gateway or replica: the realtime and telephony endpoints, the operator
//!   routes and the pages, API keys and TLS, graceful shutdown.
//! - [`transport`]: the edges between a client's connection and its session (a WebSocket, a
//!   WebRTC call, a phone call Twilio streams, a SIP trunk's call on its own UDP port).
//! - [`dialect`]: the wire formats clients speak (MiniCPM-o, its earlier dialect, OpenAI/Qwen).
//! - [`vad`]: the voice activity detectors the dialects run on a session's input (the OpenAI
//!   shapes' server VAD; a MiniCPM-o session the gateway transcribes): loudness, or Silero VAD.
//! - [`transcription`]: the gateway's own speech recogniser (Whisper), for backends that do not
//!   transcribe the user.
//! - [`backend`]: what a worker runs: the C ABI in a thread or a child process, a node's worker,
//!   a MiniCPM-o worker.
//! - [`link`]: the protocol between a gateway and a node, used by both.
//! - [`store`]: the store replicas and nodes share (Redis).
//! - [`observe`]: the subscribers of session and worker events (recorder, usage, webhooks) and
//!   the recordings on disk.
//! - [`net`]: peers' addresses as limits count them (an IPv6 /64 as one), and networks.
//! - [`signals`]: SIGTERM, SIGINT and SIGHUP, registered before a server says it listens.

pub mod admission;
pub mod auth;
pub mod config;
pub mod http;
pub mod listen;
pub mod observe;
pub mod roles;
pub mod signals;
pub mod store;
