//! Access control at the edge: API keys for the realtime endpoint, the admin key (or, with
//! none configured, loopback only) for the operator routes, the browser Origin allowlist,
//! the client address behind trusted proxies, and a throttle on failed key attempts.
//! Keys are compared in constant time and never logged or recorded.
//!
//! The throttle slows guessing and never refuses a key that is right: an address (an IPv6 /64)
//! that presented [`THROTTLE_ATTEMPTS`] wrong keys within [`THROTTLE_WINDOW`] has its wrong keys
//! answered one at a time, each [`THROTTLE_PACE`] after it arrived or the previous one was
//! answered, with 429, until the window passes; a right key is admitted at once. At most
//! [`MAX_PACED_WAITING`] refusals wait per address; past that no key of the address is checked
//! until one was answered (a guesser gets one try a second, however many connections it opens).
//!
//! Without an admin key the operator routes answer a request only when everything about it
//! says it was made on this host: its TCP peer is 127.0.0.1 or ::1 (not another address of
//! 127/8, which a service mesh's sidecar uses), it names a loopback host (`localhost`,
//! `127.0.0.1`, `[::1]`: a page of another site that had its name resolved to 127.0.0.1, DNS
//! rebinding, names its own), and no proxy forwarded it.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix_web::HttpRequest;
use actix_web::http::header;
use parking_lot::{Mutex, RwLock};
use subtle::ConstantTimeEq;

use client_secrets::ClientSecrets;
use omni_transports::caller::Origin;

pub(crate) mod client_secrets;

pub use omni_actors::settings::MIN_KEY_BYTES;

/// Which key a request is checked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyKind {
    Api,
    Admin,
    /// A client secret (`ek_...`), minted with an API key, good once.
    ClientSecret,
}

/// Why a request is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Denied {
    /// No key was presented (401).
    Missing(KeyKind),
    /// A key was presented and is not one of the configured keys (401).
    Wrong(KeyKind),
    /// An operator route not made on this host while no admin key is configured (403).
    AdminLoopbackOnly,
    /// Too many wrong keys from this address lately (429).
    Throttled,
}

impl Denied {
    pub fn message(self) -> String {
        match self {
            Denied::Missing(KeyKind::Api) => "an API key is required: send `Authorization: Bearer KEY`".into(),
            Denied::Missing(KeyKind::Admin) => "the admin key is required: send `Authorization: Bearer KEY`".into(),
            Denied::Wrong(KeyKind::Api) => "the API key is not valid".into(),
            Denied::Wrong(KeyKind::Admin) => "the admin key is not valid".into(),
            Denied::Wrong(KeyKind::ClientSecret) => "this client secret was already used or has expired (a secret \
                                                     opens one session, within its lifetime)"
                .into(),
            Denied::Missing(KeyKind::ClientSecret) => "a client secret is required".into(),
            Denied::AdminLoopbackOnly => "the operator routes answer only requests made on this host (from \
                                          127.0.0.1 or ::1, to localhost, not forwarded) while no admin key is \
                                          configured: set [auth] admin_key to reach them otherwise"
                .into(),
            Denied::Throttled => format!(
                "too many wrong keys from this address: wrong keys are refused for up to {} s",
                THROTTLE_WINDOW.as_secs()
            ),
        }
    }
}

/// Whether `candidate` equals any of `keys`. Every key is compared, each in constant time.
fn matches_any(candidate: &str, keys: &[String]) -> bool {
    keys.iter().fold(0u8, |acc, k| acc | k.as_bytes().ct_eq(candidate.as_bytes()).unwrap_u8()) == 1
}

/// An API key's id in logs, metrics, usage files and webhooks: `key_` and the first 12 hex
/// digits of its SHA-256. Never the key itself, and no use to guess it.
pub fn key_id(key: &str) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(key.as_bytes());
    format!("key_{}", &hex::encode(digest)[..12])
}

