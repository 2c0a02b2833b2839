//! Wire dialects at the edge: JSON in and out, on the actors' domain types.
//!
//! - `minicpm`: the MiniCPM-o Realtime API (`session.init`, `input.append`, ...).
//! - `legacy`: the earlier MiniCPM-o duplex dialect (`session.update`, `input_audio_buffer.append`).
//! - `select`: which dialect a connection speaks.
//! - `wire`: helpers every JSON dialect shares.

pub mod legacy;
pub mod minicpm;
pub mod select;
pub mod wire;
