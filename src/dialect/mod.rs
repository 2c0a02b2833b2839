//! Wire dialects at the edge: JSON in and out, on the actors' domain types.
//!
//! - `minicpm`: the MiniCPM-o Realtime API (`session.init`, `input.append`, ...).
//! - `wire`: helpers every JSON dialect shares.

pub mod minicpm;
pub mod wire;
