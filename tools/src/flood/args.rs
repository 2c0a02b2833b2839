//! What `omni-gateway flood` is asked: which flood, against which server, how hard.

use clap::{Args, ValueEnum};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum FloodKind {
    ConnectDrop,
    Chunks,
    Tiny,
    Oversize,
    WavRate,
    Items,
    AudioBuffer,
    Images,
    Prelude,
    Turns,
    Fragments,
}

#[derive(Args, Debug, Clone)]
pub struct FloodArgs {
    #[arg(long, default_value = "ws://127.0.0.1:8006")]
    pub url: String,
    #[arg(long, value_enum)]
    pub kind: FloodKind,
    /// connect-drop: connections to open and drop.
    #[arg(long, default_value_t = 1000)]
    pub count: usize,
    /// chunks, tiny: frames per second.
    #[arg(long, default_value_t = 100.0)]
    pub rate: f64,
    /// chunks, tiny: how long, seconds.
    #[arg(long, default_value_t = 10.0)]
    pub seconds: f64,
    /// oversize: the server's max_frame_bytes.
    #[arg(long, default_value_t = 4_194_304)]
    pub bytes: usize,
    #[arg(long, default_value = "audio")]
    pub mode: String,
    #[arg(long, env = "OMNI_API_KEY")]
    pub api_key: Option<String>,
}
