//! The functions the LLM may call (ABI 1.3), in its chat template's own format: the tools are
//! listed in the system block between `<tools>` tags, one JSON object a line, and the model
//! answers a call as `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (the Qwen2.5
//! template; its results come back as `<tool_response>`). Small models often leave the tags
//! out and write the bare JSON object as their whole answer: that is a call too.
//!
//! While the model writes a call, a grammar holds its sampling to the format ([`Tools::grammar`],
//! llama.cpp's GBNF): the name one of the tools given, the arguments a JSON object (`{}` for a
//! tool that takes none). Under `auto` the grammar waits for the call to begin (the
//! `<tool_call>` token, or an answer that opens with `{`); under `required` or a named tool it
//! holds from the first token, so the answer is a call. A call is then checked
//! before it leaves: its JSON parsed, its tool one of those given, its arguments valid against
//! the tool's JSON Schema; a call that is not is refused, with the reason.

use serde_json::{Value, json};

/// Where a call begins and ends in the model's answer.
pub(crate) const CALL_OPEN: &str = "<tool_call>";
pub(crate) const CALL_CLOSE: &str = "</tool_call>";

struct Tool {
    name: String,
    /// Whether its parameters name no property (its arguments can only be `{}`).
    no_arguments: bool,
    /// The tool as the template lists it.
    listed: Value,
    schema: jsonschema::Validator,
}

/// The tools of a session or an answer, and the choice among them.
#[derive(Default)]
pub(crate) struct Tools {
    tools: Vec<Tool>,
    /// `auto` (or empty), `none`, `required`, or one tool's name.
    choice: String,
}

impl Tools {
    /// The tools from the ABI's JSON array of `{name, description, parameters}`.
    pub(crate) fn parse(json: &str, choice: &str) -> Result<Tools, String> {
        let mut tools = Vec::new();
        if !json.trim().is_empty() {
            let list: Vec<Value> = serde_json::from_str(json).map_err(|e| format!("tools: not a JSON array ({e})"))?;
            for (i, t) in list.into_iter().enumerate() {
                let name = t.get("name").and_then(Value::as_str).ok_or(format!("tools[{i}]: no name"))?.to_string();
                let parameters = t.get("parameters").cloned().unwrap_or_else(|| json!({"type": "object"}));
                let schema = jsonschema::validator_for(&parameters)
                    .map_err(|e| format!("tools[{i}] ({name}): its parameters are not a valid JSON Schema: {e}"))?;
                let no_arguments = parameters.get("properties").and_then(Value::as_object).is_none_or(|p| p.is_empty())
                    && parameters.get("additionalProperties").is_none_or(|a| a == &Value::Bool(false));
                let description = t.get("description").cloned().unwrap_or(json!(""));
                let listed = json!({"type": "function", "function":
                    {"name": name, "description": description, "parameters": parameters}});
                tools.push(Tool { name, no_arguments, listed, schema });
            }
        }
        let choice = choice.trim().to_string();
        if !matches!(choice.as_str(), "" | "auto" | "none" | "required") && !tools.iter().any(|t| t.name == choice) {
            return Err(format!("tool_choice: there is no tool named '{choice}'"));
        }
        Ok(Tools { tools, choice })
    }

    /// Whether the model may call any.
    pub(crate) fn active(&self) -> bool {
        !self.tools.is_empty() && self.choice != "none"
    }

