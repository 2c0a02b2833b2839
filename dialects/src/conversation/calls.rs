//! A function call the model makes, checked before the client hears of it: its tool one of
//! those the response may call, its arguments a JSON object that the tool's parameters (a JSON
//! Schema) accept. A call that is not is refused with one `error` (`tool_not_found`,
//! `invalid_tool_arguments`) and never reaches the client as a call; the response goes on.
//! The pieces of a call are held until it is written whole (its arguments at most
//! [`MAX_ARGUMENTS`]), then told at once.

use omni_actors::domain::{ToolChoice, Tools};
use omni_actors::protocol::ProtocolError;
use serde_json::{Value, json};

/// The longest arguments a call may have, in bytes.
pub const MAX_ARGUMENTS: usize = 64 << 10;

/// A call being written: its tool's name and its arguments so far.
#[derive(Debug, Default)]
pub struct WrittenCall {
    pub name: String,
    pub arguments: String,
    /// Its arguments passed [`MAX_ARGUMENTS`] (the rest was not kept).
    pub overflowed: bool,
}

impl WrittenCall {
    pub fn new(name: &str) -> WrittenCall {
        WrittenCall { name: name.to_string(), ..WrittenCall::default() }
    }

    /// A piece of its arguments.
    pub fn push(&mut self, piece: &str) {
        if self.arguments.len() + piece.len() > MAX_ARGUMENTS {
            self.overflowed = true;
        } else if !self.overflowed {
            self.arguments.push_str(piece);
        }
    }
}

/// Whether `call` may go to the client: a tool of `tools`, with arguments its parameters take.
pub fn check(call: &WrittenCall, tools: &Tools) -> Result<(), ProtocolError> {
    let name = clip(&call.name);
    let chosen = match &tools.choice {
        ToolChoice::None => Some("none"),
        ToolChoice::Function(f) if *f != call.name => Some(f.as_str()),
        _ => None,
    };
    if let Some(chosen) = chosen {
        return Err(ProtocolError::Refused {
            code: "tool_not_found",
            message: format!("the model called '{name}', where tool_choice is '{}'", clip(chosen)),
        });
    }
    let Some(tool) = tools.functions.iter().find(|t| t.name == call.name) else {
        let known: Vec<&str> = tools.functions.iter().map(|t| t.name.as_str()).collect();
        return Err(ProtocolError::Refused {
            code: "tool_not_found",
            message: format!(
                "the model called '{name}', which is not one of the session's tools ({})",
                known.join(", ")
            ),
        });
    };
    let invalid = |why: String| ProtocolError::Refused {
        code: "invalid_tool_arguments",
        message: format!("the model's call of {name} was not sent: {why}"),
    };
    if call.overflowed {
        return Err(invalid(format!("its arguments are longer than {} KiB", MAX_ARGUMENTS >> 10)));
    }
    let written = if call.arguments.trim().is_empty() { "{}" } else { call.arguments.as_str() };
    let arguments: Value =
        serde_json::from_str(written).map_err(|e| invalid(format!("its arguments are not JSON ({e})")))?;
    if !arguments.is_object() {
        return Err(invalid("its arguments are not a JSON object".into()));
    }
    let parameters: Value = if tool.parameters.trim().is_empty() {
        json!({"type": "object"})
    } else {
        // The client's schema was read when it gave it; one that does not parse checks nothing.
        serde_json::from_str(&tool.parameters).unwrap_or(json!({}))
    };
    if let Ok(schema) = jsonschema::validator_for(&parameters)
        && let Err(e) = schema.validate(&arguments)
    {
        return Err(invalid(format!("its arguments {} do not match its parameters: {e}", clip(written))));
    }
    Ok(())
}

/// At most 200 characters of what the model wrote, for a message.
fn clip(s: &str) -> String {
    match s.char_indices().nth(200) {
        Some((at, _)) => format!("{}...", &s[..at]),
        None => s.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use omni_actors::domain::Tool;

    fn tools() -> Tools {
        let city = r#"{"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
            "additionalProperties": false}"#;
        Tools {
            functions: vec![
                Tool { name: "get_weather".into(), description: String::new(), parameters: city.into() },
                Tool { name: "get_time".into(), description: String::new(), parameters: String::new() },
            ],
            ..Tools::default()
        }
    }

    fn call(name: &str, arguments: &str) -> WrittenCall {
        let mut c = WrittenCall::new(name);
        c.push(arguments);
        c
    }

    fn code(r: Result<(), ProtocolError>) -> String {
        match r {
            Ok(()) => "ok".into(),
            Err(ProtocolError::Refused { code, message }) => format!("{code}: {message}"),
            Err(e) => panic!("{e:?}"),
        }
    }

    #[test]
    fn a_call_goes_out_only_of_a_given_tool_with_arguments_its_schema_takes() {
        let t = tools();
        assert_eq!(code(check(&call("get_weather", r#"{"city": "Paris"}"#), &t)), "ok");
        assert_eq!(code(check(&call("get_time", ""), &t)), "ok", "no arguments: {{}}");
        assert!(code(check(&call("get_stock", "{}"), &t)).starts_with("tool_not_found: the model called 'get_stock'"));
        let missing = code(check(&call("get_weather", "{}"), &t));
        assert!(missing.starts_with("invalid_tool_arguments:") && missing.contains("city"), "{missing}");
        let extra = code(check(&call("get_weather", r#"{"city": "Paris", "x": 1}"#), &t));
        assert!(extra.starts_with("invalid_tool_arguments:"), "{extra}");
        assert!(code(check(&call("get_weather", "{\"city\": "), &t)).contains("are not JSON"));
        assert!(code(check(&call("get_time", "[1]"), &t)).contains("not a JSON object"));
        // What tool_choice rules out is not sent either.
        let none = Tools { choice: ToolChoice::None, ..tools() };
        assert!(code(check(&call("get_time", "{}"), &none)).contains("tool_choice is 'none'"));
        let only = Tools { choice: ToolChoice::Function("get_weather".into()), ..tools() };
        assert!(code(check(&call("get_time", "{}"), &only)).starts_with("tool_not_found:"));
        assert_eq!(code(check(&call("get_weather", r#"{"city": "Oslo"}"#), &only)), "ok");
    }

    #[test]
    fn arguments_past_the_bound_are_not_kept_and_the_call_is_refused() {
        let mut c = WrittenCall::new("get_time");
        for _ in 0..100 {
            c.push(&"x".repeat(1024));
        }
        assert!(c.arguments.len() <= MAX_ARGUMENTS && c.overflowed);
        assert!(code(check(&c, &tools())).contains("longer than 64 KiB"));
        let long_name = "n".repeat(10_000);
        assert!(code(check(&call(&long_name, "{}"), &tools())).len() < 600, "the name is clipped in the message");
    }
}
