//! The temporal grounding check of cactus-needle 3.x (`_annotate_ungrounded` and the helpers it
//! calls, in `needle/__init__.py`): when the query writes a year, a `date` or `date-time` argument
//! whose year is neither one the query writes nor, for a query that reasons relatively ("next
//! Friday"), one the system prompt writes, is ungrounded. A query that writes no year checks
//! nothing. The patterns are the reference's; their digits are ASCII (Python's `\d` also takes
//! other scripts' digits, which no date argument carries).

use std::collections::BTreeSet;
use std::sync::LazyLock;

use fancy_regex::Regex as Backtracking;
use regex::Regex;
use serde_json::Value;

use super::schema::{find_tool, parameters, Call};

const MONTHS: &str = r"(?:jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|jun(?:e)?|jul(?:y)?|aug(?:ust)?|sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)\.?";

/// `_source_years`'s patterns; each one's first group is a year.
static YEAR_PATTERNS: LazyLock<Vec<Backtracking>> = LazyLock::new(|| {
    // The number after a day and month is its year, unless it is the hour of a time ("5 June
    // 19:30", "June 5 7 pm").
    let not_a_time = r"(?![0-9A-Za-z]|:[0-9]|\s*[ap]\.?m\b)";
    [
        format!(r"\b[0-9]{{1,2}}(?:st|nd|rd|th)?\s+{MONTHS}[\s,]+([0-9]{{1,4}}){not_a_time}"),
        format!(r"\b{MONTHS}\s+[0-9]{{1,2}}(?:st|nd|rd|th)?\s*,?\s+([0-9]{{1,4}}){not_a_time}"),
        format!(r"\b{MONTHS}[\s,]+([0-9]{{3,4}})(?![0-9A-Za-z])"),
        r"\byear\s+([0-9]{1,4})(?![0-9A-Za-z])".to_string(),
        // Year-first numeric dates only (2024-03-15, 2024/03/15): a day- or month-first one's
        // leading number is no year.
        r"(?<![0-9])([0-9]{4})(?=[-/][0-9]{1,2}[-/][0-9]{1,2}(?![0-9]))".to_string(),
    ]
    .iter()
    .map(|pattern| Backtracking::new(pattern).expect("the reference's year patterns compile"))
    .collect()
});

/// `_RELATIVE_CUE`: words that make a date relative to today.
static RELATIVE_CUE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?i)\b(today|tonight|tomorrow|yesterday|next|this|coming|now|in [0-9]+ (?:days?|weeks?|months?|years?)|monday|tuesday|wednesday|thursday|friday|saturday|sunday)\b",
    )
    .expect("the relative cue compiles")
});

/// The years `text` writes (`_source_years`).
pub fn source_years(text: &str) -> BTreeSet<i64> {
    let lowered = text.to_lowercase();
    let mut years = BTreeSet::new();
    for pattern in YEAR_PATTERNS.iter() {
        // A pattern that backtracks too long on hostile text licenses nothing from it.
        for found in pattern.captures_iter(&lowered).map_while(Result::ok) {
            if let Some(year) = found.get(1).and_then(|year| year.as_str().parse().ok()) {
                years.insert(year);
            }
        }
    }
    years
}

/// The years a date argument may carry (`_licensed_years`): those the query writes, and when it
/// writes one and reasons relatively, those of the system prompt too.
fn licensed_years(query: &str, system: &str) -> BTreeSet<i64> {
    let mut years = source_years(query);
    if !years.is_empty() && !system.is_empty() && RELATIVE_CUE.is_match(query) {
        years.extend(source_years(system));
    }
    years
}

/// A call's ungrounded argument: its path and the year it carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ungrounded {
    pub argument: String,
    pub year: i64,
}

/// For each of `calls`, its first ungrounded argument (in path order), if any
/// (`_annotate_ungrounded`); a call to a tool `tools` does not hold is not checked.
pub fn ungrounded(tools: &[Value], calls: &[Call], query: &str, system: &str) -> Vec<Option<Ungrounded>> {
    let years = licensed_years(query, system);
    calls
        .iter()
        .map(|call| {
            let tool = find_tool(tools, &call.name).filter(|_| !years.is_empty())?;
            let root = parameters(tool);
            let mut failures = Vec::new();
            walk(&Value::Object(call.arguments.clone()), root, root, String::new(), &years, &mut failures);
            failures.into_iter().min_by(|a, b| a.argument.cmp(&b.argument))
        })
        .collect()
}

