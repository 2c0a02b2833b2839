//! The session configuration on the wire: `session.update` in any flavor's shape (beta, GA,
//! Qwen), validated field by field into the driver's typed [`Conf`], and each flavor's
//! defaults.

use omni_actors::domain::{Tool, ToolChoice, Tools};
use omni_actors::edge::client::{CallSettings, TurnDetection};
use omni_actors::protocol::ProtocolError;
use serde_json::{Value, json};

use super::{Flavor, coding};
use crate::conversation::{Coding, Conf, OUTPUT_RATE, Truncation, Vad};
use crate::settings::{self, QWEN_SESSION, Settings};

/// The settings `session.update` takes by name rather than as fields of its own.
const BY_NAME: [&str; 7] =
    ["top_p", "top_k", "repetition_penalty", "presence_penalty", "seed", "enable_search", "search_options"];

/// Server VAD as each flavor's documents show it (Qwen waits 800 ms of silence, OpenAI 500).
fn vad_of(flavor: Flavor) -> Vad {
    let silence_duration_ms = if flavor == Flavor::Qwen { 800 } else { 500 };
    Vad {
        kind: "server_vad".into(),
        threshold: 0.5,
        prefix_padding_ms: 300,
        silence_duration_ms,
        eagerness: None,
        create_response: true,
        interrupt_response: true,
        idle_timeout_ms: None,
    }
}

/// The most tools a session or a response may offer.
const MAX_TOOLS: usize = 128;
/// The most bytes of one tool's definition (its description and parameters' schema).
const MAX_TOOL_BYTES: usize = 16 * 1024;

/// A session's configuration before the client changes any of it.
pub(super) fn defaults(flavor: Flavor) -> Conf {
    Conf {
        instructions: String::new(),
        voice: if flavor == Flavor::Qwen { "Cherry".into() } else { "alloy".into() },
        voice_named: false,
        audio_out: true,
        vad: Some(vad_of(flavor)),
        temperature: None,
        max_tokens: None,
        input_rate: flavor.default_input_rate(),
        input_coding: Coding::Pcm16,
        output_coding: Coding::Pcm16,
        // Qwen's document shows transcription on by default; OpenAI's is off.
        transcription: (flavor == Flavor::Qwen).then(|| json!({"model": "gummy-realtime-v1"})),
        settings: Settings::default(),
        tools: Tools::default(),
        truncation: Truncation::Auto,
        unapplied: Vec::new(),
    }
}

pub(super) fn invalid(param: &str, why: impl std::fmt::Display) -> ProtocolError {
    ProtocolError::InvalidPayload(format!("{param}: {why}"))
}

/// An audio format as the client wrote it (`input_audio_format`, `audio.input.format`...):
/// its coding, and the rate it gave (G.711's is 8 kHz).
pub(super) fn audio_format(v: &Value, param: &str, flavor: Flavor) -> Result<(Coding, Option<u32>), ProtocolError> {
    let (kind, rate) = match v {
        Value::String(s) => (s.as_str(), None),
        Value::Object(o) => (
            o.get("type").and_then(Value::as_str).unwrap_or("pcm"),
            match o.get("rate").or_else(|| o.get("sample_rate")) {
                None | Some(Value::Null) => None,
                Some(r) => Some(r.as_u64().ok_or_else(|| invalid(param, "rate: must be a whole number of Hz"))?),
            },
        ),
        _ => return Err(invalid(param, "must be a string or an object")),
    };
    let Some(coding) = coding::coding_of(kind, flavor) else {
        return Err(invalid(param, format!("'{kind}' is not supported ({})", coding::formats(flavor))));
    };
    let rate = rate.map(|r| omni_actors::audio::check_rate(r).map_err(|e| invalid(param, e))).transpose()?;
    match (coding, rate) {
        (Coding::Pcm16, rate) => Ok((coding, rate)),
        (_, None | Some(coding::G711_RATE)) => Ok((coding, Some(coding::G711_RATE))),
        (_, Some(r)) => Err(invalid(param, format!("G.711 is {} Hz, not {r}", coding::G711_RATE))),
    }
}

/// The client's audio in: its coding and rate (16-bit PCM without a rate keeps the rate it had,
/// or the flavor's when it was G.711).
fn set_input(next: &mut Conf, (coding, rate): (Coding, Option<u32>), flavor: Flavor) {
    next.input_rate = match (coding, rate) {
        (_, Some(rate)) => rate,
        (Coding::Pcm16, None) if next.input_coding != Coding::Pcm16 => flavor.default_input_rate(),
        _ => next.input_rate,
    };
    next.input_coding = coding;
}

