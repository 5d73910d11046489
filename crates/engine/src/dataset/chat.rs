//! Single-turn chat lines, which cactus-needle 3.x also trains on (its `from_chat`): `messages`
//! with one user turn answered by one assistant turn (a system turn may come first), and
//! OpenAI-form `tools` and `tool_calls`. Read into the fields of a query/answers example.

use serde_json::{Map, Value};

use super::lines;
use super::problem::Issue;
use crate::pyjson::{kind_of, python_truthy};

/// The example a chat line holds; `Ok(None)` for a line that is not a single-turn chat (3.x skips
/// it), an error for one 3.x would crash on.
pub(super) fn from_chat(line: &Map<String, Value>) -> Result<Option<Map<String, Value>>, Issue> {
    let Some(Value::Array(messages)) = line.get("messages") else { return Ok(None) };
    let messages = messages
        .iter()
        .map(|m| m.as_object().ok_or_else(|| bad(format!("a message is {}, not an object", kind_of(m)))))
        .collect::<Result<Vec<_>, _>>()?;
    let role = |m: &Map<String, Value>| m.get("role").and_then(Value::as_str).map(str::to_owned);
    let is_system = |m: &&&Map<String, Value>| role(m).as_deref() == Some("system");
    let turns: Vec<_> = messages.iter().filter(|m| !is_system(m)).collect();
    let [user, assistant] = turns.as_slice() else { return Ok(None) };
    if role(user).as_deref() != Some("user") || role(assistant).as_deref() != Some("assistant") {
        return Ok(None);
    }
    let answers = listed("tool_calls", assistant.get("tool_calls"))?.iter().map(call).collect::<Result<_, _>>()?;
    let tools = listed("tools", line.get("tools"))?
        .into_iter()
        .map(|tool| match &tool {
            Value::Object(fields) => fields.get("function").cloned().unwrap_or(tool),
            _ => tool,
        })
        .collect();
    let query = user.get("content").filter(|c| python_truthy(c)).cloned().unwrap_or_else(|| Value::from(""));
    let mut example = Map::new();
    example.insert("query".into(), query);
    example.insert("tools".into(), Value::Array(tools));
    example.insert("answers".into(), Value::Array(answers));
    if let Some(system) = messages.iter().find(|m| is_system(m)).and_then(|m| m.get("content")) {
        if python_truthy(system) {
            example.insert("system".into(), system.clone());
        }
    }
    Ok(Some(example))
}

/// The items `for item in value or []` walks: a list's entries, a string's characters, an
/// object's keys; nothing for a false-y value. Any other true-y value is not iterable.
fn listed(field: &str, value: Option<&Value>) -> Result<Vec<Value>, Issue> {
    match value {
        None => Ok(Vec::new()),
        Some(value) if !python_truthy(value) => Ok(Vec::new()),
        Some(Value::Array(items)) => Ok(items.clone()),
        Some(Value::String(text)) => Ok(text.chars().map(|c| Value::from(c.to_string())).collect()),
        Some(Value::Object(fields)) => Ok(fields.keys().map(|k| Value::from(k.as_str())).collect()),
        Some(other) => Err(bad(format!("`{field}` is {}, which cannot be listed", kind_of(other)))),
    }
}

/// One tool call as an answer: `{"name", "arguments"}`, the arguments parsed when they are JSON text.
fn call(value: &Value) -> Result<Value, Issue> {
    let call = value.as_object().ok_or_else(|| bad(format!("a tool call is {}, not an object", kind_of(value))))?;
    let function = match call.get("function") {
        Some(function) if python_truthy(function) => function
            .as_object()
            .ok_or_else(|| bad(format!("a tool call's `function` is {}, not an object", kind_of(function))))?,
        _ => call,
    };
    let arguments = match function.get("arguments") {
        None => Value::Object(Map::new()),
        Some(Value::String(text)) if lines::python_strip(text).1.is_empty() => Value::Object(Map::new()),
        Some(Value::String(text)) => {
            serde_json::from_str(text).map_err(|e| bad(format!("a tool call's `arguments` text is not JSON ({e})")))?
        }
        Some(arguments) => arguments.clone(),
    };
    let mut answer = Map::new();
    answer.insert("name".into(), function.get("name").cloned().unwrap_or(Value::Null));
    answer.insert("arguments".into(), arguments);
    Ok(Value::Object(answer))
}

fn bad(reason: String) -> Issue {
    Issue::BadChat { reason }
}
