//! Wire dialects at the edge: JSON in and out, on the actors' domain types.
//!
//! - `minicpm`: the MiniCPM-o Realtime API (`session.init`, `input.append`, ...).
//! - `legacy`: the earlier MiniCPM-o duplex dialect (`session.update`, `input_audio_buffer.append`).
//! - `openai`: the OpenAI Realtime API shape (GA, beta) and Qwen-Omni-Realtime.
//! - `select`: which dialect a connection speaks.
//! - `wire`: helpers every JSON dialect shares.

pub mod legacy;
pub mod minicpm;
pub mod openai;
pub mod select;
pub mod wire;
