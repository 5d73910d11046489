//! What the model is asked for, and how its answer is read: the reference's `_GEN_SYSTEM`,
//! `_GEN_TEMPLATE` and `_parse_array`, in our own words.

use serde_json::{json, Value};

use crate::dataset::RowCategory;
use crate::suite::Category;

use super::mix::{Mix, Quotas};

/// Off-topic inputs asked for in each batch, as the reference asks.
pub const REFUSALS_PER_BATCH: usize = 3;

const SYSTEM: &str = "You write training examples for a model that calls tools and extracts records. Given \
tool or record schemas, you write realistic, varied inputs, each paired with the exact calls that serve it. \
You answer with JSON only.";

/// The chat messages asking for `n` examples of `tools`, in `mix`'s shares when it sets any.
pub fn messages(tools: &Value, n: usize, mix: &Mix) -> Value {
    // Pretty-printed with two spaces, as the reference's `json.dumps(tools, indent=2)`.
    let tools = serde_json::to_string_pretty(tools).unwrap_or_else(|_| tools.to_string());
    let mix = mix_rule(mix, n);
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
{mix}
- Vary the wording, the values and which schemas are used. Answer with the JSON array and nothing else."#
    );
    json!([{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}])
}

/// The rule on categories: the reference's loose mix, or the counts `mix` sets for a batch of `n`.
fn mix_rule(mix: &Mix, n: usize) -> String {
    if !mix.is_set() {
        return format!(
            "- Mix examples with one call and with several, and include about {REFUSALS_PER_BATCH} inputs that no \
             schema\n  can serve (their \"answers\" is [])."
        );
    }
    let quotas = Quotas::new(mix, n);
    let described = |category: RowCategory| match category {
        RowCategory::Positive => "with one call",
        RowCategory::Parallel => "with two or more calls (one request asking for several things at once)",
        RowCategory::NoCall => "that must get no call (their \"answers\" is [])",
    };
    let mut parts: Vec<String> = RowCategory::ALL
        .into_iter()
        .filter_map(|category| Some(format!("{} {}", quotas.fixed(category)?, described(category))))
        .collect();
    let unset: Vec<&str> = RowCategory::ALL.into_iter().filter(|&c| quotas.fixed(c).is_none()).map(described).collect();
    if !unset.is_empty() && quotas.rest() > 0 {
        parts.push(format!("{} {}", quotas.rest(), unset.join(" or ")));
    }
    let mut rule = format!("- Of the {n} examples, write {}.", parts.join(", "));
    if quotas.fixed(RowCategory::NoCall).is_some_and(|count| count > 0) {
        rule.push_str(
            "\n- The examples with no call are requests a careful assistant declines, about as many of each kind: \
             one that\n  leaves out a value a schema requires, one that says not to do something (\"don't ...\"), \
             one that asks\n  for a value outside a schema's enum or bounds, and one that no schema serves.",
        );
    }
    rule
}

/// The chat messages asking for acceptance cases of `tools`: `lacking` holds how many of each
/// category.
pub fn suite_messages(tools: &Value, lacking: &[(Category, usize)]) -> Value {
    let tools = serde_json::to_string_pretty(tools).unwrap_or_else(|_| tools.to_string());
    let counts: Vec<String> =
        lacking.iter().map(|&(category, n)| format!("- {n} {category}: {}", suite_category(category))).collect();
    let user = format!(
        r#"The schemas (JSON):
{tools}

Write test cases for an assistant that answers a request with calls of these schemas, or with no call
when it should hold back. Answer with one JSON array; each element is an object of this shape:
  {{"query": "<a request a user would make>", "category": "<its category>",
    "calls": [{{"name": "<a schema's name>", "arguments": {{...}}}}]}}

Write exactly these cases:
{counts}

Rules:
- Calls follow the schemas exactly: enum values as the schema writes them, numbers within their bounds, every
  required argument given, and every value stated in the query.
- Every query differs from the others; vary the wording, the values and which schemas are used.
- Answer with the JSON array and nothing else."#,
        counts = counts.join("\n")
    );
    json!([{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}])
}

/// What a case of `category` is, as the request for cases says it.
fn suite_category(category: Category) -> &'static str {
    match category {
        Category::Positive => {
            "a request one schema serves with every required value said; \"calls\" holds that one call"
        }
        Category::Missing => {
            "a request for a schema's action that leaves out a value the schema requires; \"calls\" is []"
        }
        Category::Irrelevant => "a request in the same setting that no schema serves; \"calls\" is []",
        Category::Negation => "a request that says not to do what a schema does (\"don't ...\"); \"calls\" is []",
        Category::Invalid => {
            "a request for a schema's action with a value outside its enum or its bounds; \"calls\" is []"
        }
        Category::Parallel => "one request asking for two actions at once; \"calls\" holds both calls",
    }
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
        let messages = messages(&tools, 7, &Mix::default());
        let user = messages[1]["content"].as_str().unwrap();
        assert!(user.contains("\"name\": \"set_alarm\""));
        assert!(user.contains("Write 7 different examples"));
        assert!(user.contains("about 3 inputs that no schema"));
        assert_eq!(messages[0]["role"], "system");
    }

    #[test]
    fn a_suite_request_asks_for_each_lacking_category_by_name() {
        let tools = json!([{"name": "set_alarm", "parameters": {"type": "object"}}]);
        let messages = suite_messages(&tools, &[(Category::Missing, 4), (Category::Parallel, 2)]);
        let user = messages[1]["content"].as_str().unwrap();
        assert!(user.contains("- 4 missing: a request for a schema's action that leaves out"), "{user}");
        assert!(user.contains("- 2 parallel: one request asking for two actions"), "{user}");
        assert!(!user.contains("positive") && user.contains("\"name\": \"set_alarm\""), "{user}");
    }

    #[test]
    fn a_set_mix_asks_for_its_counts_and_each_kind_of_request_to_decline() {
        let tools = json!([{"name": "set_alarm", "parameters": {"type": "object"}}]);
        let user = |mix: Mix| messages(&tools, 20, &mix)[1]["content"].as_str().unwrap().to_owned();
        let negative = user(Mix { negative: Some(0.3), parallel: None });
        assert!(negative.contains("- Of the 20 examples, write 6 that must get no call"), "{negative}");
        assert!(negative.contains("14 with one call or with two or more calls"), "{negative}");
        assert!(negative.contains("leaves out a value a schema requires") && negative.contains("don't"), "{negative}");
        assert!(!negative.contains("about 3 inputs"), "the reference's loose rule is replaced");
        let both = user(Mix { negative: Some(0.25), parallel: Some(0.25) });
        assert!(both.contains("write 5 with two or more calls"), "{both}");
        assert!(both.contains("5 that must get no call") && both.contains("10 with one call."), "{both}");
        let no_negatives = user(Mix { negative: Some(0.0), parallel: Some(0.1) });
        assert!(!no_negatives.contains("declines"), "{no_negatives}");
    }
}
