//! `[[webhooks]]`: where session and worker events are posted, signed.

use std::time::Duration;

use serde::Deserialize;

use omni_actors::settings::{Base, Invalid, check_name, positive, secret};

/// One `[[webhooks]]` entry.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct WebhookEntry {
    #[serde(default)]
    pub name: Option<String>,
    pub url: String,
    pub events: Vec<String>,
    /// Signs every delivery (HMAC-SHA256); 16 bytes or more. Or `secret_file`: a file holding it.
    #[serde(default)]
    pub secret: String,
    #[serde(default)]
    pub secret_file: String,
    #[serde(default = "default_webhook_timeout")]
    pub timeout_s: f64,
    #[serde(default = "default_webhook_attempts")]
    pub max_attempts: u32,
    /// The first retry waits this long, each next one twice as long.
    #[serde(default = "default_webhook_retry")]
    pub retry_base_s: f64,
    /// Deliveries waiting to be sent; beyond it they are dropped (and counted).
    #[serde(default = "default_webhook_queue")]
    pub queue_size: usize,
    /// How a delivery is written and signed: `"omni"` (this gateway's own) or `"openai"`
    /// (OpenAI's webhooks: the Standard Webhooks headers, which the openai SDKs'
    /// `webhooks.unwrap` checks).
    #[serde(default)]
    pub format: WebhookFormat,
}

/// How a webhook's deliveries are written and signed.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum WebhookFormat {
    /// `{"event", "delivery", "at", "data"}`, signed in `X-Omni-Signature`.
    #[default]
    Omni,
    /// `{"object": "event", "id", "type", "created_at", "data"}`, signed in `webhook-id`,
    /// `webhook-timestamp` and `webhook-signature` (`v1,` base64 of HMAC-SHA256 of
    /// `ID.TIMESTAMP.BODY`, under the secret's bytes after `whsec_`, base64-decoded).
    Openai,
}

fn default_webhook_timeout() -> f64 {
    5.0
}
fn default_webhook_attempts() -> u32 {
    5
}
fn default_webhook_retry() -> f64 {
    0.5
}
fn default_webhook_queue() -> usize {
    1000
}

/// A `[[webhooks]]` entry, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct WebhookSpec {
    pub name: String,
    pub url: String,
    pub events: Vec<String>,
    pub secret: String,
    pub timeout: Duration,
    pub max_attempts: u32,
    pub retry_base: Duration,
    pub queue_size: usize,
    pub format: WebhookFormat,
}

impl WebhookSpec {
    /// The URL as logs show it: scheme, host and port only (its path, query and any user
    /// part are often the secret).
    pub fn redacted_url(&self) -> String {
        omni_actors::settings::redacted_url(&self.url)
    }
}

/// Every entry checked; names are unique. Errors name `webhooks[i].KEY`.
pub(crate) fn validate(entries: &[WebhookEntry], base: Base<'_>) -> Result<Vec<WebhookSpec>, Invalid> {
    let mut webhooks: Vec<WebhookSpec> = Vec::new();
    for (i, w) in entries.iter().enumerate() {
        let spec = w.validate(i, base).map_err(|e| e.under(&format!("webhooks[{i}]")))?;
        if webhooks.iter().any(|other| other.name == spec.name) {
            return Err(Invalid::new(format!("webhooks[{i}].name"), format!("'{}' names two webhooks", spec.name)));
        }
        webhooks.push(spec);
    }
    Ok(webhooks)
}

impl WebhookEntry {
    pub fn validate(&self, i: usize, base: Base<'_>) -> Result<WebhookSpec, Invalid> {
        let name = self.name.clone().unwrap_or_else(|| format!("webhook{i}"));
        check_name("name", &name)?;
        if !(self.url.starts_with("http://") || self.url.starts_with("https://")) {
            // Not echoed: a webhook's URL often is its secret.
            return Err(Invalid::new("url", "must start with http:// or https://"));
        }
        let known = super::EVENTS;
        if self.events.is_empty() {
            return Err(Invalid::new("events", format!("name at least one of {}", known.join(", "))));
        }
        for (j, e) in self.events.iter().enumerate() {
            if !known.contains(&e.as_str()) {
                return Err(Invalid::new(format!("events[{j}]"), format!("'{e}' is not one of {}", known.join(", "))));
            }
        }
        let (key, value) = match (self.secret.as_str(), self.secret_file.as_str()) {
            (s, "") => ("secret", s.to_string()),
            ("", file) => {
                let path = base.resolve(std::path::Path::new(file));
                let text = std::fs::read_to_string(&path)
                    .map_err(|e| Invalid::new("secret_file", format!("{}: {e}", path.display())))?;
                ("secret_file", text.trim().to_string())
            }
            _ => return Err(Invalid::new("secret", "set secret or secret_file, not both")),
        };
        secret(key, &value)?;
        if self.format == WebhookFormat::Openai {
            use base64::Engine;
            let key = value.strip_prefix("whsec_").ok_or_else(|| {
                Invalid::new(
                    "secret",
                    "an \"openai\" webhook's secret is whsec_ and base64 (as OpenAI's webhooks' are)",
                )
            })?;
            if base64::engine::general_purpose::STANDARD.decode(key).map_or(true, |k| k.len() < 16) {
                return Err(Invalid::new("secret", "after whsec_ must come base64 of 16 bytes or more"));
            }
        }
        positive("timeout_s", self.timeout_s)?;
        positive("retry_base_s", self.retry_base_s)?;
        if self.max_attempts == 0 {
            return Err(Invalid::new("max_attempts", "must be at least 1"));
        }
        if self.queue_size == 0 {
            return Err(Invalid::new("queue_size", "must be at least 1"));
        }
        Ok(WebhookSpec {
            name,
            url: self.url.clone(),
            events: self.events.clone(),
            secret: value,
            timeout: Duration::from_secs_f64(self.timeout_s),
            max_attempts: self.max_attempts,
            retry_base: Duration::from_secs_f64(self.retry_base_s),
            queue_size: self.queue_size,
            format: self.format,
        })
    }
}
