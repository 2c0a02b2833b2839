//! A trunk's digest credentials (`[[sip.users]]`), asked of every INVITE when any are set (RFC
//! 3261's digest with MD5, or RFC 8760's SHA-256: `[sip] digest_algorithm`; `qop=auth` only).
//! An INVITE without them, or with a nonce that is not this gateway's, is challenged (401); one
//! whose nonce is older than [`NONCE_LIFE_S`], or whose nonce count did not grow (a request
//! sent again: only a fresh challenge's answer is taken), is challenged as stale; a wrong user,
//! a wrong response, or a response for another Request-URI is refused (403). The header is
//! ezk's to parse; this file keeps the rules: the nonces (stateless: their time, random bytes,
//! and an HMAC of both and the caller's address under a key of this process), the expected
//! response, and each nonce's last count per user.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};

use base64::Engine;
use bytesstr::BytesStr;
use ezk_sip_types::header::typed::{
    Algorithm, AlgorithmValue, AuthChallenge, AuthResponse, DigestChallenge, DigestResponse, QopOption, Username,
};
use ezk_sip_types::uri::SipUri;
use ezk_sip_types::{Headers, Name};
use hmac::{Hmac, Mac};
use parking_lot::Mutex;
use sha2::Digest as _;
use subtle::ConstantTimeEq;

use super::config::{DigestAlgorithm, SipUsers};

/// How long a nonce this gateway gave is good for, in seconds.
pub const NONCE_LIFE_S: u64 = 300;
/// Nonces whose counts are kept, at most (only proven requests add one). A full table forgets
/// its oldest tenth: a nonce given no later than those it forgot is then asked afresh (stale),
/// never refused, and a nonce given since is taken, so one busy trunk cannot lock others out.
const MAX_NONCES: usize = 10_000;

/// What an INVITE's credentials come to.
#[derive(Debug, PartialEq, Eq)]
pub enum DigestVerdict {
    /// Proven, as this user.
    Proven(String),
    /// To be asked (again): 401 with fresh challenges (`stale`: the nonce was only old).
    Challenge { stale: bool },
    /// Refused (403), and why (for the log: never the password or the response).
    Refused(String),
}

/// The credentials and the nonces' key.
pub struct Guard {
    realm: String,
    algorithm: DigestAlgorithm,
    users: HashMap<String, String>,
    key: [u8; 32],
    /// Each nonce and user proven with: its last count, and when the nonce was made.
    counts: Mutex<Counts>,
    /// The number of the next nonce given (nonces are told apart, and forgotten, in order).
    given: AtomicU64,
}

/// The nonce counts of proven requests.
#[derive(Default)]
struct Counts {
    /// Per nonce and user: its last count, and the nonce's number and when it was made.
    last: HashMap<(String, String), (u32, Given)>,
    /// Nonces numbered up to this one may have been forgotten: one not in `last` is asked
    /// afresh rather than taken (its count cannot be checked any more).
    forgot_through: u64,
}

/// A nonce's number and when it was made (Unix seconds).
#[derive(Clone, Copy, Debug)]
struct Given {
    number: u64,
    made: u64,
}

impl Counts {
    /// Takes count `nc` of `key`'s nonce `given`: whether it grew (a request sent again is not
    /// taken, and neither is a nonce whose counts may have been forgotten).
    fn take(&mut self, key: (String, String), nc: u32, given: Given, now: u64) -> bool {
        match self.last.get(&key) {
            Some((last, _)) if nc <= *last => return false,
            None if given.number <= self.forgot_through => return false,
            _ => {}
        }
        if self.last.len() >= MAX_NONCES && !self.last.contains_key(&key) {
            self.last.retain(|_, (_, g)| now.saturating_sub(g.made) <= NONCE_LIFE_S);
        }
        if self.last.len() >= MAX_NONCES && !self.last.contains_key(&key) {
            self.forget_oldest();
        }
        self.last.insert(key, (nc, given));
        true
    }

