//! Client tools in the same binary: `probe` (one session, readable), `loadgen` (many
//! sessions, measured), `callload` (voice sessions over WebRTC calls or WebSockets, side by
//! side), `flood` (hostile load) and `check-recordings` (are the recordings intact).

pub mod callload;
pub mod check_recordings;
pub mod client;
pub mod flood;
pub mod loadgen;
pub mod probe;
