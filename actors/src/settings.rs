//! What every component's settings check with: the error a check gives ([`Invalid`]: a key and
//! why), value rules, paths resolved against the config file's directory, addresses, networks and
//! secrets. Each component (a transport, a dialect, a backend) owns its section of
//! `config.toml` and checks it with these; the server puts the sections together.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// A value that is not as it must be: its key (within the section that found it) and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key}: {why}")]
pub struct Invalid {
    /// The key (within the section that found it; [`Invalid::under`] puts it in its section).
    pub key: String,
    /// Why the value is refused.
    pub why: String,
}

impl Invalid {
    /// `key` is refused because `why`.
    pub fn new(key: impl Into<String>, why: impl Into<String>) -> Invalid {
        Invalid { key: key.into(), why: why.into() }
    }

    /// The same, its key within `section` (`server` and `bind` make `server.bind`).
    pub fn under(self, section: &str) -> Invalid {
        let key = if self.key.is_empty() { section.to_string() } else { format!("{section}.{}", self.key) };
        Invalid { key, why: self.why }
    }
}

/// A number greater than 0.
pub fn positive(key: &str, v: f64) -> Result<(), Invalid> {
    if v > 0.0 && v.is_finite() { Ok(()) } else { Err(Invalid::new(key, "must be greater than 0")) }
}

/// A number of at least 0.
pub fn not_negative(key: &str, v: f64) -> Result<(), Invalid> {
    if v >= 0.0 && v.is_finite() { Ok(()) } else { Err(Invalid::new(key, "must not be negative")) }
}

/// A name that appears in logs, status and keys: letters, digits, `_`, `.` and `-`.
pub fn name_ok(name: &str) -> bool {
    !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c))
}

/// A name as [`name_ok`] has it.
pub fn check_name(key: &str, name: &str) -> Result<(), Invalid> {
    if name_ok(name) {
        return Ok(());
    }
    Err(Invalid::new(key, format!("'{name}' must be non-empty and use only letters, digits, '_', '.' and '-'")))
}

/// Resolves relative paths against the config file's directory (made absolute), so that the
/// path checked here is the path loaded later (never a bare name a loader would look up on its
/// own search path).
#[derive(Debug, Clone, Copy)]
pub struct Base<'a>(
    /// The config file's directory.
    pub &'a Path,
);

impl Base<'_> {
    /// `p`, against the config file's directory when relative.
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
pub fn resolve_bind(key: &str, bind: &str) -> Result<Vec<SocketAddr>, Invalid> {
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
pub fn host_port(key: &str, address: &str) -> Result<(String, u16), Invalid> {
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

/// A secret a peer presents (an API key, a token, a webhook secret) is at least this long.
pub const MIN_KEY_BYTES: usize = 16;

/// Why a secret's shape is refused. Never contains the secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    /// It has whitespace in it.
    #[error("a key must not contain spaces")]
    Spaces,
    /// It is shorter than [`MIN_KEY_BYTES`]: its length.
    #[error("a key must be at least {MIN_KEY_BYTES} bytes (this one has {0})")]
    Short(usize),
}

/// Checks one secret's shape; the error never contains it.
pub fn check_key(key: &str) -> Result<(), SecretError> {
    if key.chars().any(char::is_whitespace) {
        return Err(SecretError::Spaces);
    }
    if key.len() < MIN_KEY_BYTES {
        return Err(SecretError::Short(key.len()));
    }
    Ok(())
}

/// A secret a peer presents (an API key, a token, a webhook secret), as a setting: [`check_key`].
pub fn secret(key: &str, value: &str) -> Result<(), Invalid> {
    check_key(value).map_err(|e| Invalid::new(key, e.to_string()))
}

/// A URL as logs show it: its scheme and host, its user part as `***@` and anything after the
/// host as `/***` (a password, a token in the path or query).
pub fn redacted_url(url: &str) -> String {
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
pub fn network(key: &str, entry: &str) -> Result<ipnet::IpNet, Invalid> {
    let entry = entry.trim();
    entry
        .parse::<ipnet::IpNet>()
        .or_else(|_| entry.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
        .map_err(|_| Invalid::new(key, format!("'{entry}' is neither ADDRESS/BITS (\"10.0.0.0/8\") nor an address")))
}
