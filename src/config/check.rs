//! What every section's checks share: the error they give ([`Invalid`]: a key and why), value
//! rules, paths resolved against the config file's directory, and addresses.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// A value that is not as it must be: its key (within the section that found it) and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key}: {why}")]
pub struct Invalid {
    pub key: String,
    pub why: String,
}

impl Invalid {
    pub fn new(key: impl Into<String>, why: impl Into<String>) -> Invalid {
        Invalid { key: key.into(), why: why.into() }
    }

    /// The same, its key within `section` (`server` and `bind` make `server.bind`).
    pub fn under(self, section: &str) -> Invalid {
        let key = if self.key.is_empty() { section.to_string() } else { format!("{section}.{}", self.key) };
        Invalid { key, why: self.why }
    }
}

pub(crate) fn positive(key: &str, v: f64) -> Result<(), Invalid> {
    if v > 0.0 && v.is_finite() { Ok(()) } else { Err(Invalid::new(key, "must be greater than 0")) }
}

pub(crate) fn not_negative(key: &str, v: f64) -> Result<(), Invalid> {
    if v >= 0.0 && v.is_finite() { Ok(()) } else { Err(Invalid::new(key, "must not be negative")) }
}

/// A name that appears in logs, status and keys: letters, digits, `_`, `.` and `-`.
pub(crate) fn name_ok(name: &str) -> bool {
    !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c))
}

pub(crate) fn check_name(key: &str, name: &str) -> Result<(), Invalid> {
    if name_ok(name) {
        return Ok(());
    }
    Err(Invalid::new(key, format!("'{name}' must be non-empty and use only letters, digits, '_', '.' and '-'")))
}

/// Resolves relative paths against the config file's directory (made absolute), so that the
/// path checked here is the path loaded later (never a bare name a loader would look up on its
/// own search path).
#[derive(Debug, Clone, Copy)]
pub struct Base<'a>(pub &'a Path);

impl Base<'_> {
    pub fn resolve(&self, p: &Path) -> PathBuf {
        if p.is_absolute() { p.to_path_buf() } else { self.0.join(p) }
    }

    /// A file that must exist.
    pub fn file(&self, key: &str, p: &str) -> Result<PathBuf, Invalid> {
        let path = self.resolve(Path::new(p));
        if !path.is_file() {
            return Err(Invalid::new(key, format!("no such file: {}", path.display())));
        }
        Ok(path)
    }

    /// A certificate and its key (`tls.cert`, `tls.key` within the section named `section` in
    /// the messages), both or neither.
    pub fn tls_pair(&self, section: &str, cert: &str, key: &str) -> Result<Option<(PathBuf, PathBuf)>, Invalid> {
        match (cert, key) {
            ("", "") => Ok(None),
            ("", _) => Err(Invalid::new("tls.cert", format!("required with {section}.tls.key"))),
            (_, "") => Err(Invalid::new("tls.key", format!("required with {section}.tls.cert"))),
            (cert, key) => Ok(Some((self.file("tls.cert", cert)?, self.file("tls.key", key)?))),
        }
    }
}

/// `HOST:PORT` with an IP address or a host name that resolves (the address to listen on).
pub(crate) fn resolve_bind(key: &str, bind: &str) -> Result<Vec<SocketAddr>, Invalid> {
    use std::net::ToSocketAddrs;
    if let Ok(addr) = bind.parse::<SocketAddr>() {
        return Ok(vec![addr]);
    }
    let bad = |why: String| Invalid::new(key, why);
    let Some((host, port)) = bind.rsplit_once(':') else {
        return Err(bad(format!("'{bind}' is not HOST:PORT (e.g. 127.0.0.1:8006 or localhost:8006)")));
    };
    let Ok(port) = port.parse::<u16>() else {
        return Err(bad(format!("'{bind}': '{port}' is not a port number")));
    };
    let addrs = (host, port).to_socket_addrs().map_err(|e| bad(format!("'{bind}': cannot resolve '{host}': {e}")))?;
    let mut unique = Vec::new();
    for a in addrs {
        if !unique.contains(&a) {
            unique.push(a);
        }
    }
    if unique.is_empty() {
        return Err(bad(format!("'{bind}': '{host}' resolves to no address")));
    }
    Ok(unique)
}

/// `HOST:PORT` split, for addresses resolved when they are used (a node may be down, or its
/// name not resolvable yet, when the gateway starts).
pub(crate) fn host_port(key: &str, address: &str) -> Result<(String, u16), Invalid> {
    let bad = |why: String| Invalid::new(key, why);
    let (host, port) =
        address.rsplit_once(':').ok_or_else(|| bad(format!("'{address}' is not HOST:PORT (e.g. gpu1:7100)")))?;
    let port = port.parse::<u16>().map_err(|_| bad(format!("'{address}': '{port}' is not a port number")))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        return Err(bad(format!("'{address}' has no host")));
    }
    Ok((host.to_string(), port))
}

