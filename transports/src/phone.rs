//! What the phone edges (a Twilio stream's, a SIP call's) share: the session's settings a call
//! brings, and which of its session's errors are worth a log line (a phone line shows none).

/// A phone call's settings (its instructions and the model's voice, from a Twilio stream's
/// parameters or a SIP route) as its session's first `session.update` (the OpenAI dialect's:
/// every phone edge opens an OpenAI-dialect session); `None` when it has neither.
pub fn call_settings(instructions: Option<&str>, voice: Option<&str>) -> Option<String> {
    use serde_json::json;
    if instructions.is_none() && voice.is_none() {
        return None;
    }
    let mut session = json!({"type": "realtime"});
    if let Some(i) = instructions {
        session["instructions"] = json!(i);
    }
    if let Some(v) = voice {
        session["audio"] = json!({"output": {"voice": v}});
    }
    Some(json!({"type": "session.update", "session": session}).to_string())
}

/// The code of an `error` event of a phone call's session (its dialect's JSON), when it says the
/// session refused something of the call's own (a setting of its route or its parameters): a
/// phone line has nowhere to show it, so its edge logs the code (never the event: it may carry
/// the resume token). `not_ready` (the caller spoke before the session was created) is not.
pub fn refused_setting(text: &str) -> Option<String> {
    if !text.contains(r#""type":"error""#) {
        return None;
    }
    let v: serde_json::Value = serde_json::from_str(text).ok()?;
    let code = v["error"]["code"].as_str().unwrap_or("error");
    (v["type"] == "error" && code != "not_ready").then(|| code.to_string())
}
