//! What the model is asked for, and how its answer is read: the reference's `_GEN_SYSTEM`,
//! `_GEN_TEMPLATE` and `_parse_array`, in our own words.

use serde_json::{json, Value};

/// Off-topic inputs asked for in each batch, as the reference asks.
pub const REFUSALS_PER_BATCH: usize = 3;

const SYSTEM: &str = "You write training examples for a model that calls tools and extracts records. Given \
tool or record schemas, you write realistic, varied inputs, each paired with the exact calls that serve it. \
You answer with JSON only.";

/// The chat messages asking for `n` examples of `tools`.
pub fn messages(tools: &Value, n: usize) -> Value {
    // Pretty-printed with two spaces, as the reference's `json.dumps(tools, indent=2)`.
    let tools = serde_json::to_string_pretty(tools).unwrap_or_else(|_| tools.to_string());
    let user = format!(
        r#"The schemas (JSON):
{tools}

Write {n} different examples as one JSON array. Each element is an object of this shape:
  {{"query": "<a request a user would make, or a passage of text to extract from>",
    "reasoning": "<one short line showing where in the query each argument's value comes from>",
    "answers": [{{"name": "<a schema's name>", "arguments": {{...}}}}]}}

Rules:
- Call only the schemas above, with arguments that follow them exactly; every argument's value must be
  stated in the query.
- When a schema is an action, the query asks for it. When a schema describes a record (its fields describe
  an entity), the query is a natural passage that holds those fields and the call extracts them.
- Mix examples with one call and with several, and include about {REFUSALS_PER_BATCH} inputs that no schema
  can serve (their "answers" is []).
- Vary the wording, the values and which schemas are used. Answer with the JSON array and nothing else."#
    );
    json!([{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}])
}

/// The JSON array in a reply, from its first `[` to its last `]` (prose or a code fence around it is
/// skipped); `None` when there is none or it does not parse (a truncated reply).
pub fn parse_array(reply: &str) -> Option<Vec<Value>> {
    let (start, end) = (reply.find('[')?, reply.rfind(']')?);
    if end <= start {
        return None;
    }
    match serde_json::from_str(&reply[start..=end]) {
        Ok(Value::Array(rows)) => Some(rows),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_array_is_found_inside_prose_and_fences() {
        let reply = "Sure! Here they are:\n```json\n[{\"query\": \"hi\", \"answers\": []}]\n```\nEnjoy.";
        assert_eq!(parse_array(reply), Some(vec![json!({"query": "hi", "answers": []})]));
    }

    #[test]
    fn truncated_or_missing_arrays_are_none() {
        assert_eq!(parse_array("[{\"query\": \"hi\", \"answers\": [{\"name\": \"x\""), None);
        assert_eq!(parse_array("no JSON here"), None);
        assert_eq!(parse_array("] backwards ["), None);
    }

    #[test]
    fn the_prompt_carries_the_tools_the_count_and_the_rules() {
        let tools = json!([{"name": "set_alarm", "parameters": {"type": "object"}}]);
        let messages = messages(&tools, 7);
        let user = messages[1]["content"].as_str().unwrap();
        assert!(user.contains("\"name\": \"set_alarm\""));
        assert!(user.contains("Write 7 different examples"));
        assert!(user.contains("about 3 inputs that no schema"));
        assert_eq!(messages[0]["role"], "system");
    }
}
