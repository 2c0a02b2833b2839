//! The first look at every SIP request that no running transaction took, before ezk's dialog
//! and INVITE layers and before anything of it is kept: the rules a public SIP port needs
//! (what Kamailio's and Asterisk's hardening guides have an edge proxy do), in one clock-free
//! state machine ([`Screen`]) that the layer ([`Gate`]) only delivers to.
//!
//! - A request from a network not in `allowed_networks` is dropped unanswered; an INVITE gets
//!   one stateless 403 (never retransmitted), at most [`STRANGER_ANSWERS_PER_S`] a second
//!   over all strangers.
//! - A request in a dialog (a To tag, an ACK, a CANCEL) goes on only from the entry of
//!   `allowed_networks` its call came from (a trunk's other nodes, not another trunk); for a
//!   call that is not here: 481, stateless (an ACK: dropped, uncounted: the ACK of a stateless
//!   refusal comes this way). An INVITE that opens no dialog under a Call-ID already here (a
//!   late retransmission, a forked copy) is dropped: one call per Call-ID.
//! - An INVITE that opens a call: at most `max_invites_per_s_per_ip` a second per address
//!   (past it: dropped); OPTIONS: answered statelessly; any other method: 405, stateless.
//!
//! A stateless answer goes back to the request's source address and port, like every answer
//! of the SIP stack (RFC 3581's symmetric response; a Via's `maddr` or `sent-by` is never
//! obeyed).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use ezk_sip_core::{Endpoint, IncomingRequest, Layer, MayTake};
use ezk_sip_types::{Method, StatusCode};
use parking_lot::Mutex;

use super::Sip;
use crate::caller::Refusal;
use omni_actors::observe::metrics::metrics;

/// Stateless 403s to strangers' INVITEs, a second, at most (over every source: a flood of
/// INVITEs with forged sources is not turned into a flood of answers).
pub const STRANGER_ANSWERS_PER_S: u32 = 20;
/// Addresses whose INVITE rate is kept, at most; past it, new addresses share one count.
const MAX_RATED: usize = 10_000;

/// One request, as the rules see it.
#[derive(Debug, Clone, Copy)]
pub struct Knock<'a> {
    pub source: IpAddr,
    pub method: &'a Method,
    /// A To tag: the request belongs to a dialog.
    pub tagged: bool,
    pub call_id: &'a str,
}

