//! `[recording]` and `[usage]`: what is kept of sessions, and where.

use std::path::PathBuf;

use serde::Deserialize;

use omni_actors::settings::{Base, Invalid, not_negative, positive};

/// `[recording]`: every session recorded under `dir/YYYY-MM-DD/SESSION_ID/`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RecordingConfig {
    pub enabled: bool,
    pub dir: PathBuf,
    /// Recordings older than this are deleted (0 = keep all).
    pub retention_days: f64,
    /// Beyond this total size the oldest recordings are deleted (0 = no cap).
    pub max_total_gb: f64,
    /// How often the retention sweep runs.
    pub sweep_interval_s: f64,
    /// Data a session may have queued for its recorder (or hold before it has an id)
    /// before records are dropped.
    pub max_lag_mb: f64,
    /// Data all sessions together may have queued for recorders.
    pub max_total_lag_mb: f64,
    /// The most one session's recording takes; past it the recording is truncated.
    pub max_session_mb: f64,
    /// The most one session records per second, on average over four seconds; past it
    /// records are dropped (0 = no limit).
    pub max_rate_mb_s: f64,
    /// Nothing is recorded while the recordings' disk has less free than this (0 = no floor).
    pub min_free_gb: f64,
}

impl Default for RecordingConfig {
    fn default() -> Self {
        RecordingConfig {
            enabled: false,
            dir: PathBuf::from("recordings"),
            retention_days: 0.0,
            max_total_gb: 0.0,
            sweep_interval_s: 3600.0,
            max_lag_mb: 64.0,
            max_total_lag_mb: 256.0,
            max_session_mb: 1024.0,
            max_rate_mb_s: 4.0,
            min_free_gb: 2.0,
        }
    }
}

impl RecordingConfig {
    /// Checks the section; the result has `dir` resolved.
    pub fn validate(&self, base: Base<'_>) -> Result<RecordingConfig, Invalid> {
        positive("sweep_interval_s", self.sweep_interval_s)?;
        positive("max_lag_mb", self.max_lag_mb)?;
        positive("max_total_lag_mb", self.max_total_lag_mb)?;
        positive("max_session_mb", self.max_session_mb)?;
        not_negative("retention_days", self.retention_days)?;
        not_negative("max_total_gb", self.max_total_gb)?;
        not_negative("max_rate_mb_s", self.max_rate_mb_s)?;
        not_negative("min_free_gb", self.min_free_gb)?;
        Ok(RecordingConfig { dir: base.resolve(&self.dir), ..self.clone() })
    }
}

/// `[usage]`: usage accounting per API key and mode (off by default).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct UsageConfig {
    pub enabled: bool,
    /// Where the day files (`YYYY-MM-DD.jsonl`) go; relative to the config file.
    pub dir: PathBuf,
}

impl Default for UsageConfig {
    fn default() -> Self {
        UsageConfig { enabled: false, dir: PathBuf::from("usage") }
    }
}

impl UsageConfig {
    /// The day files' directory, resolved, when usage accounting is on.
    pub fn validate(&self, base: Base<'_>) -> Option<PathBuf> {
        self.enabled.then(|| base.resolve(&self.dir))
    }
}