    /// Forgets the oldest tenth of the nonces, and remembers how far it forgot.
    fn forget_oldest(&mut self) {
        let mut numbers: Vec<u64> = self.last.values().map(|(_, g)| g.number).collect();
        let nth = numbers.len() / 10;
        let (_, cutoff, _) = numbers.select_nth_unstable(nth);
        let cutoff = *cutoff;
        self.last.retain(|_, (_, g)| g.number > cutoff);
        self.forgot_through = self.forgot_through.max(cutoff);
    }
}

impl Guard {
    /// `None` when no credentials are set (the trunk's network is its proof).
    pub fn new(realm: &str, algorithm: DigestAlgorithm, users: &SipUsers) -> Option<Guard> {
        if users.0.is_empty() {
            return None;
        }
        let key = *uuid::Uuid::new_v4().as_bytes();
        let mut k = [0u8; 32];
        k[..16].copy_from_slice(&key);
        k[16..].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
        Some(Guard {
            realm: realm.to_string(),
            algorithm,
            users: users.0.iter().cloned().collect(),
            key: k,
            counts: Mutex::new(Counts::default()),
            given: AtomicU64::new(1),
        })
    }

    /// A nonce for a caller at `source`, made at `now` (Unix seconds): each one of its own,
    /// its salt its number and random bytes.
    fn nonce(&self, source: IpAddr, now: u64) -> String {
        let number = self.given.fetch_add(1, Ordering::Relaxed);
        let salt = format!("{number:x}-{}", uuid::Uuid::new_v4().simple());
        format!("{now:x}.{salt}.{}", self.seal(source, now, &salt))
    }

    fn seal(&self, source: IpAddr, made: u64, salt: &str) -> String {
        let mut mac = Hmac::<sha2::Sha256>::new_from_slice(&self.key).expect("HMAC takes a key of any length");
        mac.update(format!("{made:x}|{salt}|{source}").as_bytes());
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(&mac.finalize().into_bytes()[..18])
    }

    /// The challenge of a 401.
    pub fn challenge(&self, source: IpAddr, now: u64, stale: bool) -> AuthChallenge {
        let algorithm = match self.algorithm {
            DigestAlgorithm::Md5 => AlgorithmValue::MD5,
            DigestAlgorithm::Sha256 => AlgorithmValue::SHA256,
        };
        AuthChallenge::Digest(DigestChallenge {
            realm: BytesStr::from(self.realm.as_str()),
            domain: None,
            nonce: BytesStr::from(self.nonce(source, now)),
            opaque: None,
            stale,
            algorithm: Algorithm::AlgorithmValue(algorithm),
            qop: vec![QopOption::Auth],
            userhash: false,
            other: Vec::new(),
        })
    }

