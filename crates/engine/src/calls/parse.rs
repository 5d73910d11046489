//! Reading a model's answer and a dataset's expected one: the calls and reasoning an answer holds,
//! a tools list as a user gives it, and the per-tool rows an expected answer counts in.

use serde_json::Value;

use crate::dataset::{THINK_END, THINK_START, TOOL_CALL_END, TOOL_CALL_START};

/// The calls of an answer: the JSON list between the first `<tool_call>` and the `</tool_call>`
/// after it.
pub fn parse_calls(text: &str) -> Option<Vec<Value>> {
    let (_, rest) = text.split_once(TOOL_CALL_START)?;
    let (body, _) = rest.split_once(TOOL_CALL_END)?;
    match serde_json::from_str(body.trim()).ok()? {
        Value::Array(calls) => Some(calls),
        _ => None,
    }
}

/// The reasoning of an answer: the text between `<think>` and `</think>`, when there is any.
pub fn parse_reasoning(text: &str) -> Option<&str> {
    let (_, rest) = text.split_once(THINK_START)?;
    let (reasoning, _) = rest.split_once(THINK_END)?;
    Some(reasoning.trim()).filter(|r| !r.is_empty())
}

/// Tool schemas as `needle run` and the Try panel take them: JSON text holding a list.
pub fn parse_tools(text: &str) -> Result<Value, String> {
    match serde_json::from_str::<Value>(text) {
        Ok(tools) if tools.is_array() => Ok(tools),
        Ok(other) => Err(format!(
            "the tools are a JSON {}, not a list of tool schemas as a dataset line's \"tools\"",
            crate::pyjson::kind_of(&other)
        )),
        Err(error) => Err(format!(
            "the tools are not JSON ({error}); give the list of tool schemas a dataset line's \"tools\" holds"
        )),
    }
}

/// The name under which an example counts in the per-tool table.
pub const NO_CALL: &str = "(no call)";

/// The name under which an example whose expected answer is not a JSON list counts (always wrong).
pub const UNREADABLE: &str = "(expected answer not a JSON list)";

/// The rows of the per-tool table an example counts in: the distinct tool names its expected
/// answer calls, [`NO_CALL`] when it calls none, [`UNREADABLE`] when it is not a JSON list.
pub(super) fn tool_names(expected: Option<&[Value]>) -> Vec<String> {
    let Some(calls) = expected else { return vec![UNREADABLE.to_string()] };
    let mut names: Vec<String> =
        calls.iter().filter_map(|call| call.get("name").and_then(Value::as_str)).map(str::to_string).collect();
    names.sort();
    names.dedup();
    if names.is_empty() {
        names.push(NO_CALL.into());
    }
    names
}