/// The model's voice out: 16-bit PCM at 24 kHz, or G.711 at 8 kHz.
fn set_output(next: &mut Conf, (coding, rate): (Coding, Option<u32>), param: &str) -> Result<(), ProtocolError> {
    if coding == Coding::Pcm16
        && let Some(rate) = rate
        && rate != OUTPUT_RATE
    {
        return Err(invalid(param, format!("output audio is {OUTPUT_RATE} Hz (or G.711 at 8000), not {rate}")));
    }
    next.output_coding = coding;
    Ok(())
}

pub(super) fn turn_detection(v: &Value, param: &str, flavor: Flavor) -> Result<Option<Vad>, ProtocolError> {
    match v {
        Value::Null => Ok(None),
        Value::Object(o) => {
            let mut vad = vad_of(flavor);
            if let Some(kind) = o.get("type").and_then(Value::as_str) {
                if !matches!(kind, "server_vad" | "semantic_vad") {
                    return Err(invalid(param, format!("type '{kind}' is not supported (server_vad, semantic_vad)")));
                }
                vad.kind = kind.to_string();
            }
            if let Some(t) = o.get("threshold").and_then(Value::as_f64) {
                vad.threshold = t;
            }
            if let Some(p) = o.get("prefix_padding_ms").and_then(Value::as_u64) {
                vad.prefix_padding_ms = p;
            }
            if let Some(s) = o.get("silence_duration_ms").and_then(Value::as_u64) {
                vad.silence_duration_ms = s;
            }
            let flag = |key: &str| -> Result<Option<bool>, ProtocolError> {
                match o.get(key) {
                    None | Some(Value::Null) => Ok(None),
                    Some(Value::Bool(b)) => Ok(Some(*b)),
                    Some(_) => Err(invalid(&format!("{param}.{key}"), "must be true or false")),
                }
            };
            vad.create_response = flag("create_response")?.unwrap_or(true);
            vad.interrupt_response = flag("interrupt_response")?.unwrap_or(true);
            match o.get("eagerness") {
                None | Some(Value::Null) => {}
                Some(Value::String(e)) if matches!(e.as_str(), "low" | "medium" | "high" | "auto") => {
                    vad.eagerness = Some(e.clone())
                }
                Some(_) => return Err(invalid(&format!("{param}.eagerness"), "must be low, medium, high or auto")),
            }
            match o.get("idle_timeout_ms") {
                None | Some(Value::Null) => {}
                Some(n) => match n.as_u64() {
                    Some(ms @ 1000..=600_000) => vad.idle_timeout_ms = Some(ms),
                    _ => {
                        return Err(invalid(
                            &format!("{param}.idle_timeout_ms"),
                            "must be a whole number of milliseconds from 1000 to 600000, or null",
                        ));
                    }
                },
            }
            Ok(Some(vad))
        }
        _ => Err(invalid(param, "must be an object or null")),
    }
}

/// One tool in any flavor's shape: OpenAI's flat `{type, name, description, parameters}` or
/// Qwen's (and Chat Completions') `{type: "function", function: {...}}`.
fn tool(v: &Value, param: &str) -> Result<Tool, ProtocolError> {
    let o = v.as_object().ok_or_else(|| invalid(param, "must be an object"))?;
    match o.get("type").and_then(Value::as_str) {
        None | Some("function") => {}
        Some(other) => {
            return Err(invalid(&format!("{param}.type"), format!("'{other}' tools are not supported (function)")));
        }
    }
    let f = match o.get("function") {
        Some(Value::Object(f)) => f,
        Some(_) => return Err(invalid(&format!("{param}.function"), "must be an object")),
        None => o,
    };
    let name = match f.get("name") {
        Some(Value::String(n))
            if (1..=64).contains(&n.len()) && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') =>
        {
            n.clone()
        }
        Some(_) => return Err(invalid(&format!("{param}.name"), "1 to 64 letters, digits, '_' or '-'")),
        None => return Err(ProtocolError::MissingField(format!("{param}.name is required"))),
    };
    let description = match f.get("description") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(d)) => d.clone(),
        Some(_) => return Err(invalid(&format!("{param}.description"), "must be a string")),
    };
    let parameters = match f.get("parameters") {
        None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
        Some(p @ Value::Object(_)) => p.clone(),
        Some(_) => return Err(invalid(&format!("{param}.parameters"), "must be a JSON Schema object")),
    }
    .to_string();
    if description.len() + parameters.len() > MAX_TOOL_BYTES {
        return Err(invalid(param, format!("its description and parameters take more than {MAX_TOOL_BYTES} bytes")));
    }
    Ok(Tool { name, description, parameters })
}

