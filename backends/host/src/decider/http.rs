//! `decider = "http"`: an OpenAI-compatible chat-completions server with tools (vLLM,
//! llama.cpp's `llama-server`, Ollama, a hosted API). Each decision is one standard request:
//! `POST URL/chat/completions` with the configured `model`, `Authorization: Bearer KEY` when a
//! key is set, the session's tools as `tools`, its `tool_choice`, and the conversation as
//! messages (the session's instructions first, the newest user turn the last). The answer's
//! first tool call is the decision; an answer without one is "no call". The whole request has
//! one deadline (`timeout_s`) and the answer one size bound (`max_answer_kb`).

use omni_actors::domain::{ChatMessage, Role, ToolChoice, Tools};
use omni_actors::domain::{DecideRequest, DeciderError, Decision};
use omni_actors::edge::decider::Decider;
use serde_json::{Value, json};

use super::DelegationSpec;

/// A decider over HTTP; one per delegation thread (each with its own connection pool).
pub struct HttpDecider {
    agent: ureq::Agent,
    endpoint: String,
    model: String,
    api_key: Option<String>,
    max_answer_bytes: u64,
    timeout_s: f64,
}

impl HttpDecider {
    /// A decider asking `model` at `endpoint` (with `api_key`), within `spec`'s deadline and bound.
    pub fn new(endpoint: &str, model: &str, api_key: Option<&str>, spec: &DelegationSpec) -> HttpDecider {
        let agent = ureq::Agent::config_builder()
            .timeout_global(Some(spec.timeout))
            .http_status_as_error(false)
            .max_redirects(0)
            .build()
            .into();
        HttpDecider {
            agent,
            endpoint: endpoint.to_string(),
            model: model.to_string(),
            api_key: api_key.map(String::from),
            max_answer_bytes: spec.max_answer_bytes,
            timeout_s: spec.timeout.as_secs_f64(),
        }
    }
}

impl Decider for HttpDecider {
    fn decide(&mut self, request: &DecideRequest) -> Result<Decision, DeciderError> {
        let body = body(&self.model, request).to_string();
        let mut call = self.agent.post(&self.endpoint).header("Content-Type", "application/json");
        if let Some(key) = &self.api_key {
            call = call.header("Authorization", format!("Bearer {key}"));
        }
        let mut response = call.send(body.as_str()).map_err(|e| self.failed(e))?;
        let status = response.status();
        let text = response
            .body_mut()
            .with_config()
            .limit(self.max_answer_bytes)
            .read_to_string()
            .map_err(|e| self.failed(e))?;
        if status != 200 {
            // Its body may quote what it was sent (a key's prefix): neither logged nor told.
            log::warn!("delegation: the decider at {} answered HTTP {status} ({} bytes)", self.endpoint, text.len());
            return Err(DeciderError::Unavailable(format!("the decider answered HTTP {status}")));
        }
        parse(&text)
    }
}

impl HttpDecider {
    /// A failed request, by why: the client is told what kind of failure, the log where.
    fn failed(&self, e: ureq::Error) -> DeciderError {
        match e {
            ureq::Error::Timeout(_) => DeciderError::Timeout(format!(
                "the decider did not answer within {} s ([delegation] timeout_s)",
                self.timeout_s
            )),
            ureq::Error::BodyExceedsLimit(limit) => DeciderError::InvalidOutput(format!(
                "the decider's answer is longer than {} KiB ([delegation] max_answer_kb); it was cut",
                limit / 1024
            )),
            other => {
                log::warn!("delegation: the decider at {} is unreachable: {other}", self.endpoint);
                DeciderError::Unavailable("the decider could not be reached".into())
            }
        }
    }
}

/// The chat-completions request for `request`.
fn body(model: &str, request: &DecideRequest) -> Value {
    let system = omni_actors::delegate::pool::system_prompt(request);
    let mut messages: Vec<Value> = Vec::new();
    if !system.trim().is_empty() {
        messages.push(json!({"role": "system", "content": system}));
    }
    messages.extend(request.messages.iter().map(message));
    let mut body = json!({"model": model, "messages": messages, "stream": false});
    // No tools: none sent (a server refuses an empty list).
    if !request.tools.functions.is_empty() {
        body["tools"] = tools(&request.tools);
        body["tool_choice"] = choice(&request.tools.choice);
    }
    body
}

/// One message of the conversation as chat-completions writes it.
fn message(m: &ChatMessage) -> Value {
    match (m.role, &m.call) {
        (Role::Assistant, Some(call)) => json!({
            "role": "assistant",
            "content": null,
            "tool_calls": [{"id": call.id, "type": "function",
                            "function": {"name": call.name, "arguments": m.text}}],
        }),
        (Role::Tool, Some(call)) => json!({"role": "tool", "tool_call_id": call.id, "content": m.text}),
        (Role::Tool, None) => json!({"role": "user", "content": format!("(a tool answered: {})", m.text)}),
        (Role::System, _) => json!({"role": "system", "content": m.text}),
        (Role::User, _) => json!({"role": "user", "content": m.text}),
        (Role::Assistant, None) => json!({"role": "assistant", "content": m.text}),
    }
}