    /// Checks the credentials of a request (`method` to `uri`) from `source` at `now`.
    pub fn check(&self, method: &str, uri: &SipUri, headers: &Headers, source: IpAddr, now: u64) -> DigestVerdict {
        let responses = match headers.try_get::<Vec<AuthResponse>>(Name::AUTHORIZATION) {
            None => return DigestVerdict::Challenge { stale: false },
            Some(Err(e)) => return DigestVerdict::Refused(format!("its Authorization header does not parse: {e}")),
            Some(Ok(r)) => r,
        };
        let Some(digest) = responses.into_iter().find_map(|r| match r {
            AuthResponse::Digest(d) if d.realm == self.realm.as_str() => Some(d),
            _ => None,
        }) else {
            return DigestVerdict::Challenge { stale: false };
        };
        // The nonce: this gateway's, for this address, and recent.
        let mut parts = digest.nonce.splitn(3, '.');
        let (Some(made), Some(salt), Some(seal)) = (parts.next(), parts.next(), parts.next()) else {
            return DigestVerdict::Challenge { stale: false };
        };
        let Ok(made_at) = u64::from_str_radix(made, 16) else {
            return DigestVerdict::Challenge { stale: false };
        };
        if !bool::from(self.seal(source, made_at, salt).as_bytes().ct_eq(seal.as_bytes())) {
            return DigestVerdict::Challenge { stale: false };
        }
        if now.saturating_sub(made_at) > NONCE_LIFE_S || made_at > now + 5 {
            return DigestVerdict::Challenge { stale: true };
        }
        let user = match &digest.username {
            Username::Username(u) => u.to_string(),
            Username::UsernameNonASCII(_) => return DigestVerdict::Refused("a user name it does not know".into()),
        };
        let Some(password) = self.users.get(&user) else {
            return DigestVerdict::Refused(format!("user '{}' is not one of sip.users", clipped(&user)));
        };
        let hash: fn(&str) -> String = match (&digest.algorithm, self.algorithm) {
            (Algorithm::AlgorithmValue(AlgorithmValue::MD5), DigestAlgorithm::Md5) => {
                |s| format!("{:x}", md5::compute(s))
            }
            (Algorithm::AlgorithmValue(AlgorithmValue::SHA256), DigestAlgorithm::Sha256) => {
                |s| hex::encode(sha2::Sha256::digest(s))
            }
            _ => return DigestVerdict::Refused(format!("another algorithm than the one asked ({})", digest.algorithm)),
        };
        let Some(qop) = digest.qop_response.as_ref().filter(|q| q.qop == QopOption::Auth) else {
            return DigestVerdict::Refused("no qop=auth (a nonce count is required)".into());
        };
        if !self.proves(&digest, password, method, hash) {
            return DigestVerdict::Refused(format!("a wrong password for user '{}'", clipped(&user)));
        }
        // The response is for this request's URI (the hash covers the one it names).
        if !digest.uri.parse::<SipUri>().is_ok_and(|signed| signed.compare(uri)) {
            return DigestVerdict::Refused(format!(
                "credentials for another URI than the request's ({})",
                clipped(&digest.uri)
            ));
        }
        // A count that grows: a request sent again is not taken, and is asked afresh (only the
        // password's holder answers a new challenge).
        let key = (digest.nonce.to_string(), user.clone());
        // The salt of a nonce this gateway sealed starts with its number.
        let number = salt.split_once('-').and_then(|(n, _)| u64::from_str_radix(n, 16).ok()).unwrap_or(0);
        if !self.counts.lock().take(key, qop.nc, Given { number, made: made_at }, now) {
            return DigestVerdict::Challenge { stale: true };
        }
        DigestVerdict::Proven(user)
    }

    /// Whether the response is the one the password gives (RFC 2617's, qop auth). The count is
    /// hashed as sent, eight hex digits (ezk read it as a number: either case is tried).
    fn proves(&self, d: &DigestResponse, password: &str, method: &str, hash: fn(&str) -> String) -> bool {
        let Some(q) = &d.qop_response else { return false };
        let ha1 = hash(&format!("{}:{}:{password}", user_of(d), self.realm));
        let ha2 = hash(&format!("{method}:{}", d.uri));
        [format!("{:08x}", q.nc), format!("{:08X}", q.nc)].iter().any(|nc| {
            let expected = hash(&format!("{ha1}:{}:{nc}:{}:auth:{ha2}", d.nonce, q.cnonce));
            bool::from(expected.as_bytes().ct_eq(d.response.to_ascii_lowercase().as_bytes()))
        })
    }
}

fn user_of(d: &DigestResponse) -> &str {
    match &d.username {
        Username::Username(u) | Username::UsernameNonASCII(u) => u,
    }
}

