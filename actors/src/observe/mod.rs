//! What observes sessions and workers: typed [`events`] and their subscribers, the
//! [`metrics`](mod@metrics), usage accounting, and [`recording`] (a session's side of its recording, and the
//! recorder's actor that writes it). The observers' actors' messages are in [`messages`]. The
//! other parts reach it through what this module re-exports: the events and sinks a session or
//! a pool publishes to, the metrics, and what a recording keeps.

pub mod events;
mod log_gate;
pub mod messages;
pub mod meta;
pub mod metrics;
mod recorder;
pub mod recording;
mod usage;

pub use events::{
    Interest, Output, SessionEvent, SessionInfo, SessionSink, SessionSinks, Subscriber, Subscribers, WorkerChange,
};
pub use log_gate::gated;
pub use meta::{RecordingSummary, SessionMeta, timestamp};
pub use metrics::metrics;
pub use usage::Usage;
