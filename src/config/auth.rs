//! `[auth]`: the keys of the realtime endpoint and of the operator routes.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::check::{Base, Invalid, secret};
use crate::http::auth::KeyError;

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
pub struct Checked {
    /// `api_keys` and the keys of the file.
    pub api_keys: Vec<String>,
    /// The file, resolved: read again on SIGHUP.
    pub api_keys_file: Option<PathBuf>,
    pub admin_key: Option<String>,
}

impl AuthConfig {
    pub fn validate(&self, base: Base<'_>) -> Result<Checked, Invalid> {
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
        Ok(Checked { api_keys, api_keys_file, admin_key })
    }
}

/// The keys of a keys file (see [`crate::http::auth::parse_keys_file`]); errors name the file
/// and line.
pub fn read_keys_file(file: &Path) -> Result<Vec<String>, KeyError> {
    let text = std::fs::read_to_string(file)
        .map_err(|e| KeyError::Unreadable { file: file.to_path_buf(), why: e.to_string() })?;
    crate::http::auth::parse_keys_file(&text)
        .map_err(|e| KeyError::InFile { file: file.to_path_buf(), error: Box::new(e) })
}