/// `tools`: the functions the model may call.
pub(super) fn tools(v: &Value, param: &str) -> Result<Vec<Tool>, ProtocolError> {
    let list = match v {
        Value::Null => return Ok(Vec::new()),
        Value::Array(list) => list,
        _ => return Err(invalid(param, "must be a list")),
    };
    if list.len() > MAX_TOOLS {
        return Err(invalid(param, format!("{} tools; at most {MAX_TOOLS}", list.len())));
    }
    let tools =
        list.iter().enumerate().map(|(i, t)| tool(t, &format!("{param}[{i}]"))).collect::<Result<Vec<_>, _>>()?;
    for (i, t) in tools.iter().enumerate() {
        if tools[..i].iter().any(|o| o.name == t.name) {
            return Err(invalid(&format!("{param}[{i}].name"), format!("'{}' is given twice", t.name)));
        }
    }
    Ok(tools)
}

/// `tool_choice`: `auto`, `none`, `required`, or one function (`{type: "function", name}`).
pub(super) fn tool_choice(v: &Value, param: &str) -> Result<ToolChoice, ProtocolError> {
    let name = match v {
        Value::Null => return Ok(ToolChoice::Auto),
        Value::String(s) => match s.as_str() {
            "auto" => return Ok(ToolChoice::Auto),
            "none" => return Ok(ToolChoice::None),
            "required" => return Ok(ToolChoice::Required),
            other => {
                return Err(invalid(param, format!("'{other}' is not a choice (auto, none, required, or a function)")));
            }
        },
        Value::Object(o) => {
            o.get("name").or_else(|| o.get("function").and_then(|f| f.get("name"))).and_then(Value::as_str)
        }
        _ => None,
    };
    name.map(|n| ToolChoice::Function(n.to_string()))
        .ok_or_else(|| invalid(param, "must be auto, none, required or {\"type\": \"function\", \"name\": ...}"))
}

/// A choice of one function must name one of the tools.
pub(super) fn check_choice(tools: &Tools, param: &str) -> Result<(), ProtocolError> {
    match &tools.choice {
        ToolChoice::Function(name) if !tools.functions.iter().any(|t| &t.name == name) => {
            Err(invalid(param, format!("there is no tool named '{name}'")))
        }
        _ => Ok(()),
    }
}

/// `truncation`: `auto`, `disabled`, or `{type: "retention_ratio", retention_ratio}`.
fn truncation(v: &Value, param: &str) -> Result<Truncation, ProtocolError> {
    match v {
        Value::Null => Ok(Truncation::Auto),
        Value::String(s) if s == "auto" => Ok(Truncation::Auto),
        Value::String(s) if s == "disabled" => Ok(Truncation::Disabled),
        Value::Object(o) if o.get("type").and_then(Value::as_str) == Some("retention_ratio") => {
            match o.get("retention_ratio").and_then(Value::as_f64) {
                Some(r) if (0.0..=1.0).contains(&r) => Ok(Truncation::Retain(r)),
                _ => Err(invalid(&format!("{param}.retention_ratio"), "must be a number from 0 to 1")),
            }
        }
        _ => Err(invalid(param, "must be auto, disabled or {\"type\": \"retention_ratio\", ...}")),
    }
}

/// Records a setting no model here applies (`None`: the client took it back).
fn unapplied(conf: &mut Conf, name: &str, value: Option<Value>) {
    conf.unapplied.retain(|(n, _)| n != name);
    if let Some(v) = value {
        conf.unapplied.push((name.to_string(), v));
    }
}

/// Whether the modalities ask for audio. Qwen answers audio with its text: `["audio"]`
/// alone is refused there, as its document shows.
pub(super) fn modalities(v: &Value, param: &str, flavor: Flavor) -> Result<bool, ProtocolError> {
    let list = v.as_array().ok_or_else(|| invalid(param, "must be a list"))?;
    let (mut audio, mut text) = (false, false);
    for m in list {
        match m.as_str() {
            Some("audio") => audio = true,
            Some("text") => text = true,
            other => return Err(invalid(param, format!("{other:?} is not a modality (text, audio)"))),
        }
    }
    if flavor == Flavor::Qwen && audio && !text {
        return Err(invalid(
            param,
            "Invalid modalities: ['audio']. Supported combinations are: ['text'] and ['audio', 'text'].",
        ));
    }
    Ok(audio)
}

