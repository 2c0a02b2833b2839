//! omni-actors: the actor system of omni-gateway, on domain types.
//!
//! # Layout
//!
//! One session, across the actors:
//!
//! 1. A client connects; its transport's edge starts a [`session::SessionActor`] and
//!    hands it whole messages ([`edge::client::FromClient`]). The session decodes them
//!    with its [`edge::dialect::Dialect`] and answers through the edge
//!    ([`edge::client::ToClient`]).
//! 2. It joins its queue through a [`messages::queue::QueuePort`]: a [`queue::QueueActor`]
//!    in one process, or a [`queue::ClusterQueueActor`] on a replica of a cluster.
//!    Positions and ETAs come back as [`messages::queue::QueueNotice`]s, paced by
//!    `queue::pacer`.
//! 3. The [`pool::WorkerPoolActor`] owns every worker's [`worker::BackendActor`]: configured,
//!    a node's, or lent by the cluster for one session. It tells the queue which are idle
//!    through a [`messages::queue::QueueFeed`]; the queue hands one to the session
//!    ([`messages::worker::WorkerLink`]).
//! 4. The session attaches to the worker and sends it chunks and turns
//!    ([`messages::worker`]). The BackendActor's mailbox rules (`worker::policy`) drop the
//!    oldest chunk when the client runs ahead, let force-listen overtake the backlog, and fail a
//!    step past its deadline; its thread (`worker::thread`) calls the [`edge::backend::Backend`].
//!    Results go straight to the session ([`messages::worker::BackendEvent`]).
//! 5. The session's dialect decides the user's turns (for the OpenAI shapes, with an
//!    [`edge::vad::VoiceDetector`] and [`edge::vad::SpeechEdges`]); when the backend does not
//!    transcribe, each turn's audio goes to the [`transcribe::TranscriptionActor`], whose answer
//!    comes back to the session ([`messages::transcribe::Transcribed`]).
//! 6. Everything that happens is published to the subscribers ([`observe::events`]): the
//!    recorder, usage, webhooks. When the session ends it detaches; the worker resets and is
//!    offered again.
//!
//! Each part is a folder: its actors (in `mod.rs`, or a file named for each) and their rules in
//! plain structs tested without a runtime (`state.rs`, `policy.rs`, the session's `core/`). The
//! messages between the parts are in [`messages`], one file per part that receives them,
//! addressed through ports of recipients, so that no actor imports another; what an edge
//! exchanges with its session is in [`edge::client`].
//! `docs/architecture.md` has the whole picture.

#![deny(missing_docs)]

pub mod audio;
pub mod delegate;
pub mod domain;
pub mod edge;
pub mod ids;
pub mod messages;
pub mod net;
pub mod observe;
pub mod pool;
pub mod protocol;
pub mod queue;
pub mod session;
pub mod settings;
pub mod status;
pub mod transcribe;
pub mod worker;

pub use edge::backend::{Backend, BackendControl, BackendError, run_duplex_step};
pub use worker::{BackendFactory, WorkerThread};
