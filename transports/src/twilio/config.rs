//! `[twilio]`: what proves a Media Stream comes from Twilio. With `auth_token_file` set (a file
//! holding the account's auth token), every stream's upgrade must carry a valid
//! `X-Twilio-Signature` (HMAC-SHA1 of the stream's URL with the token), and one that does needs
//! no API key in its URL. `public_url` is the scheme and host the TwiML names
//! (`wss://gateway.example.com`): Twilio signs the URL it connected to, which a proxy in front
//! may change.

use std::path::Path;

use serde::Deserialize;

use omni_actors::settings::{Base, Invalid};

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TwilioConfig {
    /// A file holding the Twilio account's auth token; "": streams are not signed-checked.
    pub auth_token_file: String,
    /// The scheme and host Twilio connects to (`wss://gateway.example.com`); "": the request's
    /// own (`ws`/`wss` and its Host header).
    pub public_url: String,
}

/// `[twilio]` resolved. The token is never printed.
#[derive(Clone, PartialEq, Default)]
pub struct TwilioSpec {
    pub auth_token: Option<String>,
    pub public_url: Option<String>,
}

impl std::fmt::Debug for TwilioSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TwilioSpec")
            .field("auth_token", &self.auth_token.as_ref().map(|_| "<redacted>"))
            .field("public_url", &self.public_url)
            .finish()
    }
}

impl TwilioConfig {
    pub fn validate(&self, base: Base<'_>) -> Result<TwilioSpec, Invalid> {
        let auth_token = match self.auth_token_file.as_str() {
            "" => None,
            file => {
                let path = base.resolve(Path::new(file));
                let token = std::fs::read_to_string(&path)
                    .map_err(|e| Invalid::new("auth_token_file", format!("{}: {e}", path.display())))?
                    .trim()
                    .to_string();
                if token.is_empty() {
                    return Err(Invalid::new("auth_token_file", format!("{} is empty", path.display())));
                }
                Some(token)
            }
        };
        let public_url = match self.public_url.trim_end_matches('/') {
            "" => None,
            url if url.starts_with("wss://") || url.starts_with("ws://") => Some(url.to_string()),
            url => return Err(Invalid::new("public_url", format!("'{url}' is not a ws:// or wss:// URL"))),
        };
        Ok(TwilioSpec { auth_token, public_url })
    }
}