/// The bearer token of a request's Authorization header.
pub fn bearer(req: &HttpRequest) -> Option<&str> {
    let value = req.headers().get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// Wrong keys an address may present within [`THROTTLE_WINDOW`] before its wrong keys are
/// answered 429 until the window has passed (a correct key is always admitted).
pub const THROTTLE_ATTEMPTS: u32 = 10;
pub const THROTTLE_WINDOW: Duration = Duration::from_secs(60);
/// How long each key check of a throttled address waits, one at a time.
pub const THROTTLE_PACE: Duration = Duration::from_secs(1);
/// Refusals of one throttled address waiting for their turns at most; past it, the address's
/// next key is not checked (429) until one was answered.
pub const MAX_PACED_WAITING: usize = 8;
/// Addresses with a pacing gate kept at most (idle ones are forgotten first).
const PACED_ADDRESSES: usize = 10_000;
/// Addresses remembered at most (the oldest entries are forgotten first).
const THROTTLE_ADDRESSES: usize = 100_000;

/// Failed key attempts per address (an IPv6 /64 as one), as a plain struct: a fixed window
/// per address.
#[derive(Debug, Default)]
pub struct Throttle {
    failures: HashMap<IpAddr, (Instant, u32)>,
}

impl Throttle {
    /// Whether a wrong key from `ip` is refused now.
    pub fn refused(&mut self, ip: IpAddr, now: Instant) -> bool {
        let ip = omni_actors::net::counted_as(ip);
        match self.failures.get(&ip) {
            Some(&(since, n)) if now.saturating_duration_since(since) < THROTTLE_WINDOW => n >= THROTTLE_ATTEMPTS,
            Some(_) => {
                self.failures.remove(&ip);
                false
            }
            None => false,
        }
    }

    /// `ip` presented a wrong key.
    pub fn failed(&mut self, ip: IpAddr, now: Instant) {
        let ip = omni_actors::net::counted_as(ip);
        if self.failures.len() >= THROTTLE_ADDRESSES {
            self.failures.retain(|_, (since, _)| now.saturating_duration_since(*since) < THROTTLE_WINDOW);
            if self.failures.len() >= THROTTLE_ADDRESSES {
                self.failures.clear();
            }
        }
        let entry = self.failures.entry(ip).or_insert((now, 0));
        if now.saturating_duration_since(entry.0) >= THROTTLE_WINDOW {
            *entry = (now, 0);
        }
        entry.1 += 1;
    }
}

/// The keys a request may present. The API keys can be replaced while the server runs
/// (SIGHUP reloads the keys file).
#[derive(Clone, Default)]
pub struct Keys {
    api: Arc<RwLock<Arc<Vec<String>>>>,
    admin: Option<Arc<str>>,
    throttle: Arc<Mutex<Throttle>>,
    /// One gate per throttled address: its key checks pass one at a time.
    gates: Arc<Mutex<HashMap<IpAddr, Arc<tokio::sync::Mutex<()>>>>>,
    /// Client secrets minted and not yet used ([`crate::auth::client_secrets`]).
    pub secrets: Arc<Mutex<ClientSecrets>>,
}

/// Who a realtime client is, once its key or client secret is checked.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Credential {
    /// The API key's id (for a client secret: the id of the key that minted it).
    pub key_id: Option<String>,
    /// The session settings a client secret was minted with.
    pub session: Option<serde_json::Value>,
    /// The client secret presented, not yet taken ([`Keys::check_realtime`] with
    /// `take: false`): the caller takes it once what it opens has started. Never logged.
    pub untaken_secret: Option<String>,
}

impl Credential {
    /// The model a client secret was minted for, if it names one.
    pub fn model(&self) -> Option<&str> {
        self.session.as_ref()?.get("model")?.as_str()
    }
}

/// A throttled address's turn to have a key checked; the next waits until it is dropped.
pub type Turn = tokio::sync::OwnedMutexGuard<()>;

impl Keys {
    pub fn new(api: Vec<String>, admin: Option<String>) -> Keys {
        Keys {
            api: Arc::new(RwLock::new(Arc::new(api))),
            admin: admin.map(Into::into),
            throttle: Arc::default(),
            gates: Arc::default(),
            secrets: Arc::default(),
        }
    }

    /// The same keys, holding at most `max` client secrets, `max_per_key` of each key.
    pub fn with_client_secrets(mut self, max: usize, max_per_key: usize) -> Keys {
        self.secrets = Arc::new(Mutex::new(ClientSecrets::new(max, max_per_key)));
        self
    }

    pub fn api_required(&self) -> bool {
        !self.api.read().is_empty()
    }

    /// Replaces the API keys (a reload): the client secrets of a key no longer listed are
    /// revoked with it. Returns how many keys there are now and how many secrets were revoked.
    pub fn replace_api(&self, keys: Vec<String>) -> (usize, usize) {
        let n = keys.len();
        let live: std::collections::HashSet<String> = keys.iter().map(|k| key_id(k)).collect();
        *self.api.write() = Arc::new(keys);
        let revoked = self.secrets.lock().keep_keys(&live);
        (n, revoked)
    }