/// A key a peer presents (an API key, a token, a webhook secret): see
/// [`crate::http::auth::check_key`].
pub(crate) fn secret(key: &str, value: &str) -> Result<(), Invalid> {
    crate::http::auth::check_key(value).map_err(|e| Invalid::new(key, e.to_string()))
}

/// A node token (a node's `[node] token`, a gateway's `[[nodes]] token`, the cluster's) is at
/// least this long.
pub(crate) const MIN_TOKEN_BYTES: usize = 32;
/// ...and zxcvbn must estimate it takes at least 10^this guesses: its ceiling (it counts in a
/// u64), which a random string of 32 bytes or more reaches, and repeats, sequences and common
/// words do not. (It cannot tell a long passphrase from a random string: the hint says how to
/// make the latter.)
const MIN_TOKEN_GUESSES_LOG10: f64 = 19.0;
/// How to make a good one, for the error.
const TOKEN_HINT: &str = "make one with `openssl rand -base64 32`";

/// A token two parts prove to each other (a node and its gateways, the replicas of a cluster):
/// long and random, as a proof of it can be tried offline against guesses.
pub(crate) fn node_token(key: &str, value: &str) -> Result<(), Invalid> {
    secret(key, value)?;
    if value.len() < MIN_TOKEN_BYTES {
        let why = format!(
            "a node token must be at least {MIN_TOKEN_BYTES} bytes (this one has {}): {TOKEN_HINT}",
            value.len()
        );
        return Err(Invalid::new(key, why));
    }
    let lower = value.to_ascii_lowercase();
    if ["change-me", "changeme", "change_me", "placeholder", "replace-me", "example"].iter().any(|p| lower.contains(p))
    {
        return Err(Invalid::new(key, format!("is a placeholder, not a secret: {TOKEN_HINT}")));
    }
    let guesses = zxcvbn::zxcvbn(value, &[]).guesses_log10();
    if guesses < MIN_TOKEN_GUESSES_LOG10 {
        let why = format!("is guessable (words, sequences or repeats: about 10^{guesses:.0} guesses): {TOKEN_HINT}");
        return Err(Invalid::new(key, why));
    }
    Ok(())
}

/// A URL as logs show it: its scheme and host, its user part as `***@` and anything after the
/// host as `/***` (a password, a token in the path or query).
pub(crate) fn redacted_url(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let (user, host) = match authority.rsplit_once('@') {
        Some((_, host)) => ("***@", host),
        None => ("", authority),
    };
    let after = if rest.len() > authority.len() { "/***" } else { "" };
    format!("{scheme}://{user}{host}{after}")
}

/// One network, `ADDRESS/BITS` (`"10.0.0.0/8"`), or one address (all its bits).
pub(crate) fn network(key: &str, entry: &str) -> Result<ipnet::IpNet, Invalid> {
    let entry = entry.trim();
    entry
        .parse::<ipnet::IpNet>()
        .or_else(|_| entry.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
        .map_err(|_| Invalid::new(key, format!("'{entry}' is neither ADDRESS/BITS (\"10.0.0.0/8\") nor an address")))
}

#[cfg(test)]
mod token_tests {
    use super::node_token;

    #[test]
    fn a_node_token_is_long_random_and_no_placeholder() {
        for (token, why) in [
            ("node-token-0123456789abcdef", "at least 32 bytes"),
            ("change-me-node-token-0123456789", "at least 32 bytes"),
            ("change-me-to-a-long-node-token-Xq7pL2vR9", "placeholder"),
            ("passwordpasswordpasswordpassword12", "guessable"),
            ("aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "guessable"),
            ("0123456789012345678901234567890123456789", "guessable"),
        ] {
            let e = node_token("token", token).expect_err(token);
            assert!(e.to_string().contains(why), "{token}: {e}");
            assert!(e.to_string().contains("openssl rand"), "the way to a good one: {e}");
        }
        for token in [
            "q3V8r7lWm0Jx2d9Kp4TzY6bN1cHs5fGa8uE0iO2wRkM=",
            "9f2c4a7e1b8d3f6a0c5e9b2d7f4a1c8e3b6d0f9a2c5e8b1d4f7a0c3e6b9d2f5a",
        ] {
            node_token("token", token).unwrap_or_else(|e| panic!("{token}: {e}"));
        }
    }
}