/// What becomes of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// On to ezk's dialog and INVITE layers, and the gateway's.
    Pass,
    /// Dropped, unanswered, for this reason (a metric's label).
    Drop(&'static str),
    /// Dropped, and not worth a count: an ACK for no call here (the ACK of a stateless
    /// refusal, or of a call that ended).
    Ignore,
    /// Answered once, statelessly, with this code; the reason is a metric's label.
    Answer(u16, &'static str),
}

/// The rules' state: the calls here and where each came from, each address's INVITEs in the
/// current second, and the strangers answered in it.
pub struct Screen {
    /// `allowed_networks`, asked of an address: which entry it is in.
    network_of: Box<dyn Fn(IpAddr) -> Option<usize> + Send + Sync>,
    /// `max_invites_per_s_per_ip` (0: no cap).
    invites_per_s: u32,
    /// The calls being set up or carried: Call-ID to the network entry it came from, and the
    /// number of its [`Entered`].
    calls: HashMap<String, (usize, u64)>,
    entries: u64,
    /// The second counted, each address's INVITEs in it, and those of addresses past
    /// [`MAX_RATED`].
    second: u64,
    invites: HashMap<IpAddr, u32>,
    crowd: u32,
    strangers_answered: u32,
}

impl Screen {
    pub fn new(network_of: impl Fn(IpAddr) -> Option<usize> + Send + Sync + 'static, invites_per_s: u32) -> Screen {
        Screen {
            network_of: Box::new(network_of),
            invites_per_s,
            calls: HashMap::new(),
            entries: 0,
            second: 0,
            invites: HashMap::new(),
            crowd: 0,
            strangers_answered: 0,
        }
    }

    /// What becomes of `knock`, in second `now_s` (of any clock that counts seconds).
    pub fn judge(&mut self, knock: Knock<'_>, now_s: u64) -> Verdict {
        if now_s != self.second {
            self.second = now_s;
            self.invites.clear();
            self.crowd = 0;
            self.strangers_answered = 0;
        }
        let source = knock.source.to_canonical();
        let method = knock.method;
        let Some(network) = (self.network_of)(source) else {
            if *method == Method::INVITE && !knock.tagged && self.strangers_answered < STRANGER_ANSWERS_PER_S {
                self.strangers_answered += 1;
                return Verdict::Answer(403, "stranger");
            }
            return Verdict::Drop("stranger");
        };
        if knock.tagged || *method == Method::ACK || *method == Method::CANCEL {
            return match self.calls.get(knock.call_id) {
                Some((origin, _)) if *origin == network => Verdict::Pass,
                Some(_) => Verdict::Drop("dialog_elsewhere"),
                None if *method == Method::ACK => Verdict::Ignore,
                None => Verdict::Answer(481, "no_dialog"),
            };
        }
        if *method == Method::OPTIONS {
            return Verdict::Pass;
        }
        if *method != Method::INVITE {
            return Verdict::Answer(405, "method");
        }
        if self.calls.contains_key(knock.call_id) {
            return Verdict::Drop("call_exists");
        }
        if self.invites_per_s == 0 {
            return Verdict::Pass;
        }
        let rated = self.invites.len() < MAX_RATED || self.invites.contains_key(&source);
        let count = if rated { self.invites.entry(source).or_default() } else { &mut self.crowd };
        if *count >= self.invites_per_s {
            return Verdict::Drop("rate");
        }
        *count += 1;
        Verdict::Pass
    }

    /// A call from `source` is being set up under `call_id`: its in-dialog requests (CANCEL,
    /// ACK, BYE, re-INVITE) are taken from that network entry until [`Screen::ended`] with the
    /// number given here. `None`: a call of that Call-ID is here already.
    pub fn entered(&mut self, call_id: &str, source: IpAddr) -> Option<u64> {
        let network = (self.network_of)(source.to_canonical())?;
        if self.calls.contains_key(call_id) {
            return None;
        }
        self.entries += 1;
        self.calls.insert(call_id.to_string(), (network, self.entries));
        Some(self.entries)
    }

    /// Call `call_id`'s entry `number` ended (an entry of another call of that id stays).
    pub fn ended(&mut self, call_id: &str, number: u64) {
        if self.calls.get(call_id).is_some_and(|(_, n)| *n == number) {
            self.calls.remove(call_id);
        }
    }
}

/// Keeps a call in the screen's book while it is set up and carried.
pub(super) struct Entered {
    screen: Arc<Mutex<Screen>>,
    call_id: String,
    number: u64,
}

impl Entered {
    /// `None`: a call of that Call-ID is here already (the INVITE is not another call).
    pub(super) fn new(screen: &Arc<Mutex<Screen>>, call_id: &str, source: IpAddr) -> Option<Entered> {
        let number = screen.lock().entered(call_id, source)?;
        Some(Entered { screen: screen.clone(), call_id: call_id.to_string(), number })
    }
}

impl Drop for Entered {
    fn drop(&mut self) {
        self.screen.lock().ended(&self.call_id, self.number);
    }
}

/// The first layer of ezk's endpoint: delivers each request to the [`Screen`].
pub(super) struct Gate(pub(super) Arc<Sip>);

#[async_trait::async_trait]
impl Layer for Gate {
    fn name(&self) -> &'static str {
        "omni-gateway-gate"
    }

    async fn receive(&self, endpoint: &Endpoint, request: MayTake<'_, IncomingRequest>) {
        let now_s = self.0.started.elapsed().as_secs();
        let knock = Knock {
            source: request.tp_info.source.ip(),
            method: &request.line.method,
            tagged: request.base_headers.to.tag.is_some(),
            call_id: request.base_headers.call_id.0.as_str(),
        };
        let verdict = self.0.screen.lock().judge(knock, now_s);
        match verdict {
            Verdict::Pass => {}
            Verdict::Ignore => drop(request.take()),
            Verdict::Drop(reason) => {
                metrics().sip_requests_refused.with_label_values(&[reason]).inc();
                log::debug!("sip: a request from {} dropped ({reason})", request.tp_info.source);
                drop(request.take());
            }
            Verdict::Answer(code, reason) => {
                metrics().sip_requests_refused.with_label_values(&[reason]).inc();
                if reason == "stranger" {
                    // Counted with the other refusals, and said at debug level only (a
                    // scanner's INVITEs would flood the log).
                    let _ = Refusal::new("forbidden_network", 403, "forbidden", "");
                    log::debug!(
                        "sip: an INVITE from {} refused (403): not from sip.allowed_networks",
                        request.tp_info.source
                    );
                } else {
                    log::debug!("sip: a request from {} answered {code} ({reason})", request.tp_info.source);
                }
                stateless(endpoint, request.take(), StatusCode::from(code)).await;
            }
        }
    }
}

