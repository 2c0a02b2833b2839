//! `[telnyx]`: what proves a media stream comes from Telnyx. Telnyx does not sign its streams;
//! the call's `stream_auth_token` (a secret the app sets when it starts the stream) arrives as
//! the upgrade's `x-telnyx-streaming-auth-token` header. With `auth_token_file` set (a file
//! holding that token), a stream that presents it needs no API key in its URL; one that presents
//! a wrong one is refused.

use std::path::Path;

use omni_actors::settings::{Base, Invalid, check_key};
use serde::Deserialize;

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TelnyxConfig {
    /// A file holding the streams' `stream_auth_token`; "": streams need an API key.
    pub auth_token_file: String,
}

/// `[telnyx]` resolved. The token is never printed.
#[derive(Clone, PartialEq, Default)]
pub struct TelnyxSpec {
    pub auth_token: Option<String>,
}

impl std::fmt::Debug for TelnyxSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TelnyxSpec").field("auth_token", &self.auth_token.as_ref().map(|_| "<redacted>")).finish()
    }
}

impl TelnyxConfig {
    pub fn validate(&self, base: Base<'_>) -> Result<TelnyxSpec, Invalid> {
        let auth_token = match self.auth_token_file.as_str() {
            "" => None,
            file => {
                let path = base.resolve(Path::new(file));
                let token = std::fs::read_to_string(&path)
                    .map_err(|e| Invalid::new("auth_token_file", format!("{}: {e}", path.display())))?
                    .trim()
                    .to_string();
                check_key(&token).map_err(|e| Invalid::new("auth_token_file", format!("{}: {e}", path.display())))?;
                Some(token)
            }
        };
        Ok(TelnyxSpec { auth_token })
    }
}
