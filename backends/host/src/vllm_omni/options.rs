//! A vLLM-Omni slot's `[workers.options]`, checked when the worker opens.

use std::path::PathBuf;
use std::time::Duration;

use omni_actors::edge::backend::BackendError;

const KNOWN: &str =
    "ref_audio, model, decision_wait_ms, connect_timeout_s, reply_timeout_s, close_timeout_s, health_interval_s";

#[derive(Debug, Clone)]
pub(super) struct Options {
    /// The voice prompt (a WAV file, resolved against the config's directory) sent when the
    /// client gives none: MiniCPM-o needs one to speak.
    pub ref_audio: Option<PathBuf>,
    /// `session.model`, when the server serves more than one name.
    pub model: Option<String>,
    /// The longest a step waits for its unit's decision before handing on what it has (the rest
    /// comes with the next step): see the module's documentation.
    pub decision_wait: Duration,
    pub connect_timeout: Duration,
    /// The longest `session.created` may take after the session's settings are sent, and a send
    /// may block: under the step watchdog (`limits.step_timeout_ms`, 15 s), which ends a slower
    /// call by failing the worker.
    pub reply_timeout: Duration,
    /// The longest `session.closed` may take after `session.close`.
    pub close_timeout: Duration,
    /// How often an idle slot asks its server's `/health` (the slots of a server share the answer).
    pub health_interval: Duration,
}

impl Options {
    pub(super) fn parse(options: &[(String, String)]) -> Result<Options, BackendError> {
        let mut o = Options {
            ref_audio: None,
            model: None,
            decision_wait: Duration::from_millis(500),
            connect_timeout: Duration::from_secs(5),
            reply_timeout: Duration::from_secs(10),
            close_timeout: Duration::from_secs(5),
            health_interval: Duration::from_secs(10),
        };
        for (k, v) in options {
            let number = || {
                v.parse::<f64>()
                    .ok()
                    .filter(|n| *n > 0.0 && n.is_finite() && *n < 1e9)
                    .ok_or_else(|| BackendError::Open(format!("option {k}: '{v}' is not a positive number")))
            };
            match k.as_str() {
                "ref_audio" => o.ref_audio = Some(PathBuf::from(v)),
                "model" => o.model = Some(v.clone()),
                "decision_wait_ms" => {
                    let ms = number()?;
                    if ms > 1000.0 {
                        let why = format!("option {k}: {v} ms is more than a unit (1000 ms): input would stall");
                        return Err(BackendError::Open(why));
                    }
                    o.decision_wait = Duration::from_secs_f64(ms / 1000.0);
                }
                "connect_timeout_s" => o.connect_timeout = Duration::from_secs_f64(number()?),
                "reply_timeout_s" => o.reply_timeout = Duration::from_secs_f64(number()?),
                "close_timeout_s" => o.close_timeout = Duration::from_secs_f64(number()?),
                "health_interval_s" => o.health_interval = Duration::from_secs_f64(number()?),
                _ => return Err(BackendError::Open(format!("unknown option '{k}' for vllm-omni (known: {KNOWN})"))),
            }
        }
        Ok(o)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(pairs: &[(&str, &str)]) -> Result<Options, BackendError> {
        Options::parse(&pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<Vec<_>>())
    }

    #[test]
    fn options_are_checked_and_named() {
        let o = opts(&[("decision_wait_ms", "250"), ("model", "openbmb/MiniCPM-o-4_5")]).unwrap();
        assert_eq!(o.decision_wait, Duration::from_millis(250));
        assert_eq!(o.model.as_deref(), Some("openbmb/MiniCPM-o-4_5"));
        let e = opts(&[("decision_wait_ms", "1500")]).unwrap_err().to_string();
        assert!(e.contains("more than a unit"), "{e}");
        let e = opts(&[("temperature", "0.5")]).unwrap_err().to_string();
        assert!(e.contains("unknown option 'temperature' for vllm-omni"), "{e}");
        assert!(opts(&[("reply_timeout_s", "-1")]).is_err());
    }
}
