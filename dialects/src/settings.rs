//! Generation settings by name (`top_p`, `top_k`, `seed`, the duplex listen settings...):
//! the ones the documents name are checked against their ranges, others a model may know
//! are passed on as they are, within size bounds. They reach the backend through the ABI
//! as text ([`Generation::settings`](omni_actors::domain::Generation)); the backend says
//! which it applies, and the dialects tell the client about the rest.

use std::collections::BTreeMap;

use omni_actors::domain::BackendInfo;
use omni_actors::protocol::ProtocolError;
use serde_json::Value;

/// At most this many settings, of names this long and values this long as text: a client
/// cannot make the server hold more than a few kilobytes of them.
pub const MAX_SETTINGS: usize = 32;
pub const MAX_NAME: usize = 64;
pub const MAX_VALUE: usize = 1024;

/// What a documented setting accepts.
#[derive(Debug, Clone, Copy)]
pub enum Rule {
    /// A number in `min..=max`; `open_min` excludes `min`.
    Number {
        min: f64,
        max: f64,
        open_min: bool,
    },
    /// A whole number in `min..=max`.
    Integer {
        min: i64,
        max: i64,
    },
    /// A whole number in `min..=max`, or null (the model's default).
    OptionalInteger {
        min: i64,
        max: i64,
    },
    Bool,
    /// One of these words.
    Choice(&'static [&'static str]),
    /// A JSON object (passed on as compact JSON text).
    Object,
}

impl Rule {
    fn check(&self, v: &Value) -> Result<(), String> {
        match *self {
            Rule::Number { min, max, open_min } => {
                let x = v.as_f64().ok_or("must be a number")?;
                let low_ok = if open_min { x > min } else { x >= min };
                if !low_ok || x > max {
                    let low = if open_min { "above" } else { "at least" };
                    return Err(format!("{x} is out of range ({low} {min}, at most {max})"));
                }
            }
            Rule::Integer { min, max } => {
                let x = v.as_i64().ok_or("must be a whole number")?;
                if x < min || x > max {
                    return Err(format!("{x} is outside {min}..={max}"));
                }
            }
            Rule::OptionalInteger { min, max } => {
                if !v.is_null() {
                    return Rule::Integer { min, max }.check(v).map_err(|e| format!("{e} (or null)"));
                }
            }
            Rule::Bool => {
                v.as_bool().ok_or("must be true or false")?;
            }
            Rule::Choice(words) => {
                let s = v.as_str().ok_or_else(|| format!("must be one of {}", words.join(", ")))?;
                if !words.contains(&s) {
                    return Err(format!("'{s}' is not one of {}", words.join(", ")));
                }
            }
            Rule::Object => {
                v.as_object().ok_or("must be an object")?;
            }
        }
        Ok(())
    }
}

/// The settings one dialect knows: name and rule.
pub type Table = &'static [(&'static str, Rule)];

/// Probabilities and penalties as the MiniCPM-o duplex worker and the Qwen document use them.
const TOP_P: Rule = Rule::Number { min: 0.0, max: 1.0, open_min: true };
const TOP_K: Rule = Rule::Integer { min: 0, max: 1000 };
const PENALTY: Rule = Rule::Number { min: 0.0, max: 10.0, open_min: true };
const TEMPERATURE: Rule = Rule::Number { min: 0.0, max: 2.0, open_min: false };

