//! The process's signals. They are registered before a server says it listens: until then
//! SIGTERM, SIGINT and SIGHUP keep their default action and end the process at once, so a
//! supervisor's reload or stop sent as soon as the address is printed would kill a node, or
//! stop a gateway without its graceful shutdown.

use tokio::signal::unix::{Signal, SignalKind, signal};

/// SIGTERM and SIGINT: stop.
pub(crate) struct Stop {
    term: Signal,
    int: Signal,
}

impl Stop {
    /// The next SIGTERM or SIGINT, by name.
    pub(crate) async fn next(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
        }
    }
}

/// What a server listens for.
pub(crate) struct Signals {
    pub stop: Stop,
    /// SIGHUP: a gateway reloads its API keys; a node only says so.
    pub hangup: Signal,
}

/// Registers the handlers (inside the runtime), before the server says it listens.
pub(crate) fn register() -> std::io::Result<Signals> {
    Ok(Signals {
        stop: Stop { term: signal(SignalKind::terminate())?, int: signal(SignalKind::interrupt())? },
        hangup: signal(SignalKind::hangup())?,
    })
}
