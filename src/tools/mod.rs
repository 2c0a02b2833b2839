//! Client tools in the same binary: `probe` (one session, readable) and `loadgen`
//! (many sessions, measured).

pub mod client;
pub mod loadgen;
pub mod probe;