/// `session.init` `payload.config` (the DuplexConfig of the MiniCPM-o worker), beyond the
/// five fields of the ABI's own (length_penalty, max_new_tokens, temperature,
/// max_slice_nums, force_listen_count).
pub const DUPLEX_CONFIG: Table = &[
    ("decode_mode", Rule::Choice(&["sampling", "greedy"])),
    ("top_k", TOP_K),
    ("top_p", TOP_P),
    ("listen_prob_scale", Rule::Number { min: 0.0, max: 100.0, open_min: true }),
    ("listen_top_k", Rule::OptionalInteger { min: 1, max: 1000 }),
    ("text_repetition_penalty", PENALTY),
    ("text_repetition_window_size", Rule::Integer { min: 1, max: 65536 }),
    ("generate_audio", Rule::Bool),
    ("ls_mode", Rule::Choice(&["explicit", "implicit"])),
    ("max_new_speak_tokens_per_chunk", Rule::Integer { min: 1, max: 1000 }),
    ("tts_temperature", TEMPERATURE),
    ("chunk_ms", Rule::Integer { min: 100, max: 10000 }),
    ("sample_rate", Rule::Integer { min: 16000, max: 16000 }),
];

/// Qwen-Omni-Realtime `session.update` settings beyond temperature and max_tokens.
pub const QWEN_SESSION: Table = &[
    ("top_p", TOP_P),
    ("top_k", TOP_K),
    ("repetition_penalty", PENALTY),
    ("presence_penalty", Rule::Number { min: -2.0, max: 2.0, open_min: false }),
    ("seed", Rule::Integer { min: -1, max: i32::MAX as i64 }),
    ("enable_search", Rule::Bool),
    ("search_options", Rule::Object),
];

/// A temperature, as every dialect accepts it.
pub fn temperature(v: &Value, param: &str) -> Result<f64, ProtocolError> {
    TEMPERATURE.check(v).map_err(|why| invalid(param, why))?;
    Ok(v.as_f64().unwrap_or_default())
}

fn invalid(param: &str, why: impl std::fmt::Display) -> ProtocolError {
    ProtocolError::InvalidPayload(format!("{param}: {why}"))
}

/// Settings as the client gave them, checked: name to JSON value, in name order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Settings(BTreeMap<String, Value>);

impl Settings {
    /// Sets `name` from a client's value: documented settings are checked against `table`;
    /// others are accepted when they are plain values (text, number, true/false) within the
    /// size bounds, for a backend that knows them. `at` prefixes the name in errors.
    pub fn set(&mut self, table: Table, name: &str, v: &Value, at: &str) -> Result<(), ProtocolError> {
        let param = format!("{at}{name}");
        match table.iter().find(|(n, _)| *n == name) {
            Some((_, rule)) => rule.check(v).map_err(|why| invalid(&param, why))?,
            None => {
                if name.is_empty() || name.len() > MAX_NAME {
                    return Err(invalid(&param, format!("a setting name has 1 to {MAX_NAME} bytes")));
                }
                if !matches!(v, Value::String(_) | Value::Number(_) | Value::Bool(_) | Value::Null) {
                    return Err(invalid(&param, "an undocumented setting must be text, a number, true or false"));
                }
            }
        }
        if as_text(v).len() > MAX_VALUE {
            return Err(invalid(&param, format!("longer than {MAX_VALUE} bytes")));
        }
        if !self.0.contains_key(name) && self.0.len() >= MAX_SETTINGS {
            return Err(invalid(&param, format!("at most {MAX_SETTINGS} settings")));
        }
        if v.is_null() {
            self.0.remove(name);
        } else {
            self.0.insert(name.to_string(), v.clone());
        }
        Ok(())
    }

