//! Who accepts a SIP call: its route, at once ([`Acceptance::of_route`]), or the app
//! (`accept = "webhook"`), asked by `realtime.call.incoming` while the call rings ([`ask`]), its
//! answer taken from the book of offers (`super::offers`); and the call the app accepted, kept in
//! that book while it is answered ([`Answered`]).

use ezk_sip_core::IncomingRequest;
use ezk_sip_types::StatusCode;
use ezk_sip_ua::{InboundCall, NoMedia};
use omni_actors::edge::client::CallSettings;

use super::Sip;
use super::config::SipRouteEntry;
use super::offers::{self, Decision};
use crate::caller::Refusal;

/// What a call's session is: its model, its route's settings, and for a call the app accepted,
/// the app's settings (in the session's dialect), the key that did, where its accept hears how
/// the start went, and its `call_id`.
pub(super) struct Acceptance {
    pub model: String,
    pub settings: CallSettings,
    pub app: Option<String>,
    pub key_id: Option<String>,
    pub done: Option<tokio::sync::oneshot::Sender<Result<(), Refusal>>>,
    pub call_id: Option<String>,
}

impl Acceptance {
    /// A call the gateway accepts itself: the route's settings.
    pub(super) fn of_route(sip: &Sip, route: &SipRouteEntry) -> Acceptance {
        Acceptance {
            model: sip.model_of(route, None),
            settings: route_settings(route),
            app: None,
            key_id: None,
            done: None,
            call_id: None,
        }
    }

    /// Tells the app's accept that the call did not start.
    pub(super) fn tell(self, refused: Result<(), Refusal>) {
        if let Some(done) = self.done {
            let _ = done.send(refused);
        }
    }
}

/// A route's instructions and voice, as its calls' settings.
fn route_settings(route: &SipRouteEntry) -> CallSettings {
    let text = |s: &str| Some(s.to_string()).filter(|s| !s.is_empty());
    CallSettings { instructions: text(&route.instructions), voice: text(&route.voice), ..CallSettings::default() }
}

/// Why a call the app was asked about is not answered.
pub(super) enum Unanswered {
    /// The caller gave up while it rang (the stack answered its CANCEL).
    Cancelled,
    Refused(StatusCode, String),
}

/// Offers a call to the app (`realtime.call.incoming` to the webhooks that take it), rings, and
/// waits for the app's accept or reject, the caller's CANCEL, or `accept_timeout_s`.
pub(super) async fn ask(
    sip: &Sip,
    inbound: &mut InboundCall<NoMedia>,
    inbound_source: std::net::IpAddr,
    label: &str,
    sip_headers: Vec<serde_json::Value>,
    (number, route): (&str, &SipRouteEntry),
) -> Result<Acceptance, Unanswered> {
    let offers = &sip.offers;
    let call_id = format!("rtc_{}", uuid::Uuid::new_v4().simple());
    // `max_connections_per_ip = 0` is no cap.
    let per_trunk = match sip.max_connections_per_ip {
        0 => usize::MAX,
        n => n,
    };
    let (ringing, mut decided) = match offers.ring(&call_id, inbound_source, per_trunk) {
        Ok(ringing) => ringing,
        Err(offers::Busy::Everywhere) => {
            return Err(Unanswered::Refused(
                StatusCode::BUSY_HERE,
                format!("{} calls ring already", offers::MAX_RINGING),
            ));
        }
        Err(offers::Busy::Trunk(n)) => {
            return Err(Unanswered::Refused(
                StatusCode::BUSY_HERE,
                format!("{n} calls of this trunk ring already (server.max_connections_per_ip)"),
            ));
        }
    };
    let data = serde_json::json!({"call_id": call_id, "sip_headers": sip_headers, "sip_media_security": "rtp"});
    if sip.host.offer(&data, std::time::Instant::now() + sip.spec.accept_timeout, &ringing.settled()) == 0 {
        return Err(Unanswered::Refused(
            StatusCode::TEMPORARILY_UNAVAILABLE,
            "no webhook could be told (realtime.call.incoming: none takes it, or their queues are full)".into(),
        ));
    }
    log::info!("{label}: a call to '{number}' offered to the app as {call_id}");
    let rang_out = tokio::time::sleep(sip.spec.accept_timeout);
    tokio::pin!(rang_out);
    // A 180 now and each minute: a proxy gives up on an INVITE with no word for over three.
    let mut ring = tokio::time::interval(RING_AGAIN);
    let decision = loop {
        tokio::select! {
            decision = &mut decided => break decision.ok(),
            _ = inbound.cancelled() => return Err(Unanswered::Cancelled),
            _ = &mut rang_out => {
                // A decision that came as it rang out is still taken.
                ringing.withdraw();
                break decided.try_recv().ok();
            }
            _ = ring.tick() => {
                if let Err(e) = inbound.respond_provisional(StatusCode::RINGING).await {
                    log::debug!("{label}: a 180 was not sent: {e}");
                }
            }
        }
    };
    drop(ringing);
    match decision {
        None => Err(Unanswered::Refused(
            StatusCode::TEMPORARILY_UNAVAILABLE,
            format!("{call_id} was neither accepted nor rejected within sip.accept_timeout_s"),
        )),
        Some(Decision::Reject { code }) => {
            Err(Unanswered::Refused(StatusCode::from(code), format!("the app rejected {call_id}")))
        }
        Some(Decision::Accept(accepted)) => {
            log::info!("{label}: {call_id} accepted");
            Ok(Acceptance {
                model: sip.model_of(route, accepted.model.as_deref()),
                settings: route_settings(route),
                app: accepted.first,
                key_id: accepted.key_id,
                done: Some(accepted.done),
                call_id: Some(call_id),
            })
        }
    }
}

/// The headers of an INVITE as `realtime.call.incoming` tells them (in order, repeats kept),
/// without its credentials, each value clipped to [`MAX_HEADER_VALUE`] bytes, at most
/// [`MAX_HEADERS`] of them.
pub(super) fn sip_headers(invite: &IncomingRequest) -> Vec<serde_json::Value> {
    invite
        .headers
        .iter()
        .filter(|(name, _)| {
            let n = name.as_print_str();
            !n.eq_ignore_ascii_case("authorization") && !n.eq_ignore_ascii_case("proxy-authorization")
        })
        .take(MAX_HEADERS)
        .map(|(name, value)| {
            let mut end = value.len().min(MAX_HEADER_VALUE);
            while !value.is_char_boundary(end) {
                end -= 1;
            }
            let value = &value[..end];
            serde_json::json!({"name": name.as_print_str(), "value": value})
        })
        .collect()
}

/// How often a ringing call says so again (180).
pub(super) const RING_AGAIN: std::time::Duration = std::time::Duration::from_secs(60);

/// What of an INVITE's headers the app is told, at most.
const MAX_HEADERS: usize = 64;
const MAX_HEADER_VALUE: usize = 1024;

/// A call the app accepted, in the book while it is answered.
pub(super) struct Answered<'a> {
    sip: &'a Sip,
    call_id: String,
}

impl<'a> Answered<'a> {
    pub(super) fn new(
        sip: &'a Sip,
        call_id: String,
        key_id: Option<String>,
        hang_up: tokio::sync::mpsc::UnboundedSender<()>,
        door: offers::Door,
    ) -> Answered<'a> {
        sip.offers.answered(&call_id, key_id, hang_up, Some(door));
        Answered { sip, call_id }
    }
}

impl Drop for Answered<'_> {
    fn drop(&mut self) {
        self.sip.offers.ended(&self.call_id);
    }
}