    /// Waits for the address's turn when it is throttled: one refusal at a time, each
    /// [`THROTTLE_PACE`] late.
    pub async fn pace(&self, ip: Option<IpAddr>) -> Option<Turn> {
        let ip = omni_actors::net::counted_as(ip?);
        if !self.throttle.lock().refused(ip, Instant::now()) {
            return None;
        }
        let gate = {
            let mut gates = self.gates.lock();
            if gates.len() >= PACED_ADDRESSES {
                gates.retain(|_, g| Arc::strong_count(g) > 1);
            }
            gates.entry(ip).or_default().clone()
        };
        let turn = gate.lock_owned().await;
        tokio::time::sleep(THROTTLE_PACE).await;
        Some(turn)
    }

    /// `check`, answered at once when it admits; a refusal waits for its address's turn when
    /// the address is throttled ([`Keys::pace`]). Whoever shares an address with a guesser and
    /// holds the right key is not made to wait behind the guesses. A throttled address with
    /// [`MAX_PACED_WAITING`] refusals waiting has no key checked until one is answered: a
    /// guesser still gets one try a second, however many connections it opens.
    pub async fn paced<T>(
        &self,
        client: Option<IpAddr>,
        check: impl FnOnce(&Keys) -> Result<T, Denied>,
    ) -> Result<T, Denied> {
        if self.waiting(client) >= MAX_PACED_WAITING {
            return Err(Denied::Throttled);
        }
        let verdict = check(self);
        if verdict.is_err() {
            drop(self.pace(client).await);
        }
        verdict
    }

    /// Refusals of the address waiting for their turn.
    fn waiting(&self, ip: Option<IpAddr>) -> usize {
        let Some(ip) = ip.map(omni_actors::net::counted_as) else { return 0 };
        self.gates.lock().get(&ip).map_or(0, |g| Arc::strong_count(g) - 1)
    }

    /// A wrong key is counted against its address, and refused as [`Denied::Throttled`] once
    /// the address is over the limit; any other verdict stands (a correct key is admitted).
    fn throttled(&self, ip: Option<IpAddr>, verdict: Result<(), Denied>) -> Result<(), Denied> {
        let (Some(ip), Err(Denied::Wrong(_))) = (ip, verdict) else { return verdict };
        let now = Instant::now();
        let mut throttle = self.throttle.lock();
        if throttle.refused(ip, now) {
            return Err(Denied::Throttled);
        }
        throttle.failed(ip, now);
        verdict
    }

    /// Checks an API key, taken from the places a client may put it (the first given).
    /// Answers the key's id ([`key_id`]), or none when no keys are configured.
    pub fn check_api<'a>(
        &self,
        client: Option<IpAddr>,
        candidates: impl IntoIterator<Item = Option<&'a str>>,
    ) -> Result<Option<String>, Denied> {
        let api = self.api.read().clone();
        if api.is_empty() {
            return Ok(None);
        }
        let (verdict, key) = match candidates.into_iter().flatten().next() {
            None => (Err(Denied::Missing(KeyKind::Api)), None),
            Some(key) if matches_any(key, &api) => (Ok(()), Some(key)),
            Some(_) => (Err(Denied::Wrong(KeyKind::Api)), None),
        };
        self.throttled(client, verdict)?;
        Ok(key.map(key_id))
    }

    /// Checks a realtime client: a client secret (`ek_...`, good once) or an API key
    /// ([`Keys::check_api`]). With `take`, a secret is used up now; without, it is only
    /// checked, and left in [`Credential::untaken_secret`] for the caller to take. A secret that
    /// is unknown, used or expired is refused like a wrong key, also when no API keys are
    /// configured.
    pub fn check_realtime<'a>(
        &self,
        client: Option<IpAddr>,
        candidates: impl IntoIterator<Item = Option<&'a str>>,
        take: bool,
    ) -> Result<Credential, Denied> {
        let first = candidates.into_iter().flatten().next();
        if let Some(secret) = first.filter(|k| k.starts_with(client_secrets::PREFIX)) {
            let mut secrets = self.secrets.lock();
            let now = Instant::now();
            let grant = if take { secrets.redeem(secret, now) } else { secrets.peek(secret, now) };
            drop(secrets);
            let verdict = if grant.is_some() { Ok(()) } else { Err(Denied::Wrong(KeyKind::ClientSecret)) };
            self.throttled(client, verdict)?;
            let grant = grant.unwrap_or(client_secrets::Grant { key_id: None, session: None });
            let untaken_secret = (!take).then(|| secret.to_string());
            return Ok(Credential { key_id: grant.key_id, session: grant.session, untaken_secret });
        }
        self.check_api(client, [first]).map(|key_id| Credential { key_id, session: None, untaken_secret: None })
    }

    /// Takes a client secret checked earlier; `false` when it was used meanwhile, or expired.
    pub fn take_secret(&self, secret: &str) -> bool {
        self.secrets.lock().redeem(secret, Instant::now()).is_some()
    }

    /// Checks the operator routes: the admin key (Bearer) when one is configured; without
    /// one, only requests made on this host ([`made_on_this_host`]), not through one of the
    /// `proxies`.
    pub fn check_admin(
        &self,
        req: &HttpRequest,
        client: Option<IpAddr>,
        proxies: &[ipnet::IpNet],
    ) -> Result<(), Denied> {
        let Some(admin) = &self.admin else {
            return if made_on_this_host(req, proxies) { Ok(()) } else { Err(Denied::AdminLoopbackOnly) };
        };
        let verdict = match bearer(req) {
            None => Err(Denied::Missing(KeyKind::Admin)),
            Some(key) if matches_any(key, &[admin.to_string()]) => Ok(()),
            Some(_) => Err(Denied::Wrong(KeyKind::Admin)),
        };
        self.throttled(client, verdict)
    }
}

