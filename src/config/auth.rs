//! `[auth]`: the keys of the realtime endpoint and of the operator routes.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use omni_actors::settings::{Base, Invalid, secret};

/// `[auth]`: keys for the realtime endpoint and for the admin routes.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    pub api_keys: Vec<String>,
    /// A file with more keys, one per line (`#` starts a comment).
    pub api_keys_file: String,
    pub admin_key: String,
}

/// What `[auth]` settles.
pub struct AuthChecked {
    /// `api_keys` and the keys of the file.
    pub api_keys: Vec<String>,
    /// The file, resolved: read again on SIGHUP.
    pub api_keys_file: Option<PathBuf>,
    pub admin_key: Option<String>,
}

impl AuthConfig {
    pub fn validate(&self, base: Base<'_>) -> Result<AuthChecked, Invalid> {
        for (i, key) in self.api_keys.iter().enumerate() {
            secret(&format!("api_keys[{i}]"), key)?;
        }
        let api_keys_file = (!self.api_keys_file.is_empty()).then(|| base.resolve(Path::new(&self.api_keys_file)));
        let mut api_keys = self.api_keys.clone();
        if let Some(file) = &api_keys_file {
            api_keys.extend(read_keys_file(file).map_err(|e| Invalid::new("api_keys_file", e.to_string()))?);
        }
        let admin = &self.admin_key;
        if admin.trim() != admin {
            return Err(Invalid::new("admin_key", "has spaces around it: remove them"));
        }
        if !admin.is_empty() {
            secret("admin_key", admin)?;
        }
        let admin_key = (!admin.is_empty()).then(|| admin.clone());
        Ok(AuthChecked { api_keys, api_keys_file, admin_key })
    }
}

/// The keys of a keys file (see [`parse_keys_file`]); errors name the file
/// and line.
pub fn read_keys_file(file: &Path) -> Result<Vec<String>, KeyError> {
    let text = std::fs::read_to_string(file)
        .map_err(|e| KeyError::Unreadable { file: file.to_path_buf(), why: e.to_string() })?;
    parse_keys_file(&text).map_err(|e| KeyError::InFile { file: file.to_path_buf(), error: Box::new(e) })
}

/// Why a key (or a keys file) is refused. Never contains the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error(transparent)]
    Shape(#[from] omni_actors::settings::SecretError),
    #[error("line {0}: {1}")]
    Line(usize, Box<KeyError>),
    #[error("cannot read {}: {why}", file.display())]
    Unreadable { file: std::path::PathBuf, why: String },
    #[error("{}: {error}", file.display())]
    InFile { file: std::path::PathBuf, error: Box<KeyError> },
}

/// Reads a keys file: one key per line; a line starting with `#` is a comment (a `#`
/// anywhere else is part of the key); keys must be at least [`omni_actors::settings::MIN_KEY_BYTES`] long and
/// without spaces. Errors name the line, never the key.
pub fn parse_keys_file(text: &str) -> Result<Vec<String>, KeyError> {
    let mut keys = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let key = line.trim();
        if key.is_empty() || key.starts_with('#') {
            continue;
        }
        omni_actors::settings::check_key(key).map_err(|e| KeyError::Line(i + 1, Box::new(e.into())))?;
        keys.push(key.to_string());
    }
    Ok(keys)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_files_keep_hashes_inside_keys_and_refuse_short_ones() {
        let keys = parse_keys_file("# team keys\nZq#9f8a7b6c5d4e3f2a1\n\n  second-key-0123456789  \n").unwrap();
        assert_eq!(keys, ["Zq#9f8a7b6c5d4e3f2a1", "second-key-0123456789"]);
        assert_eq!(
            parse_keys_file("k2\n").unwrap_err().to_string(),
            "line 1: a key must be at least 16 bytes (this one has 2)"
        );
        assert_eq!(
            parse_keys_file("# c\nsecond-key-0123456789 # ops\n").unwrap_err().to_string(),
            "line 2: a key must not contain spaces"
        );
    }
}
