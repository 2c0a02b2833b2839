//! What the phone edges (a Twilio stream's, a SIP call's) share: which of their session's
//! notices are worth a log line (a phone line shows the caller none).

use omni_actors::edge::client::Notice;

/// Logs an error the session told of the call (a setting of its route or its parameters the
/// session refused: a phone line has nowhere to show it): its code, never more (an error may
/// quote what the caller's app sent). `not_ready` (the caller spoke before the session was
/// created) is not worth one.
pub fn log_refusal(label: &str, notice: &Notice) {
    if let Notice::Error(e) = notice
        && e.code() != "not_ready"
    {
        log::warn!("session {label}: the session refused something of the call's: {}", e.code());
    }
}