fn tools(tools: &Tools) -> Value {
    tools
        .functions
        .iter()
        .map(|t| {
            let parameters: Value = serde_json::from_str(&t.parameters).unwrap_or(json!({"type": "object"}));
            json!({"type": "function", "function": {"name": t.name, "description": t.description, "parameters": parameters}})
        })
        .collect()
}

fn choice(choice: &ToolChoice) -> Value {
    match choice {
        ToolChoice::Auto => json!("auto"),
        ToolChoice::None => json!("none"),
        ToolChoice::Required => json!("required"),
        ToolChoice::Function(name) => json!({"type": "function", "function": {"name": name}}),
    }
}

/// The decision in a chat-completions answer.
fn parse(text: &str) -> Result<Decision, DeciderError> {
    let invalid = |why: &str| {
        let head: String = text.chars().take(120).collect();
        DeciderError::InvalidOutput(format!("the decider's answer {why}: {head}"))
    };
    let v: Value = serde_json::from_str(text).map_err(|_| invalid("is not JSON"))?;
    let message = &v["choices"][0]["message"];
    if !message.is_object() {
        return Err(invalid("has no choices[0].message"));
    }
    match &message["tool_calls"] {
        Value::Null => {}
        Value::Array(calls) if calls.is_empty() => {}
        Value::Array(calls) => {
            let f = &calls[0]["function"];
            let name = f["name"].as_str().filter(|n| !n.is_empty()).ok_or_else(|| invalid("names no tool"))?;
            let arguments = match &f["arguments"] {
                Value::String(s) => s.clone(),
                // Some servers (Ollama) write the arguments as an object.
                Value::Object(_) => f["arguments"].to_string(),
                Value::Null => String::new(),
                _ => return Err(invalid("has arguments that are neither text nor an object")),
            };
            return Ok(Decision::Call { name: name.to_string(), arguments });
        }
        _ => return Err(invalid("has tool_calls that are not a list")),
    }
    Ok(Decision::NoCall(message["content"].as_str().unwrap_or_default().to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use omni_actors::domain::Tool;

    #[test]
    fn a_request_is_standard_chat_completions_with_the_sessions_tools_and_conversation() {
        let tools = Tools {
            functions: vec![Tool {
                name: "get_weather".into(),
                description: "Weather in a city".into(),
                parameters: r#"{"type":"object","properties":{"city":{"type":"string"}}}"#.into(),
            }],
            choice: ToolChoice::Function("get_weather".into()),
        };
        let request = DecideRequest {
            instructions: "Be brief.".into(),
            tools,
            messages: vec![
                ChatMessage::text(Role::User, "Hi"),
                ChatMessage::tool_call("call_1", "get_weather", r#"{"city":"Oslo"}"#),
                ChatMessage::tool_result("call_1", "get_weather", "cold"),
                ChatMessage::text(Role::User, "And in Paris?"),
            ],
            answer: false,
        };
        let b = body("qwen", &request);
        assert_eq!(b["model"], "qwen");
        assert!(b["messages"][0]["content"].as_str().unwrap().ends_with("Be brief."));
        assert_eq!(b["messages"][2]["tool_calls"][0]["function"]["arguments"], r#"{"city":"Oslo"}"#);
        assert_eq!(b["messages"][3], json!({"role": "tool", "tool_call_id": "call_1", "content": "cold"}));
        assert_eq!(b["messages"][4], json!({"role": "user", "content": "And in Paris?"}));
        assert_eq!(b["tools"][0]["function"]["parameters"]["properties"]["city"]["type"], "string");
        assert_eq!(b["tool_choice"]["function"]["name"], "get_weather");
    }

    #[test]
    fn an_answer_is_a_call_no_call_or_invalid() {
        let call = r#"{"choices":[{"message":{"role":"assistant","content":null,"tool_calls":[{"id":"x","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]}}]}"#;
        assert_eq!(
            parse(call),
            Ok(Decision::Call { name: "get_weather".into(), arguments: r#"{"city":"Paris"}"#.into() })
        );
        let object = r#"{"choices":[{"message":{"tool_calls":[{"function":{"name":"f","arguments":{"a":1}}}]}}]}"#;
        assert_eq!(parse(object), Ok(Decision::Call { name: "f".into(), arguments: r#"{"a":1}"#.into() }));
        let words = r#"{"choices":[{"message":{"role":"assistant","content":"No tool needed."}}]}"#;
        assert_eq!(parse(words), Ok(Decision::NoCall("No tool needed.".into())));
        for bad in ["not json", "{}", r#"{"choices":[{"message":{"tool_calls":[{"function":{}}]}}]}"#] {
            assert!(matches!(parse(bad), Err(DeciderError::InvalidOutput(_))), "{bad}");
        }
    }
}