/// `_walk_grounding`'s `walk`: dates checked where the schema says `format: date` or `date-time`,
/// objects and lists followed down their schema.
fn walk(
    value: &Value,
    node: &Value,
    root: &Value,
    path: String,
    years: &BTreeSet<i64>,
    failures: &mut Vec<Ungrounded>,
) {
    let mut node = resolve_ref(node, root);
    let variants = node.get("anyOf").or_else(|| node.get("oneOf")).and_then(Value::as_array);
    let concrete: Vec<&Value> = (variants.into_iter().flatten())
        .filter(|variant| resolve_ref(variant, root).get("type").and_then(Value::as_str) != Some("null"))
        .collect();
    if let [only] = concrete.as_slice() {
        node = resolve_ref(only, root);
    }
    let format = node.get("format").and_then(Value::as_str);
    if let (Some("date" | "date-time"), Value::String(text)) = (format, value) {
        let year = text.get(..5).filter(|head| head.ends_with('-') && head[..4].bytes().all(|b| b.is_ascii_digit()));
        if let Some(year) = year.and_then(|head| head[..4].parse().ok()) {
            if !years.contains(&year) {
                failures.push(Ungrounded { argument: path, year });
            }
        }
        return;
    }
    match value {
        Value::Object(fields) => {
            let properties = node.get("properties");
            for (key, item) in fields {
                if let Some(schema) = properties.and_then(|p| p.get(key)) {
                    let at = if path.is_empty() { key.clone() } else { format!("{path}.{key}") };
                    walk(item, schema, root, at, years, failures);
                }
            }
        }
        Value::Array(items) => {
            if let Some(schema) = node.get("items") {
                for (index, item) in items.iter().enumerate() {
                    walk(item, schema, root, format!("{path}[{index}]"), years, failures);
                }
            }
        }
        _ => {}
    }
}

/// `_resolve_ref`: `node` with its `$ref` (`#/…` inside `root`) followed, a cycle broken.
fn resolve_ref<'a>(mut node: &'a Value, root: &'a Value) -> &'a Value {
    static MISSING: Value = Value::Null;
    let mut seen = BTreeSet::new();
    while let Some(reference) = node.get("$ref").and_then(Value::as_str) {
        if !seen.insert(reference) {
            break;
        }
        let mut target = root;
        for part in reference.strip_prefix("#/").unwrap_or(reference).split('/') {
            target = target.get(part.replace("~1", "/").replace("~0", "~")).unwrap_or(&MISSING);
        }
        if std::ptr::eq(target, node) {
            break;
        }
        node = target;
    }
    node
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn years_are_read_as_the_reference_reads_them() {
        let years = |text: &str| source_years(text).into_iter().collect::<Vec<_>>();
        assert_eq!(years("on 5 June 2025"), [2025]);
        assert_eq!(years("June 5th, 2024 please"), [2024]);
        assert_eq!(years("in March 2023"), [2023]);
        assert_eq!(years("the year 1999"), [1999]);
        assert_eq!(years("from 2024-03-15 to 2024/3/16"), [2024]);
        assert!(years("5 June 19:30").is_empty(), "an hour, not a year");
        assert!(years("June 5 7 pm").is_empty(), "an hour, not a year");
        assert!(years("on 5/6/24").is_empty(), "a day-first date mints no year");
        assert!(years("room 2024 at 10").is_empty(), "a bare number is no year");
        assert!(years("12024-03-15").is_empty(), "five digits before the dash");
    }

    fn tools() -> Vec<Value> {
        vec![
            json!({"name": "book", "parameters": {"type": "object", "$defs": {"Day": {"type": "string", "format": "date"}},
            "properties": {
                "day": {"type": "string", "format": "date"},
                "at": {"anyOf": [{"type": "string", "format": "date-time"}, {"type": "null"}]},
                "also": {"type": "array", "items": {"$ref": "#/$defs/Day"}},
                "note": {"type": "string"}
            }}}),
        ]
    }

    fn check(arguments: Value, query: &str, system: &str) -> Vec<Option<Ungrounded>> {
        let call = Call { name: "book".into(), arguments: arguments.as_object().unwrap().clone() };
        ungrounded(&tools(), &[call], query, system)
    }

    fn flagged(argument: &str, year: i64) -> Vec<Option<Ungrounded>> {
        vec![Some(Ungrounded { argument: argument.into(), year })]
    }

    #[test]
    fn a_date_whose_year_the_input_does_not_write_is_ungrounded() {
        let query = "book it for 5 June 2025";
        assert_eq!(check(json!({"day": "2025-06-05"}), query, ""), [None]);
        assert_eq!(check(json!({"day": "2024-06-05"}), query, ""), flagged("day", 2024));
        assert_eq!(check(json!({"at": "2023-06-05T10:00"}), query, ""), flagged("at", 2023), "through anyOf");
        assert_eq!(
            check(json!({"also": ["2025-01-01", "2026-01-01"]}), query, ""),
            flagged("also[1]", 2026),
            "through $ref"
        );
        assert_eq!(check(json!({"note": "2024-06-05"}), query, ""), [None], "not a date argument");
        assert_eq!(check(json!({"day": "tomorrow"}), query, ""), [None], "no year in the value");
        // Both flagged; the first in path order is reported.
        assert_eq!(check(json!({"day": "2020-01-01", "at": "2021-01-01"}), query, ""), flagged("at", 2021));
    }

    #[test]
    fn without_a_year_in_the_query_nothing_is_checked_and_the_system_licenses_only_relative_queries() {
        let system = "date: 2026-12-07 Mon 16:30";
        assert_eq!(check(json!({"day": "2019-06-05"}), "book it for next friday", system), [None], "no year written");
        let relative = "book it for next friday, not 5 June 2025";
        assert_eq!(
            check(json!({"day": "2026-12-11"}), relative, system),
            [None],
            "the system's year, for a relative query"
        );
        let absolute = "book it on 5 June 2025";
        assert_eq!(check(json!({"day": "2026-06-05"}), absolute, system), flagged("day", 2026));
        assert_eq!(check(json!({"day": "2026-12-11"}), relative, ""), flagged("day", 2026), "no system prompt");
    }
}