    /// What the system block says of them (empty when none may be called).
    pub(crate) fn prompt(&self) -> String {
        if !self.active() {
            return String::new();
        }
        let mut p = String::from(
            "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n\
             You are provided with function signatures within <tools></tools> XML tags:\n<tools>",
        );
        for t in &self.tools {
            p.push('\n');
            p.push_str(&t.listed.to_string());
        }
        p.push_str(
            "\n</tools>\n\nFor each function call, return a json object with function name and arguments within \
             <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": \
             <args-json-object>}\n</tool_call>",
        );
        match self.choice.as_str() {
            "" | "auto" => p.push_str(
                "\nCall a function only for what no <tool_response> has told yet; once one has, answer the user with it in words.",
            ),
            "required" => p.push_str("\nCall one of these functions now."),
            name => p.push_str(&format!("\nCall the function {name} now.")),
        }
        p
    }

    /// A call the model wrote (the text between its tags): its tool's name and its arguments
    /// (compact JSON), or why it is refused.
    pub(crate) fn check(&self, written: &str) -> Result<(String, String), String> {
        let call: Value = serde_json::from_str(written.trim())
            .map_err(|e| format!("the call is not JSON ({e}): {}", clip(written)))?;
        let name = call
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| format!("the call names no tool: {}", clip(written)))?;
        let tool = self
            .tools
            .iter()
            .find(|t| t.name == name)
            .ok_or_else(|| format!("the call is of '{name}', which is not one of the tools given"))?;
        let arguments = match call.get("arguments") {
            None | Some(Value::Null) => json!({}),
            // Some models write the arguments as a JSON string.
            Some(Value::String(s)) => {
                serde_json::from_str(s).map_err(|e| format!("{name}: its arguments are not JSON ({e})"))?
            }
            Some(a) => a.clone(),
        };
        if let Err(e) = tool.schema.validate(&arguments) {
            return Err(format!("{name}: its arguments {arguments} do not match its parameters: {e}"));
        }
        Ok((name.to_string(), arguments.to_string()))
    }
}

/// Whether the start of an answer (leading white space trimmed) is a function call, may still
/// become one, or is words. An answer that opens with `{` is a bare call (the grammar holds it
/// to one from there: [`ROOT_BARE`]).
#[derive(Debug, PartialEq)]
pub(crate) enum Opening {
    Tagged,
    Bare,
    Perhaps,
    Words,
}

pub(crate) fn opening(start: &str) -> Opening {
    if start.starts_with(CALL_OPEN) {
        Opening::Tagged
    } else if start.starts_with('{') {
        Opening::Bare
    } else if !start.is_empty() && CALL_OPEN.starts_with(start) {
        Opening::Perhaps
    } else {
        Opening::Words
    }
}

/// The grammar's roots: calls in tags (what `<tool_call>` starts, under `auto`); an answer that
/// must be a call (`required`, or a tool named); a bare call, once its `{` is written.
pub(crate) const ROOT_TAGGED: &str = "calls";
pub(crate) const ROOT_FORCED: &str = "answer";
pub(crate) const ROOT_BARE: &str = "bare";