/// Answers `request` once, outside any transaction, at its source; never an ACK.
pub(super) async fn stateless(endpoint: &Endpoint, request: IncomingRequest, code: StatusCode) {
    stateless_with(endpoint, &request, code, |_| {}).await
}

/// [`stateless`], with headers of its own (a 401's challenges).
pub(super) async fn stateless_with(
    endpoint: &Endpoint,
    request: &IncomingRequest,
    code: StatusCode,
    headers: impl FnOnce(&mut ezk_sip_types::Headers),
) {
    if request.line.method == Method::ACK {
        return;
    }
    let mut response = endpoint.create_response(request, code, None);
    if request.base_headers.to.tag.is_none() {
        // RFC 3261 8.2.6.2: a final answer outside a dialog carries a To tag of the answerer's.
        let tag = uuid::Uuid::new_v4().simple().to_string();
        let _ = response.msg.headers.edit(ezk_sip_types::Name::TO, |to: &mut ezk_sip_types::header::typed::FromTo| {
            to.tag = Some(tag[..16].into());
        });
    }
    if code == StatusCode::METHOD_NOT_ALLOWED {
        // RFC 3261 21.4.6: a 405 says what is allowed.
        response.msg.headers.insert(ezk_sip_types::Name::ALLOW, "INVITE, ACK, CANCEL, BYE, OPTIONS");
    }
    headers(&mut response.msg.headers);
    response.parts.destination = request.tp_info.source;
    if let Err(e) = endpoint.send_outgoing_response(&mut response).await {
        log::debug!("sip: a stateless {} was not sent: {e}", code.into_u16());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two trunks' networks: 10.0.0.0/24 (entry 0) and 10.0.1.0/24 (entry 1).
    fn screen(per_s: u32) -> Screen {
        Screen::new(
            |ip: IpAddr| match ip.to_string() {
                a if a.starts_with("10.0.0.") => Some(0),
                a if a.starts_with("10.0.1.") => Some(1),
                _ => None,
            },
            per_s,
        )
    }

    fn knock<'a>(source: &str, method: &'a Method, tagged: bool, call_id: &'a str) -> Knock<'a> {
        Knock { source: source.parse().unwrap(), method, tagged, call_id }
    }

    #[test]
    fn strangers_get_one_stateless_403_a_while_and_nothing_else() {
        let mut s = screen(0);
        for i in 0..STRANGER_ANSWERS_PER_S {
            let v = s.judge(knock(&format!("192.0.2.{}", i % 250), &Method::INVITE, false, "c"), 7);
            assert_eq!(v, Verdict::Answer(403, "stranger"));
        }
        assert_eq!(s.judge(knock("192.0.2.1", &Method::INVITE, false, "c"), 7), Verdict::Drop("stranger"));
        // Every other method of a stranger, in a dialog or not: dropped.
        for m in [Method::OPTIONS, Method::BYE, Method::REGISTER, Method::ACK, Method::CANCEL] {
            assert_eq!(s.judge(knock("192.0.2.1", &m, false, "c"), 8), Verdict::Drop("stranger"));
        }
        assert_eq!(s.judge(knock("192.0.2.1", &Method::INVITE, true, "c"), 8), Verdict::Drop("stranger"));
        // The next second answers again.
        assert_eq!(s.judge(knock("192.0.2.1", &Method::INVITE, false, "c"), 9), Verdict::Answer(403, "stranger"));
        // An IPv4 trunk seen as an IPv6-mapped address is itself.
        assert_eq!(s.judge(knock("::ffff:10.0.0.1", &Method::OPTIONS, false, "c"), 9), Verdict::Pass);
        assert_eq!(s.judge(knock("10.0.2.1", &Method::OPTIONS, false, "c"), 9), Verdict::Drop("stranger"));
    }

    #[test]
    fn a_dialog_is_obeyed_only_from_the_network_its_call_came_from() {
        let mut s = screen(0);
        assert_eq!(s.judge(knock("10.0.0.1", &Method::BYE, true, "call-1"), 1), Verdict::Answer(481, "no_dialog"));
        assert_eq!(s.judge(knock("10.0.0.1", &Method::ACK, true, "call-1"), 1), Verdict::Ignore);
        let entry = s.entered("call-1", "10.0.0.1".parse().unwrap()).unwrap();
        for m in [Method::BYE, Method::INVITE, Method::ACK, Method::CANCEL, Method::INFO] {
            assert_eq!(s.judge(knock("10.0.0.1", &m, true, "call-1"), 1), Verdict::Pass, "{m}");
            // The trunk's other node: taken.
            assert_eq!(s.judge(knock("10.0.0.7", &m, true, "call-1"), 1), Verdict::Pass, "{m}");
            // Another trunk (or a source forged in its network): dropped.
            assert_eq!(s.judge(knock("10.0.1.2", &m, true, "call-1"), 1), Verdict::Drop("dialog_elsewhere"));
        }
        // A CANCEL carries no To tag: it is judged as in the dialog of its call.
        assert_eq!(s.judge(knock("10.0.1.2", &Method::CANCEL, false, "call-1"), 1), Verdict::Drop("dialog_elsewhere"));
        // One call per Call-ID: a late copy of its INVITE opens no second one, and cannot
        // take the first's place in the book.
        assert_eq!(s.judge(knock("10.0.0.1", &Method::INVITE, false, "call-1"), 1), Verdict::Drop("call_exists"));
        assert_eq!(s.entered("call-1", "10.0.1.2".parse().unwrap()), None);
        s.ended("call-1", entry + 1);
        assert_eq!(s.judge(knock("10.0.0.1", &Method::BYE, true, "call-1"), 1), Verdict::Pass, "another's end");
        s.ended("call-1", entry);
        assert_eq!(s.judge(knock("10.0.0.1", &Method::BYE, true, "call-1"), 1), Verdict::Answer(481, "no_dialog"));
    }

    #[test]
    fn invites_are_counted_per_address_and_other_methods_are_not_served() {
        let mut s = screen(3);
        for _ in 0..3 {
            assert_eq!(s.judge(knock("10.0.0.1", &Method::INVITE, false, "x"), 1), Verdict::Pass);
        }
        assert_eq!(s.judge(knock("10.0.0.1", &Method::INVITE, false, "x"), 1), Verdict::Drop("rate"));
        // Another trunk is not held back by the first; the next second starts over.
        assert_eq!(s.judge(knock("10.0.0.2", &Method::INVITE, false, "x"), 1), Verdict::Pass);
        assert_eq!(s.judge(knock("10.0.0.1", &Method::INVITE, false, "x"), 2), Verdict::Pass);
        // Keepalives are not INVITEs.
        for _ in 0..10 {
            assert_eq!(s.judge(knock("10.0.0.1", &Method::OPTIONS, false, "x"), 2), Verdict::Pass);
        }
        for m in [Method::REGISTER, Method::MESSAGE, Method::SUBSCRIBE, Method::BYE, Method::INFO] {
            assert_eq!(s.judge(knock("10.0.0.1", &m, false, "x"), 2), Verdict::Answer(405, "method"));
        }
    }

    #[test]
    fn addresses_past_the_books_size_share_one_count() {
        let mut s = Screen::new(|_| Some(0), 2);
        for i in 0..MAX_RATED as u32 {
            let ip = IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + i));
            assert_eq!(
                s.judge(Knock { source: ip, method: &Method::INVITE, tagged: false, call_id: "x" }, 1),
                Verdict::Pass
            );
        }
        let crowd = |n: u32| IpAddr::from(std::net::Ipv4Addr::from(0x0b00_0000 + n));
        let judge = |s: &mut Screen, n| {
            s.judge(Knock { source: crowd(n), method: &Method::INVITE, tagged: false, call_id: "x" }, 1)
        };
        assert_eq!(judge(&mut s, 1), Verdict::Pass);
        assert_eq!(judge(&mut s, 2), Verdict::Pass);
        assert_eq!(judge(&mut s, 3), Verdict::Drop("rate"));
        assert_eq!(s.invites.len(), MAX_RATED);
    }
}
