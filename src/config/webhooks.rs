//! `[[webhooks]]`: where session and worker events are posted, signed.

use std::time::Duration;

use serde::Deserialize;

use super::check::{Invalid, check_name, positive, secret};

/// One `[[webhooks]]` entry.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct WebhookEntry {
    #[serde(default)]
    pub name: Option<String>,
    pub url: String,
    pub events: Vec<String>,
    /// Signs every delivery (HMAC-SHA256); 16 bytes or more.
    pub secret: String,
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
}

impl WebhookSpec {
    /// The URL as logs show it: scheme, host and port only (its path, query and any user
    /// part are often the secret).
    pub fn redacted_url(&self) -> String {
        super::check::redacted_url(&self.url)
    }
}

/// Every entry checked; names are unique. Errors name `webhooks[i].KEY`.
pub(super) fn validate(entries: &[WebhookEntry]) -> Result<Vec<WebhookSpec>, Invalid> {
    let mut webhooks: Vec<WebhookSpec> = Vec::new();
    for (i, w) in entries.iter().enumerate() {
        let spec = w.validate(i).map_err(|e| e.under(&format!("webhooks[{i}]")))?;
        if webhooks.iter().any(|other| other.name == spec.name) {
            return Err(Invalid::new(format!("webhooks[{i}].name"), format!("'{}' names two webhooks", spec.name)));
        }
        webhooks.push(spec);
    }
    Ok(webhooks)
}

impl WebhookEntry {
    pub fn validate(&self, i: usize) -> Result<WebhookSpec, Invalid> {
        let name = self.name.clone().unwrap_or_else(|| format!("webhook{i}"));
        check_name("name", &name)?;
        if !(self.url.starts_with("http://") || self.url.starts_with("https://")) {
            // Not echoed: a webhook's URL often is its secret.
            return Err(Invalid::new("url", "must start with http:// or https://"));
        }
        let known = crate::observe::webhooks::EVENTS;
        if self.events.is_empty() {
            return Err(Invalid::new("events", format!("name at least one of {}", known.join(", "))));
        }
        for (j, e) in self.events.iter().enumerate() {
            if !known.contains(&e.as_str()) {
                return Err(Invalid::new(format!("events[{j}]"), format!("'{e}' is not one of {}", known.join(", "))));
            }
        }
        secret("secret", &self.secret)?;
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
            secret: self.secret.clone(),
            timeout: Duration::from_secs_f64(self.timeout_s),
            max_attempts: self.max_attempts,
            retry_base: Duration::from_secs_f64(self.retry_base_s),
            queue_size: self.queue_size,
        })
    }
}
