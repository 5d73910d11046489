use super::*;
use serde_json::json;

fn tools() -> Value {
    json!([{"name": "set_alarm", "parameters": {"type": "object",
        "properties": {"time": {"type": "string"}, "days": {"type": "integer"}}, "required": ["time"]}}])
}

fn verdict(row: Value, seen: &mut HashSet<(String, String)>) -> Result<Vec<Kind>, &'static str> {
    row_verdict(row, &tools(), seen).map(|good| {
        assert_eq!(good.row["tools"], tools(), "a row without tools gets the batch's");
        good.advice
    })
}

#[test]
fn good_rows_are_kept_once_and_schema_breakers_are_refused_by_reason() {
    let mut seen = HashSet::new();
    let good = json!({"query": "Wake me at 7:30", "answers": [{"name": "set_alarm", "arguments": {"time": "7:30"}}]});
    assert_eq!(verdict(good.clone(), &mut seen), Ok(vec![]));
    let mut shouted = good.clone();
    shouted["query"] = json!("  WAKE me at 7:30 ");
    assert_eq!(verdict(shouted, &mut seen), Err("duplicate_row"));
    let missing = json!({"query": "Wake me", "answers": [{"name": "set_alarm", "arguments": {}}]});
    assert_eq!(verdict(missing, &mut seen), Err("missing_argument"));
    let unknown = json!({"query": "Play jazz", "answers": [{"name": "play", "arguments": {}}]});
    assert_eq!(verdict(unknown, &mut seen), Err("unknown_tool"));
    let typed = json!({"query": "at 7 for 2 days", "answers": [{"name": "set_alarm", "arguments": {"time": "7", "days": "2"}}]});
    assert_eq!(verdict(typed, &mut seen), Err("wrong_type"));
    assert_eq!(verdict(json!({"query": "no answers"}), &mut seen), Err("not_an_example"));
    assert_eq!(verdict(json!(["not", "an", "object"]), &mut seen), Err("not_an_example"));
}

#[test]
fn ungrounded_values_are_kept_as_advice() {
    let row = json!({"query": "Wake me at seven", "answers": [{"name": "set_alarm", "arguments": {"time": "07:00"}}]});
    assert_eq!(verdict(row, &mut HashSet::new()), Ok(vec![Kind::Ungrounded]));
}

#[test]
fn openrouter_without_a_key_names_the_variables() {
    let error = GenerateError::NoKey { url: DEFAULT_ENDPOINT.into() }.to_string();
    assert!(
        error.contains("OPENROUTER_API_KEY") && error.contains("OPENAI_API_KEY") && error.contains("OPENROUTER_URL")
    );
}