/// Whether a request was made on this host: its TCP peer is 127.0.0.1 or ::1 and none of the
/// trusted `proxies`, its Host a loopback name (`localhost`, `127.0.0.1`, `[::1]`, with any
/// port), and it carries no forwarding header. (A proxy on this host that adds no forwarding
/// header and is not listed passes: set an admin key behind one.)
pub fn made_on_this_host(req: &HttpRequest, proxies: &[ipnet::IpNet]) -> bool {
    let proxied = req.peer_addr().is_some_and(|p| omni_actors::net::in_any(p.ip(), proxies));
    let peer_ok = !proxied
        && req.peer_addr().is_some_and(|p| match p.ip() {
            IpAddr::V4(v4) => v4 == std::net::Ipv4Addr::LOCALHOST,
            IpAddr::V6(v6) => {
                v6 == std::net::Ipv6Addr::LOCALHOST || v6.to_ipv4_mapped() == Some(std::net::Ipv4Addr::LOCALHOST)
            }
        });
    let host_ok = req.headers().get(header::HOST).and_then(|h| h.to_str().ok()).is_some_and(loopback_host);
    let forwarded = ["forwarded", "x-forwarded-for", "x-forwarded-host", "x-real-ip"]
        .iter()
        .any(|name| req.headers().contains_key(*name));
    peer_ok && host_ok && !forwarded
}

/// Whether a Host header names this host by a loopback name.
fn loopback_host(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(rest) => rest.split_once(']').map_or("", |(name, _)| name),
        None => {
            host.rsplit_once(':').map_or(host, |(name, port)| if port.parse::<u16>().is_ok() { name } else { host })
        }
    };
    name.eq_ignore_ascii_case("localhost") || name == "127.0.0.1" || name == "::1"
}

/// The client's address: the TCP peer, or, when the peer is a trusted proxy (in one of the
/// `trusted` networks), the address that proxy appended to `X-Forwarded-For` (the last entry;
/// earlier ones are the client's own claims and are not trusted).
pub fn client_ip(req: &HttpRequest, trusted: &[ipnet::IpNet]) -> Option<IpAddr> {
    let peer = req.peer_addr()?.ip();
    if !omni_actors::net::in_any(peer, trusted) {
        return Some(peer);
    }
    let forwarded = req
        .headers()
        .get_all("x-forwarded-for")
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .last();
    match forwarded.and_then(|v| v.parse::<IpAddr>().ok()) {
        Some(ip) => Some(ip),
        None => Some(peer),
    }
}

