//! Access control at the edge: API keys for the realtime endpoint, the admin key for the
//! operator routes, and the browser Origin allowlist. Keys are compared in constant time
//! and never logged or recorded.

use actix_web::HttpRequest;
use actix_web::http::header;
use subtle::ConstantTimeEq;

/// The keys a request may present.
#[derive(Clone, Default)]
pub struct Keys {
    api: Vec<String>,
    admin: Option<String>,
}

/// Why a request is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Denied {
    Missing,
    Wrong,
}

impl Denied {
    pub fn message(self, what: &str) -> String {
        match self {
            Denied::Missing => format!("{what} is required: send `Authorization: Bearer KEY`"),
            Denied::Wrong => format!("the {what} is not valid"),
        }
    }
}

/// Whether `candidate` equals any of `keys`. Every key is compared, each in constant time.
fn matches_any(candidate: &str, keys: &[String]) -> bool {
    keys.iter().fold(0u8, |acc, k| acc | k.as_bytes().ct_eq(candidate.as_bytes()).unwrap_u8()) == 1
}

/// The bearer token of a request's Authorization header.
pub fn bearer(req: &HttpRequest) -> Option<&str> {
    let value = req.headers().get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

impl Keys {
    pub fn new(api: Vec<String>, admin: Option<String>) -> Keys {
        Keys { api, admin }
    }

    pub fn api_required(&self) -> bool {
        !self.api.is_empty()
    }

    /// Checks an API key, taken from the places a client may put it (the first given).
    pub fn check_api<'a>(&self, candidates: impl IntoIterator<Item = Option<&'a str>>) -> Result<(), Denied> {
        if self.api.is_empty() {
            return Ok(());
        }
        let key = candidates.into_iter().flatten().next().ok_or(Denied::Missing)?;
        if matches_any(key, &self.api) { Ok(()) } else { Err(Denied::Wrong) }
    }

    /// Checks the admin key (Bearer) when one is configured.
    pub fn check_admin(&self, req: &HttpRequest) -> Result<(), Denied> {
        let Some(admin) = &self.admin else { return Ok(()) };
        let key = bearer(req).ok_or(Denied::Missing)?;
        if matches_any(key, std::slice::from_ref(admin)) { Ok(()) } else { Err(Denied::Wrong) }
    }
}

/// Whether a request's Origin is allowed (no Origin header: not a browser, allowed).
pub fn origin_allowed(req: &HttpRequest, allowed: &[String]) -> bool {
    if allowed.is_empty() {
        return true;
    }
    match req.headers().get(header::ORIGIN).and_then(|o| o.to_str().ok()) {
        None => true,
        Some(origin) => allowed.iter().any(|a| a.eq_ignore_ascii_case(origin)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::test::TestRequest;

    #[test]
    fn api_keys() {
        let keys = Keys::new(vec!["alpha".into(), "beta".into()], None);
        assert_eq!(keys.check_api([None, Some("beta")]), Ok(()));
        assert_eq!(keys.check_api([Some("gamma")]), Err(Denied::Wrong));
        assert_eq!(keys.check_api([Some("alph")]), Err(Denied::Wrong));
        assert_eq!(keys.check_api([None, None]), Err(Denied::Missing));
        assert_eq!(Keys::default().check_api([None]), Ok(()), "no keys configured: open");
    }

    #[test]
    fn admin_key_from_bearer() {
        let keys = Keys::new(vec![], Some("root".into()));
        let req = TestRequest::default().insert_header(("Authorization", "Bearer root")).to_http_request();
        assert_eq!(keys.check_admin(&req), Ok(()));
        let req = TestRequest::default().insert_header(("Authorization", "bearer nope")).to_http_request();
        assert_eq!(keys.check_admin(&req), Err(Denied::Wrong));
        assert_eq!(keys.check_admin(&TestRequest::default().to_http_request()), Err(Denied::Missing));
    }

    #[test]
    fn origins() {
        let allowed = vec!["https://app.example".to_string()];
        let req = |o: &str| TestRequest::default().insert_header(("Origin", o)).to_http_request();
        assert!(origin_allowed(&req("https://app.example"), &allowed));
        assert!(!origin_allowed(&req("https://evil.example"), &allowed));
        assert!(origin_allowed(&TestRequest::default().to_http_request(), &allowed));
        assert!(origin_allowed(&req("https://evil.example"), &[]));
    }
}
