//! Client tools in the same binary: `probe` (one session, readable), `loadgen` (many
//! sessions, measured), `callload` (voice sessions over WebRTC calls or WebSockets, side by
//! side), `flood` (hostile load) and `check-recordings` (are the recordings intact).

pub mod callload;
pub mod check_recordings;
mod client;
pub mod flood;
pub mod loadgen;
pub mod probe;

/// Why a tool's run failed: which tool, and what it says (printed as the command's error).
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    /// `probe`: the server could not be reached, or a check of the session did not hold.
    #[error("{0}")]
    Probe(String),
    /// `loadgen`: the run could not start or be measured.
    #[error("{0}")]
    Load(String),
    /// `callload`: the calls could not be placed or measured.
    #[error("{0}")]
    Calls(String),
    /// `flood`: the attack could not be run, or the server did not hold.
    #[error("{0}")]
    Flood(String),
    /// `check-recordings`: a recording is missing, torn or of the wrong length.
    #[error("{0}")]
    Recordings(String),
}