/// A request's Origin, as admission checks it ([`crate::admission::Origin`]).
pub fn origin_of(req: &HttpRequest) -> Origin {
    match req.headers().get(header::ORIGIN) {
        None => Origin::Absent,
        Some(origin) => match origin.to_str() {
            Ok(origin) => Origin::Given(origin.to_string()),
            Err(_) => Origin::Unreadable,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::test::TestRequest;

    const A: &str = "alpha-0123456789abcdef";
    const B: &str = "beta-0123456789abcdef";

    #[test]
    fn api_keys() {
        let keys = Keys::new(vec![A.into(), B.into()], None);
        assert_eq!(keys.check_api(None, [None, Some(B)]), Ok(Some(key_id(B))));
        assert!(key_id(B).starts_with("key_") && key_id(B).len() == 16 && !key_id(B).contains(&B[..4]));
        assert_eq!(keys.check_api(None, [Some("gamma")]), Err(Denied::Wrong(KeyKind::Api)));
        assert_eq!(keys.check_api(None, [Some(&A[..A.len() - 1])]), Err(Denied::Wrong(KeyKind::Api)));
        assert_eq!(keys.check_api(None, [None, None]), Err(Denied::Missing(KeyKind::Api)));
        assert_eq!(Keys::default().check_api(None, [None]), Ok(None), "no keys configured: open");
        assert_eq!(keys.replace_api(vec![B.into()]), (1, 0));
        assert_eq!(keys.check_api(None, [Some(A)]), Err(Denied::Wrong(KeyKind::Api)), "replaced");
    }

    #[test]
    fn messages_read_well() {
        assert_eq!(Denied::Wrong(KeyKind::Api).message(), "the API key is not valid");
        assert_eq!(Denied::Wrong(KeyKind::Admin).message(), "the admin key is not valid");
        assert!(Denied::Missing(KeyKind::Api).message().starts_with("an API key is required"));
        assert!(Denied::AdminLoopbackOnly.message().contains("admin_key"));
    }

    #[test]
    fn admin_key_from_bearer_or_loopback_without_one() {
        let keys = Keys::new(vec![], Some(A.into()));
        let local: Option<IpAddr> = Some("127.0.0.1".parse().unwrap());
        let remote: Option<IpAddr> = Some("192.0.2.7".parse().unwrap());
        let req = TestRequest::default().insert_header(("Authorization", format!("Bearer {A}"))).to_http_request();
        assert_eq!(keys.check_admin(&req, remote, &[]), Ok(()));
        let req = TestRequest::default().insert_header(("Authorization", "bearer nope")).to_http_request();
        assert_eq!(keys.check_admin(&req, remote, &[]), Err(Denied::Wrong(KeyKind::Admin)));
        assert_eq!(
            keys.check_admin(&TestRequest::default().to_http_request(), local, &[]),
            Err(Denied::Missing(KeyKind::Admin))
        );
    }

    #[test]
    fn without_an_admin_key_only_requests_made_on_this_host_are_answered() {
        let open = Keys::default();
        let req = |peer: &str, host: &str, extra: Option<(&str, &str)>| {
            let mut r = TestRequest::default().peer_addr(peer.parse().unwrap()).insert_header(("Host", host));
            if let Some(h) = extra {
                r = r.insert_header(h);
            }
            r.to_http_request()
        };
        for (peer, host) in [
            ("127.0.0.1:5000", "localhost:8006"),
            ("127.0.0.1:5000", "127.0.0.1:8006"),
            ("127.0.0.1:5000", "LOCALHOST"),
            ("[::1]:5000", "[::1]:8006"),
            ("[::ffff:127.0.0.1]:5000", "localhost"),
        ] {
            assert_eq!(open.check_admin(&req(peer, host, None), None, &[]), Ok(()), "{peer} {host}");
        }
        let refused = [
            req("192.0.2.7:5000", "localhost", None),                  // another host
            req("127.0.0.6:5000", "localhost", None),                  // a sidecar's source address
            req("127.0.0.1:5000", "rebind.attacker.example", None),    // DNS rebinding
            req("127.0.0.1:5000", "localhost.attacker.example", None), // a name that starts like it
            req("127.0.0.1:5000", "localhost", Some(("X-Forwarded-For", "192.0.2.7"))),
            req("127.0.0.1:5000", "localhost", Some(("Forwarded", "for=192.0.2.7"))),
        ];
        for r in refused {
            assert_eq!(open.check_admin(&r, None, &[]), Err(Denied::AdminLoopbackOnly), "{:?}", r.headers());
        }
        let no_host = TestRequest::default().peer_addr("127.0.0.1:5000".parse().unwrap()).to_http_request();
        assert_eq!(open.check_admin(&no_host, None, &[]), Err(Denied::AdminLoopbackOnly), "no Host");
        // A proxy on this host, listed as one, that adds no header: its requests are not local.
        let proxies = ["127.0.0.1/32".parse().unwrap()];
        let through = req("127.0.0.1:5000", "127.0.0.1:8006", None);
        assert_eq!(open.check_admin(&through, None, &proxies), Err(Denied::AdminLoopbackOnly));
    }

    #[test]
    fn wrong_keys_are_throttled_per_address() {
        let keys = Keys::new(vec![A.into()], None);
        let ip: IpAddr = "192.0.2.1".parse().unwrap();
        for _ in 0..THROTTLE_ATTEMPTS {
            assert_eq!(keys.check_api(Some(ip), [Some("guess")]), Err(Denied::Wrong(KeyKind::Api)));
        }
        assert_eq!(keys.check_api(Some(ip), [Some("guess")]), Err(Denied::Throttled), "wrong keys, for a while");
        assert_eq!(keys.check_api(Some(ip), [Some(A)]), Ok(Some(key_id(A))), "never the right key");
        assert_eq!(keys.check_api(Some(ip), [None]), Err(Denied::Missing(KeyKind::Api)), "no key is no guess");
        let other: IpAddr = "192.0.2.2".parse().unwrap();
        assert_eq!(keys.check_api(Some(other), [Some("guess")]), Err(Denied::Wrong(KeyKind::Api)), "another address");
        // An IPv6 host holds its /64: its addresses share one count.
        for i in 0..THROTTLE_ATTEMPTS {
            let ip: IpAddr = format!("2001:db8:0:1::{:x}", i + 1).parse().unwrap();
            assert_eq!(keys.check_api(Some(ip), [Some("guess")]), Err(Denied::Wrong(KeyKind::Api)));
        }
        let same_64: IpAddr = "2001:db8:0:1:ffff::1".parse().unwrap();
        assert_eq!(keys.check_api(Some(same_64), [Some("guess")]), Err(Denied::Throttled));
        let mut t = Throttle::default();
        let now = Instant::now();
        for _ in 0..THROTTLE_ATTEMPTS {
            t.failed(ip, now);
        }
        assert!(t.refused(ip, now));
        assert!(!t.refused(ip, now + THROTTLE_WINDOW), "the window passes");
    }

    #[test]
    fn origins() {
        let allowed = vec!["https://app.example".to_string()];
        let req = |o: &[u8]| {
            TestRequest::default()
                .insert_header((header::ORIGIN, header::HeaderValue::from_bytes(o).unwrap()))
                .to_http_request()
        };
        assert!(origin_of(&req(b"https://app.example")).allowed(&allowed));
        assert!(!origin_of(&req(b"https://evil.example")).allowed(&allowed));
        assert_eq!(origin_of(&req(b"https://app.example\xff")), Origin::Unreadable, "not text");
        assert!(!origin_of(&req(b"https://app.example\xff")).allowed(&allowed), "not text: not allowed");
        assert_eq!(origin_of(&TestRequest::default().to_http_request()), Origin::Absent);
        assert!(origin_of(&req(b"https://evil.example")).allowed(&[]));
    }

    #[test]
    fn the_client_is_the_peer_unless_the_peer_is_a_trusted_proxy() {
        let proxy: IpAddr = "10.0.0.9".parse().unwrap();
        let proxies: Vec<ipnet::IpNet> = vec!["10.0.0.0/24".parse().unwrap()];
        let req = |peer: &str, xff: Option<&str>| {
            let mut r = TestRequest::default().peer_addr(format!("{peer}:4000").parse().unwrap());
            if let Some(x) = xff {
                r = r.insert_header(("X-Forwarded-For", x));
            }
            r.to_http_request()
        };
        let spoof = req("192.0.2.5", Some("127.0.0.1"));
        assert_eq!(
            client_ip(&spoof, &proxies),
            Some("192.0.2.5".parse().unwrap()),
            "an untrusted peer's header is ignored"
        );
        let proxied = req("10.0.0.9", Some("127.0.0.1, 198.51.100.4"));
        assert_eq!(client_ip(&proxied, &proxies), Some("198.51.100.4".parse().unwrap()), "the proxy's own entry");
        assert_eq!(client_ip(&req("10.0.0.9", None), &proxies), Some(proxy));
        let other_pod = req("10.0.0.77", Some("198.51.100.4"));
        assert_eq!(client_ip(&other_pod, &proxies), Some("198.51.100.4".parse().unwrap()), "any proxy of the range");
    }
}