/// JSON, for the arguments of a tool that takes some (their schema is checked after the call).
const JSON_RULES: &str = r#"
object ::= "{" ws ( string ws ":" ws value ( ws "," ws string ws ":" ws value )* )? ws "}"
array ::= "[" ws ( value ( ws "," ws value )* )? ws "]"
value ::= object | array | string | number | "true" | "false" | "null"
string ::= "\"" ( [^"\\\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} ) )* "\""
number ::= "-"? [0-9]+ ( "." [0-9]+ )? ( [eE] [-+]? [0-9]+ )?
ws ::= [ \t\n]{0,16}
"#;

impl Tools {
    /// Whether the answer must be a call (`required`, or a tool named).
    pub(crate) fn forced(&self) -> bool {
        self.active() && !matches!(self.choice.as_str(), "" | "auto")
    }

    /// The grammar (GBNF) calls are written under, when the model may call any: a call's name
    /// is one of the tools (the one named, under a named choice), its arguments a JSON object,
    /// `{}` for a tool whose parameters name no property.
    pub(crate) fn grammar(&self) -> Option<String> {
        if !self.active() {
            return None;
        }
        let callable: Vec<&Tool> = match self.choice.as_str() {
            "" | "auto" | "required" => self.tools.iter().collect(),
            name => self.tools.iter().filter(|t| t.name == name).collect(),
        };
        let names: Vec<String> = (0..callable.len()).map(|i| format!("tool{i}")).collect();
        let mut text = format!(
            "{ROOT_TAGGED} ::= tagged ( ws tagged )*\n{ROOT_FORCED} ::= ws ( {ROOT_TAGGED} | body )\n{ROOT_BARE} ::= ws body\n\
             tagged ::= {} ws body ws {}\nbody ::= \"{{\" ws {} ws \":\" ws ( {} ) ws \"}}\"\n",
            literal(CALL_OPEN),
            literal(CALL_CLOSE),
            literal("\"name\""),
            names.join(" | ")
        );
        for (rule, t) in names.iter().zip(&callable) {
            let arguments = if t.no_arguments { r#""{" ws "}""# } else { "object" };
            text.push_str(&format!(
                "{rule} ::= {} ws \",\" ws {} ws \":\" ws {arguments}\n",
                literal(&Value::String(t.name.clone()).to_string()),
                literal("\"arguments\"")
            ));
        }
        text.push_str(JSON_RULES);
        Some(text)
    }
}

/// `text` as a GBNF string literal.
fn literal(text: &str) -> String {
    let mut out = String::from("\"");
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// At most 200 bytes of the model's text, for an error.
fn clip(text: &str) -> &str {
    let mut end = text.len().min(200);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOOLS: &str = r#"[{"name": "get_time", "description": "The time now", "parameters":
        {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}}]"#;

    #[test]
    fn a_call_is_checked_against_its_tool() {
        let tools = Tools::parse(TOOLS, "auto").unwrap();
        assert!(tools.active());
        assert!(tools.prompt().contains(r#""name":"get_time""#));
        assert_eq!(
            tools.check(r#" {"name": "get_time", "arguments": {"zone": "UTC"}} "#),
            Ok(("get_time".into(), r#"{"zone":"UTC"}"#.into()))
        );
        assert_eq!(
            tools.check(r#"{"name": "get_time", "arguments": "{\"zone\": \"CET\"}"}"#),
            Ok(("get_time".into(), r#"{"zone":"CET"}"#.into()))
        );
        let refused = tools.check(r#"{"name": "get_time", "arguments": {}}"#).unwrap_err();
        assert!(refused.contains("do not match"), "{refused}");
        assert!(tools.check(r#"{"name": "get_weather"}"#).unwrap_err().contains("not one of the tools"));
        assert!(tools.check("get_time()").unwrap_err().contains("not JSON"));
    }

    #[test]
    fn the_choice_is_checked_and_none_offers_nothing() {
        assert!(!Tools::parse(TOOLS, "none").unwrap().active());
        assert!(Tools::parse(TOOLS, "none").unwrap().prompt().is_empty());
        assert!(Tools::parse(TOOLS, "get_time").unwrap().prompt().ends_with("Call the function get_time now."));
        assert!(Tools::parse(TOOLS, "get_date").is_err());
        assert!(!Tools::parse("", "").unwrap().active());
        assert!(Tools::parse("{", "").is_err());
        assert!(Tools::parse(r#"[{"name": "x", "parameters": {"type": 7}}]"#, "").is_err());
    }

    #[test]
    fn the_grammar_names_the_tools_and_holds_arguments() {
        let both = format!(
            r#"[{}, {{"name": "hang_up", "parameters": {{"type": "object", "properties": {{}}, "additionalProperties": false}}}}]"#,
            &TOOLS[1..TOOLS.len() - 1]
        );
        let g = Tools::parse(&both, "auto").unwrap().grammar().unwrap();
        assert!(g.contains(r#"tool0 ::= "\"get_time\"" ws "," ws "\"arguments\"" ws ":" ws object"#), "{g}");
        assert!(g.contains(r#"tool1 ::= "\"hang_up\"" ws "," ws "\"arguments\"" ws ":" ws "{" ws "}""#), "{g}");
        assert!(g.contains("body ::= \"{\" ws \"\\\"name\\\"\" ws \":\" ws ( tool0 | tool1 ) ws \"}\""), "{g}");
        let named = Tools::parse(&both, "hang_up").unwrap();
        assert!(named.forced() && !named.grammar().unwrap().contains("get_time"));
        assert!(!Tools::parse(&both, "auto").unwrap().forced());
        assert!(Tools::parse(&both, "none").unwrap().grammar().is_none());
    }

    #[test]
    fn an_answer_opens_as_a_call_or_as_words() {
        assert_eq!(opening("<tool_call>\n{"), Opening::Tagged);
        assert_eq!(opening("{\"na"), Opening::Bare);
        assert_eq!(opening("<tool"), Opening::Perhaps);
        assert_eq!(opening(""), Opening::Words);
        assert_eq!(opening("It is noon."), Opening::Words);
        assert_eq!(opening("<b>"), Opening::Words);
    }
}
