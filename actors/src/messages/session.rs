//! What a session is told by the server: to end because the server is stopping ([`Shutdown`]).
//! (What its edge hands it is the seam's, `crate::edge::client`; what its queue and its worker
//! tell it is in `super::queue` and `super::worker`.)

use std::time::Duration;

use actix::prelude::*;

/// Asks a session to end because the server is stopping: at once when it has no step in
/// flight, else when the step has finished, at the latest after `grace`.
#[derive(Message, Clone, Copy)]
#[rtype(result = "()")]
pub struct Shutdown {
    /// The longest the session waits for its step in flight before it ends anyway.
    pub grace: Duration,
}