/// `input_audio_transcription` (or GA `audio.input.transcription`): an object naming the
/// transcription model, or null for none.
fn transcription(v: &Value, param: &str) -> Result<Option<Value>, ProtocolError> {
    match v {
        Value::Null => Ok(None),
        Value::Object(o) if o.len() <= 8 && v.to_string().len() <= 1024 => Ok(Some(v.clone())),
        Value::Object(_) => Err(invalid(param, "at most 8 fields and 1024 bytes")),
        _ => Err(invalid(param, "must be an object or null")),
    }
}

/// The voice's speed: 0.25 to 1.5.
fn speed(v: &Value, param: &str) -> Result<f64, ProtocolError> {
    match v.as_f64() {
        Some(s) if (0.25..=1.5).contains(&s) => Ok(s),
        _ => Err(invalid(param, "must be a number from 0.25 to 1.5")),
    }
}

pub(super) fn max_tokens(v: &Value, param: &str) -> Result<Option<u32>, ProtocolError> {
    match v {
        Value::String(s) if s == "inf" => Ok(None),
        Value::Number(n) => match n.as_u64() {
            Some(n @ 1..=1_000_000) => Ok(Some(n as u32)),
            _ => Err(invalid(param, "must be a positive integer or \"inf\"")),
        },
        _ => Err(invalid(param, "must be a positive integer or \"inf\"")),
    }
}

/// `conf` with a `session` object in any flavor's shape (beta, GA, Qwen) applied; nothing of
/// it applies if any of it is refused.
/// A call's settings (typed, from an edge whose caller speaks no dialect) over `conf`, as a
/// client's `session.update` of the same settings would set them.
pub(super) fn configured(conf: &Conf, settings: &CallSettings, flavor: Flavor) -> Result<Conf, ProtocolError> {
    let mut next = conf.clone();
    if let Some(i) = &settings.instructions {
        next.instructions = i.clone();
    }
    if let Some(v) = &settings.voice {
        next.voice = v.clone();
        next.voice_named = true;
    }
    match settings.turn_detection {
        Some(TurnDetection::Server) => next.vad = Some(vad_of(flavor)),
        Some(TurnDetection::Off) => next.vad = None,
        None => {}
    }
    if let Some(tools) = &settings.tools {
        next.tools = tools.clone();
        check_choice(&next.tools, "tool_choice")?;
    }
    Ok(next)
}

pub(super) fn apply(conf: &Conf, s: &Value, flavor: Flavor) -> Result<Conf, ProtocolError> {
    let s = s.as_object().ok_or_else(|| ProtocolError::MissingField("session must be an object".into()))?;
    let mut next = conf.clone();
    let text = |key: &str| -> Result<Option<String>, ProtocolError> {
        match s.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(v)) => Ok(Some(v.clone())),
            Some(_) => Err(invalid(&format!("session.{key}"), "must be a string")),
        }
    };
    if let Some(i) = text("instructions")? {
        next.instructions = i;
    }
    if let Some(v) = text("voice")? {
        next.voice = v;
        next.voice_named = true;
    }
    if let Some(m) = s.get("modalities") {
        next.audio_out = modalities(m, "session.modalities", flavor)?;
    }
    if let Some(m) = s.get("output_modalities") {
        next.audio_out = modalities(m, "session.output_modalities", flavor)?;
    }
    if let Some(td) = s.get("turn_detection") {
        next.vad = turn_detection(td, "session.turn_detection", flavor)?;
    }
    if let Some(t) = s.get("input_audio_transcription") {
        next.transcription = transcription(t, "session.input_audio_transcription")?;
    }

    for name in BY_NAME {
        if let Some(v) = s.get(name) {
            next.settings.set(QWEN_SESSION, name, v, "session.")?;
        }
    }
    if let Some(f) = s.get("input_audio_format") {
        set_input(&mut next, audio_format(f, "session.input_audio_format", flavor)?, flavor);
    }
    if let Some(f) = s.get("output_audio_format") {
        let param = "session.output_audio_format";
        set_output(&mut next, audio_format(f, param, flavor)?, param)?;
    }
    if let Some(t) = s.get("temperature") {
        next.temperature = Some(settings::temperature(t, "session.temperature")?);
    }
    for key in ["max_response_output_tokens", "max_output_tokens", "max_tokens"] {
        if let Some(v) = s.get(key) {
            next.max_tokens = max_tokens(v, &format!("session.{key}"))?;
        }
    }
    if let Some(t) = s.get("tools") {
        next.tools.functions = tools(t, "session.tools")?;
    }
    if let Some(c) = s.get("tool_choice") {
        next.tools.choice = tool_choice(c, "session.tool_choice")?;
    }
    check_choice(&next.tools, "session.tool_choice")?;
    if let Some(t) = s.get("truncation") {
        next.truncation = truncation(t, "session.truncation")?;
    }
    echoed(&mut next, s)?;
    if let Some(v) = s.get("type")
        && v != "realtime"
    {
        return Err(invalid("session.type", "only realtime sessions are served here (not transcription)"));
    }
    // GA: audio.input.{format, turn_detection, transcription}, audio.output.{format, voice}
    if let Some(audio) = s.get("audio") {
        apply_audio(&mut next, audio, flavor)?;
    }
    // The transcription's language and prompt: kept, echoed, not applied.
    for key in ["language", "prompt"] {
        let given = next.transcription.as_ref().and_then(|t| t.get(key)).filter(|v| !v.is_null()).cloned();
        unapplied(&mut next, &format!("transcription.{key}"), given);
    }
    Ok(next)
}