/// A name a caller sent, clipped for a log line.
fn clipped(name: &str) -> String {
    name.chars().filter(|c| !c.is_control()).take(64).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use ezk_sip_auth::{ClientAuthenticator, DigestAuthenticator, DigestCredentials, DigestUser, RequestParts};
    use ezk_sip_types::msg::{RequestLine, StatusLine};
    use ezk_sip_types::{Method, StatusCode};

    const NOW: u64 = 1_800_000_000;

    fn guard() -> Guard {
        guard_of(DigestAlgorithm::Md5)
    }

    fn guard_of(algorithm: DigestAlgorithm) -> Guard {
        let users = SipUsers(vec![("trunk".into(), "a-long-trunk-password".into())]);
        Guard::new("omni-gateway", algorithm, &users).unwrap()
    }

    fn source() -> IpAddr {
        "198.51.100.7".parse().unwrap()
    }

    fn uri() -> SipUri {
        "sip:100@203.0.113.10".parse().unwrap()
    }

    /// What ezk's own client (an implementation of its own) sends back to the gateway's 401.
    fn answered(guard: &Guard, user: &str, password: &str, stale: bool) -> (DigestAuthenticator, Headers) {
        let mut credentials = DigestCredentials::new();
        credentials.set_default(DigestUser::new(user, password));
        let mut client = DigestAuthenticator::new(credentials);
        let mut challenge = Headers::new();
        challenge.insert_type(Name::WWW_AUTHENTICATE, &guard.challenge(source(), NOW, stale));
        let line = RequestLine { method: Method::INVITE, uri: uri() };
        let status = StatusLine { code: StatusCode::UNAUTHORIZED, reason: None };
        let empty = Headers::new();
        let request = RequestParts { line: &line, headers: &empty, body: &[] };
        client
            .handle_rejection(request, ezk_sip_auth::ResponseParts { line: &status, headers: &challenge, body: &[] })
            .unwrap();
        let mut headers = Headers::new();
        client.authorize_request(&mut headers);
        (client, headers)
    }

    fn printed(c: &AuthChallenge) -> String {
        let mut h = Headers::new();
        h.insert_type(Name::WWW_AUTHENTICATE, c);
        h.get_raw(&Name::WWW_AUTHENTICATE).next().unwrap().to_string()
    }

    #[test]
    fn an_invite_without_credentials_is_challenged_with_the_algorithm_asked() {
        let g = guard();
        assert_eq!(
            g.check("INVITE", &uri(), &Headers::new(), source(), NOW),
            DigestVerdict::Challenge { stale: false }
        );
        let md5 = printed(&g.challenge(source(), NOW, false));
        assert!(
            md5.contains("algorithm=MD5") && md5.contains("realm=\"omni-gateway\"") && md5.contains("qop=\"auth\"")
        );
        let sha = guard_of(DigestAlgorithm::Sha256);
        assert!(printed(&sha.challenge(source(), NOW, true)).contains("algorithm=SHA-256"));
        assert!(printed(&sha.challenge(source(), NOW, true)).contains("stale=true"));
        // ezk's client answers SHA-256 as well.
        let (_, headers) = answered(&sha, "trunk", "a-long-trunk-password", false);
        assert_eq!(sha.check("INVITE", &uri(), &headers, source(), NOW), DigestVerdict::Proven("trunk".into()));
        // An MD5 answer to a SHA-256 gateway is refused.
        let (_, md5) = answered(&g, "trunk", "a-long-trunk-password", false);
        let verdict = sha.check("INVITE", &uri(), &md5, source(), NOW);
        assert!(matches!(&verdict, DigestVerdict::Refused(_) | DigestVerdict::Challenge { .. }), "{verdict:?}");
    }

    #[test]
    fn ezk_s_client_proves_the_password_once_per_count_and_a_wrong_one_is_refused() {
        let g = guard();
        let (mut client, headers) = answered(&g, "trunk", "a-long-trunk-password", false);
        assert_eq!(g.check("INVITE", &uri(), &headers, source(), NOW + 1), DigestVerdict::Proven("trunk".into()));
        // The same again (a replay) is asked afresh; the client's next count is taken.
        assert_eq!(g.check("INVITE", &uri(), &headers, source(), NOW + 1), DigestVerdict::Challenge { stale: true });
        let mut next = Headers::new();
        client.authorize_request(&mut next);
        assert_eq!(g.check("INVITE", &uri(), &next, source(), NOW + 2), DigestVerdict::Proven("trunk".into()));
        // Another method than the one signed does not check.
        let (_, other) = answered(&g, "trunk", "a-long-trunk-password", false);
        assert!(matches!(g.check("BYE", &uri(), &other, source(), NOW), DigestVerdict::Refused(_)));

        let (_, wrong) = answered(&g, "trunk", "not-the-password-at-all", false);
        let verdict = g.check("INVITE", &uri(), &wrong, source(), NOW);
        assert!(matches!(&verdict, DigestVerdict::Refused(why) if why.contains("wrong password")), "{verdict:?}");
        assert!(!format!("{verdict:?}").contains("not-the-password"));
        // Signed for another number: refused on this one.
        let (_, signed) = answered(&g, "trunk", "a-long-trunk-password", false);
        let elsewhere: SipUri = "sip:200@203.0.113.10".parse().unwrap();
        let verdict = g.check("INVITE", &elsewhere, &signed, source(), NOW);
        assert!(matches!(&verdict, DigestVerdict::Refused(why) if why.contains("another URI")), "{verdict:?}");
        // Two calls of one trunk in the same second each get a nonce of their own.
        let (_, one) = answered(&g, "trunk", "a-long-trunk-password", false);
        let (_, two) = answered(&g, "trunk", "a-long-trunk-password", false);
        assert_eq!(g.check("INVITE", &uri(), &one, source(), NOW), DigestVerdict::Proven("trunk".into()));
        assert_eq!(g.check("INVITE", &uri(), &two, source(), NOW), DigestVerdict::Proven("trunk".into()));
        let (_, stranger) = answered(&g, "someone", "a-long-trunk-password", false);
        assert!(
            matches!(g.check("INVITE", &uri(), &stranger, source(), NOW), DigestVerdict::Refused(why) if why.contains("someone"))
        );
    }

    #[test]
    fn a_nonce_is_good_for_its_address_and_its_time_only() {
        let g = guard();
        let (_, headers) = answered(&g, "trunk", "a-long-trunk-password", false);
        let elsewhere: IpAddr = "198.51.100.8".parse().unwrap();
        assert_eq!(g.check("INVITE", &uri(), &headers, elsewhere, NOW), DigestVerdict::Challenge { stale: false });
        assert_eq!(
            g.check("INVITE", &uri(), &headers, source(), NOW + NONCE_LIFE_S + 1),
            DigestVerdict::Challenge { stale: true }
        );
        // Another gateway's (another process's key) nonce is not this one's.
        let other = guard();
        assert_eq!(other.check("INVITE", &uri(), &headers, source(), NOW), DigestVerdict::Challenge { stale: false });
    }

    #[test]
    fn a_full_table_forgets_its_oldest_nonces_and_never_locks_a_trunk_out() {
        let mut counts = Counts::default();
        let key = |i: u64| (format!("nonce-{i}"), "trunk".to_string());
        let given = |number: u64| Given { number, made: NOW - 1 };
        // One trunk fills the table with nonces of the last second (none expired).
        for i in 1..=MAX_NONCES as u64 {
            assert!(counts.take(key(i), 1, given(i), NOW));
        }
        // Another user's call, on a nonce given before the flood's last ones, still gets in:
        // the oldest tenth is forgotten to make room.
        let other = ("other-nonce".to_string(), "other".to_string());
        assert!(counts.take(other.clone(), 1, given(MAX_NONCES as u64 / 2), NOW));
        assert_eq!(counts.forgot_through, MAX_NONCES as u64 / 10 + 1);
        assert!(counts.last.len() < MAX_NONCES);
        // A forgotten nonce is not taken again, with an old count (a replay) or a new one: it is
        // asked afresh.
        assert!(!counts.take(key(1), 1, given(1), NOW));
        assert!(!counts.take(key(1), 2, given(1), NOW));
        // A kept one goes on counting.
        assert!(counts.take(other.clone(), 2, given(MAX_NONCES as u64 / 2), NOW));
        assert!(!counts.take(other, 2, given(MAX_NONCES as u64 / 2), NOW));
        // Tens of thousands of calls in the same second at a full table: every new nonce is taken.
        let next = MAX_NONCES as u64 + 1;
        for i in next..next + 3 * MAX_NONCES as u64 {
            assert!(counts.take(key(i), 1, Given { number: i, made: NOW }, NOW), "call {i}");
        }
    }

    #[test]
    fn a_nonce_carries_its_number_under_the_seal() {
        let g = guard();
        let (_, headers) = answered(&g, "trunk", "a-long-trunk-password", false);
        assert_eq!(g.check("INVITE", &uri(), &headers, source(), NOW), DigestVerdict::Proven("trunk".into()));
        let counts = g.counts.lock();
        let (_, given) = counts.last.values().next().unwrap();
        assert!(given.number >= 1 && given.made == NOW, "{given:?}");
    }
}
