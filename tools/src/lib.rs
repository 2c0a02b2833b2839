//! Client tools in the same binary: `probe` (one session, readable), `loadgen` (many
//! sessions, measured), `flood` (hostile load) and `check-recordings` (are the recordings
//! intact).

mod attack;
pub mod check_recordings;
pub mod client;
pub mod flood;
pub mod loadgen;
pub mod probe;
