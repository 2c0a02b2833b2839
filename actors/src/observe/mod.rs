//! What observes sessions and workers: typed [`events`] and their subscribers, the
//! [`metrics`], [`usage`] accounting, and [`recording`] (a session's side of its recording,
//! and the [`recorder`]'s actor that writes it). The observers' actors' messages are in
//! [`messages`].

pub mod events;
pub mod messages;
pub mod metrics;
pub mod recorder;
pub mod recording;
pub mod usage;