    pub fn get(&self, name: &str) -> Option<&Value> {
        self.0.get(name)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Every setting and its value, as the client gave it (for echoes).
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// The settings that ask the model for something, as the ABI's text pairs. A search
    /// that is switched off and empty search options ask for nothing and are left out.
    pub fn for_backend(&self) -> Vec<(String, String)> {
        self.0.iter().filter(|(k, v)| !neutral(k, v)).map(|(k, v)| (k.clone(), as_text(v))).collect()
    }

    /// The settings that ask for something the backend does not apply.
    pub fn unsupported(&self, backend: &BackendInfo) -> Vec<String> {
        self.0
            .iter()
            .filter(|(k, v)| !neutral(k, v) && !backend.settings.iter().any(|s| s == *k))
            .map(|(k, _)| k.clone())
            .collect()
    }
}

/// A value that asks for nothing: search off, no search options, `seed: -1` (no fixed seed: the
/// backend's own, as Qwen documents it). It is not sent to the backend, nor reported unsupported.
fn neutral(name: &str, v: &Value) -> bool {
    match name {
        "enable_search" => v == &Value::Bool(false),
        "seed" => v.as_i64() == Some(-1),
        "search_options" => v.as_object().is_some_and(|o| o.is_empty()),
        _ => false,
    }
}

/// A value as the ABI carries it: text as it is, anything else as compact JSON.
fn as_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn code(r: Result<(), ProtocolError>) -> String {
        match r {
            Ok(()) => "ok".into(),
            Err(e) => format!("{}: {e}", e.code()),
        }
    }

    #[test]
    fn documented_settings_are_checked() {
        let mut s = Settings::default();
        let at = "payload.config.";
        assert_eq!(code(s.set(DUPLEX_CONFIG, "top_p", &json!(0.8), at)), "ok");
        assert_eq!(
            code(s.set(DUPLEX_CONFIG, "top_p", &json!(0), at)),
            "invalid_payload: payload.config.top_p: 0 is out of range (above 0, at most 1)"
        );
        assert_eq!(
            code(s.set(DUPLEX_CONFIG, "top_k", &json!(2.5), at)),
            "invalid_payload: payload.config.top_k: must be a whole number"
        );
        assert_eq!(
            code(s.set(DUPLEX_CONFIG, "decode_mode", &json!("beam"), at)),
            "invalid_payload: payload.config.decode_mode: 'beam' is not one of sampling, greedy"
        );
        assert_eq!(code(s.set(DUPLEX_CONFIG, "listen_top_k", &json!(null), at)), "ok");
        assert_eq!(code(s.set(QWEN_SESSION, "seed", &json!(-1), "session.")), "ok");
        assert_eq!(
            code(s.set(QWEN_SESSION, "search_options", &json!(true), "session.")),
            "invalid_payload: session.search_options: must be an object"
        );
        assert_eq!(s.get("top_p"), Some(&json!(0.8)));
    }

    #[test]
    fn others_pass_within_bounds() {
        let mut s = Settings::default();
        assert_eq!(code(s.set(DUPLEX_CONFIG, "my_model_knob", &json!(3), "c.")), "ok");
        assert!(code(s.set(DUPLEX_CONFIG, "nested", &json!({"a": 1}), "c.")).contains("must be text"));
        assert!(code(s.set(DUPLEX_CONFIG, "long", &json!("x".repeat(MAX_VALUE + 1)), "c.")).contains("longer than"));
        for i in 0..MAX_SETTINGS - 1 {
            assert_eq!(code(s.set(DUPLEX_CONFIG, &format!("k{i}"), &json!(i), "c.")), "ok");
        }
        assert!(code(s.set(DUPLEX_CONFIG, "one_more", &json!(1), "c.")).contains("at most 32 settings"));
        // Replacing one that is there is fine.
        assert_eq!(code(s.set(DUPLEX_CONFIG, "k0", &json!(9), "c.")), "ok");
    }

    #[test]
    fn the_backend_hears_text_and_unsupported_ones_are_named() {
        let mut s = Settings::default();
        for (k, v) in [("top_k", json!(20)), ("enable_search", json!(false)), ("search_options", json!({"x": 1}))] {
            s.set(QWEN_SESSION, k, &v, "session.").unwrap();
        }
        assert_eq!(
            s.for_backend(),
            vec![("search_options".to_string(), r#"{"x":1}"#.to_string()), ("top_k".into(), "20".into())]
        );
        let backend = BackendInfo { settings: vec!["top_k".into()], ..BackendInfo::default() };
        assert_eq!(s.unsupported(&backend), vec!["search_options".to_string()]);
    }
}