/// The settings accepted, echoed, and reported as not applied.
fn echoed(next: &mut Conf, s: &serde_json::Map<String, Value>) -> Result<(), ProtocolError> {
    // Accepted, echoed, and reported as not applied.
    for (key, name) in
        [("tracing", "tracing"), ("prompt", "prompt"), ("input_audio_noise_reduction", "input_audio_noise_reduction")]
    {
        if let Some(v) = s.get(key) {
            unapplied(next, name, (!v.is_null()).then(|| v.clone()));
        }
    }
    if let Some(v) = s.get("include") {
        let list = v.as_array().filter(|l| l.iter().all(Value::is_string));
        let list = list.ok_or_else(|| invalid("session.include", "must be a list of strings"))?;
        unapplied(next, "include", (!list.is_empty()).then(|| v.clone()));
    }
    if let Some(v) = s.get("speed") {
        let speed = speed(v, "session.speed")?;
        unapplied(next, "speed", (speed != 1.0).then(|| v.clone()));
    }
    Ok(())
}

/// GA's `audio`: `input.{format, turn_detection, transcription, noise_reduction}`,
/// `output.{speed, voice, format}`.
fn apply_audio(next: &mut Conf, audio: &Value, flavor: Flavor) -> Result<(), ProtocolError> {
    let input = &audio["input"];
    if let Some(f) = input.get("format") {
        set_input(next, audio_format(f, "session.audio.input.format", flavor)?, flavor);
    }
    if let Some(td) = input.get("turn_detection") {
        next.vad = turn_detection(td, "session.audio.input.turn_detection", flavor)?;
    }
    if let Some(t) = input.get("transcription") {
        next.transcription = transcription(t, "session.audio.input.transcription")?;
    }
    if let Some(v) = input.get("noise_reduction") {
        if !v.is_null()
            && v.get("type").and_then(Value::as_str).is_none_or(|t| !matches!(t, "near_field" | "far_field"))
        {
            return Err(invalid(
                "session.audio.input.noise_reduction",
                "must be null or {\"type\": near_field|far_field}",
            ));
        }
        unapplied(next, "audio.input.noise_reduction", (!v.is_null()).then(|| v.clone()));
    }
    let output = &audio["output"];
    if let Some(v) = output.get("speed") {
        let speed = speed(v, "session.audio.output.speed")?;
        unapplied(next, "audio.output.speed", (speed != 1.0).then(|| v.clone()));
    }
    if let Some(v) = output.get("voice").and_then(Value::as_str) {
        next.voice = v.to_string();
        next.voice_named = true;
    }
    if let Some(f) = output.get("format") {
        let param = "session.audio.output.format";
        set_output(next, audio_format(f, param, flavor)?, param)?;
    }
    Ok(())
}

/// A `session` object without its audio formats (`input_audio_format`,
/// `output_audio_format`, `audio.input.format`, `audio.output.format`): for a session whose
/// edge carries the audio in formats of its own.
pub(super) fn without_formats(session: &Value) -> Value {
    let mut session = session.clone();
    if let Some(s) = session.as_object_mut() {
        s.remove("input_audio_format");
        s.remove("output_audio_format");
        if let Some(audio) = s.get_mut("audio").and_then(Value::as_object_mut) {
            for side in ["input", "output"] {
                if let Some(side) = audio.get_mut(side).and_then(Value::as_object_mut) {
                    side.remove("format");
                }
            }
        }
    }
    session
}
