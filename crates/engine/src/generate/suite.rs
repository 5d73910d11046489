//! An acceptance suite for the user's tools, written by the LLM that writes their rows: cases in
//! the six categories in upstream's proportions (18 positive, 4 missing, 3 irrelevant, 3 negation,
//! 2 invalid, 2 parallel per 32), critical where upstream marks them. Every case is checked before
//! it is kept: its calls fit the tools' schemas (bounds included) and take their values from the
//! query, their number fits the category, and its query is new (no other case's, no training
//! row's: a suite that repeats the data measures memory, not the model). Requests go one at a
//! time, each asking for the cases still missing, until the suite is whole or the tries run out.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::Value;

use crate::checks::schema::check_call;
use crate::dataset::{check_row, query_key, Example, Kind};
use crate::generation::Generation;
use crate::suite::{Case, Category, Suite};

use super::client::{self, Endpoint, RequestError};
use super::error::GenerateError;
use super::event::GenerateEvent;
use super::prompt;

/// Upstream's suites have 32 cases.
pub const DEFAULT_SUITE_CASES: usize = 32;

/// Requests asked for one suite before it is written with what it has.
const SUITE_REQUESTS: usize = 8;

/// Why a reply's case was not kept.
const UNREADABLE_REPLY: &str = "unreadable_reply";
const NOT_A_CASE: &str = "not_a_case";
const UNKNOWN_CATEGORY: &str = "unknown_category";
const CALL_OUTSIDE_SCHEMA: &str = "call_outside_schema";
const CALLS_UNFIT_FOR_CATEGORY: &str = "calls_unfit_for_category";
const REPEATED_QUERY: &str = "repeated_query";
const CATEGORY_FULL: &str = "category_full";

/// What suite to write, and who writes it.
#[derive(Debug, Clone)]
pub struct SuiteRequest<'a> {
    pub name: &'a str,
    /// The tool schemas, as a JSON list.
    pub tools: &'a Value,
    pub cases: usize,
    /// Queries no case may have (the training rows'), as [`crate::dataset::query_key`] gives them.
    pub avoid: &'a HashSet<String>,
    pub model: &'a str,
    pub timeout: Duration,
}

/// The suite written, and what it cost.
#[derive(Debug, Clone, serde::Serialize)]
pub struct GeneratedSuite {
    #[serde(skip)]
    pub suite: Suite,
    /// Cases asked for and written, per category (an invalid case needs a tool with an enum or a
    /// bound: without one, none is asked for).
    pub wanted: BTreeMap<Category, usize>,
    pub written: BTreeMap<Category, usize>,
    pub failed_requests: usize,
    pub rejected: BTreeMap<&'static str, usize>,
    pub cancelled: bool,
}

/// The cases per category for a suite of `cases`: upstream's proportions scaled (largest
/// remainders), none invalid when `bounded` is false (no tool has an enum or a bound to break).
pub fn category_counts(cases: usize, bounded: bool) -> BTreeMap<Category, usize> {
    let categories: Vec<Category> = Category::ALL.into_iter().filter(|&c| bounded || c != Category::Invalid).collect();
    let per: usize = categories.iter().map(|c| c.upstream_cases()).sum();
    let mut counts: BTreeMap<Category, usize> =
        categories.iter().map(|&c| (c, cases * c.upstream_cases() / per)).collect();
    let mut by_remainder = categories.clone();
    // Stable: of equal remainders, the first in upstream's order gets the case.
    by_remainder.sort_by_key(|c| std::cmp::Reverse(cases * c.upstream_cases() % per));
    let short = cases - counts.values().sum::<usize>();
    for category in by_remainder.into_iter().take(short) {
        *counts.entry(category).or_default() += 1;
    }
    counts
}

/// Whether a schema anywhere in `tools` sets an `enum` or a bound a value could break.
fn bounded(tools: &Value) -> bool {
    const LIMITS: [&str; 5] = ["enum", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"];
    match tools {
        Value::Object(map) => map.iter().any(|(key, value)| match (key.as_str(), value) {
            // Argument names, not keywords: an argument may be called "minimum".
            ("properties", Value::Object(arguments)) => arguments.values().any(bounded),
            _ => LIMITS.contains(&key.as_str()) || bounded(value),
        }),
        Value::Array(items) => items.iter().any(bounded),
        _ => false,
    }
}

/// Asks for the suite `request` describes; a cancel, a refused key or the tries running out
/// leave it with the cases kept so far. No case at all is an error.
pub fn generate_suite(
    request: &SuiteRequest,
    endpoint: &Endpoint,
    cancel: &AtomicBool,
    mut on_event: impl FnMut(&GenerateEvent),
) -> Result<GeneratedSuite, GenerateError> {
    if request.cases == 0 {
        return Err(GenerateError::Zero { what: "--suite-cases" });
    }
    let tools = request.tools.as_array().cloned().unwrap_or_default();
    let wanted = category_counts(request.cases, bounded(request.tools));
    let agent = client::agent(request.timeout);
    let mut cases: Vec<Case> = Vec::new();
    let mut seen: HashSet<String> = request.avoid.clone();
    let mut out = GeneratedSuite {
        suite: Suite { name: request.name.to_owned(), system: String::new(), tools: tools.clone(), cases: Vec::new() },
        written: BTreeMap::new(),
        wanted: wanted.clone(),
        failed_requests: 0,
        rejected: BTreeMap::new(),
        cancelled: false,
    };
    let mut last_failure = None;
    for _ in 0..SUITE_REQUESTS {
        if cancel.load(Ordering::Relaxed) {
            out.cancelled = true;
            break;
        }
        let lacking: Vec<(Category, usize)> = (wanted.iter())
            .map(|(&category, &count)| (category, count - out.written.get(&category).copied().unwrap_or(0)))
            .filter(|&(_, count)| count > 0)
            .collect();
        if lacking.is_empty() {
            break;
        }
        let messages = prompt::suite_messages(request.tools, &lacking);
        match client::complete(&agent, endpoint, request.model, &messages, cancel) {
            Ok(reply) => keep_cases(&reply, &tools, &wanted, &mut seen, &mut cases, &mut out),
            Err(RequestError::Refused { status, body }) => {
                return Err(GenerateError::Refused { url: endpoint.url.clone(), status, body })
            }
            Err(RequestError::Failed(message)) => {
                out.failed_requests += 1;
                on_event(&GenerateEvent::RequestFailed { message: message.clone() });
                last_failure = Some(message);
            }
            Err(RequestError::Cancelled) => {}
        }
        on_event(&GenerateEvent::SuiteProgress {
            cases: cases.len(),
            wanted: request.cases,
            failed_requests: out.failed_requests,
            rejected: out.rejected.clone(),
        });
    }
    if cases.is_empty() {
        return Err(match last_failure {
            Some(last) => GenerateError::NothingGenerated { failed: out.failed_requests, last },
            None => GenerateError::NoCase { rejected: out.rejected.iter().map(|(r, n)| format!("{n} {r}")).collect() },
        });
    }
    // In upstream's order: the positive cases first, then each kind of refusal, then the parallel.
    cases.sort_by_key(|case| case.category);
    out.suite.cases = cases;
    Ok(out)
}

/// Reads one reply's cases into `cases`, each checked, counting the others by reason.
fn keep_cases(
    reply: &str,
    tools: &[Value],
    wanted: &BTreeMap<Category, usize>,
    seen: &mut HashSet<String>,
    cases: &mut Vec<Case>,
    out: &mut GeneratedSuite,
) {
    let Some(replied) = prompt::parse_array(reply) else {
        *out.rejected.entry(UNREADABLE_REPLY).or_default() += 1;
        return;
    };
    for case in replied {
        match case_verdict(&case, tools) {
            Ok(case) if out.written.get(&case.category) >= wanted.get(&case.category) => {
                *out.rejected.entry(CATEGORY_FULL).or_default() += 1;
            }
            Ok(case) if !seen.insert(query_key(&case.query)) => {
                *out.rejected.entry(REPEATED_QUERY).or_default() += 1;
            }
            Ok(case) => {
                *out.written.entry(case.category).or_default() += 1;
                cases.push(case);
            }
            Err(reason) => *out.rejected.entry(reason).or_default() += 1,
        }
    }
}

/// One replied case as the suite will hold it, or why it is not kept: its category known, its
/// calls fitting their schemas and their number the category, their values said in the query.
fn case_verdict(case: &Value, tools: &[Value]) -> Result<Case, &'static str> {
    let query = case.get("query").and_then(Value::as_str).filter(|q| !q.trim().is_empty()).ok_or(NOT_A_CASE)?;
    let Some(Value::Array(given)) = case.get("calls") else { return Err(NOT_A_CASE) };
    let category = case.get("category").and_then(Value::as_str).ok_or(NOT_A_CASE)?;
    let category = Category::ALL.into_iter().find(|c| c.name() == category).ok_or(UNKNOWN_CATEGORY)?;
    if !category.fits_calls(given.len()) {
        return Err(CALLS_UNFIT_FOR_CATEGORY);
    }
    let calls = given.iter().map(|call| check_call(tools, call)).collect::<Result<Vec<_>, _>>();
    let calls = calls.map_err(|_| CALL_OUTSIDE_SCHEMA)?;
    // The doctor's grounding: an expected value the query never says is the writer's guess.
    let row = serde_json::json!({"query": query, "tools": tools, "answers": given});
    let example = Example::from_object(row.as_object().ok_or(NOT_A_CASE)?, Generation::default());
    let example = example.map_err(|_| NOT_A_CASE)?;
    if let Some(issue) = check_row(&example).into_iter().find(|issue| issue.kind == Kind::Ungrounded) {
        return Err(issue.kind.name());
    }
    Ok(Case { query: query.to_owned(), calls, category, critical: category.critical() })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn thirty_two_cases_are_upstreams_and_other_sizes_keep_its_proportions() {
        let counts = |cases, bounded| category_counts(cases, bounded).into_values().collect::<Vec<_>>();
        assert_eq!(counts(32, true), [18, 4, 3, 3, 2, 2]);
        assert_eq!(counts(64, true), [36, 8, 6, 6, 4, 4]);
        assert_eq!(counts(16, true), [9, 2, 2, 1, 1, 1], "1.5 and 1.5: the first in upstream's order gets the case");
        assert_eq!(counts(5, true).iter().sum::<usize>(), 5);
        let unbounded = category_counts(30, false);
        assert!(!unbounded.contains_key(&Category::Invalid));
        assert_eq!(unbounded.values().sum::<usize>(), 30);
    }

    #[test]
    fn a_case_is_kept_only_when_its_calls_fit_the_schemas_the_category_and_the_query() {
        let tools = [json!({"name": "set_thermostat", "parameters": {"type": "object", "required": ["celsius"],
            "properties": {"celsius": {"type": "integer", "minimum": 10, "maximum": 30}}}})];
        let set = |celsius: i64| json!({"name": "set_thermostat", "arguments": {"celsius": celsius}});
        let case =
            |query: &str, category: &str, calls: Value| json!({"query": query, "category": category, "calls": calls});
        let kept = case_verdict(&case("Heat to 21", "positive", json!([set(21)])), &tools).unwrap();
        assert_eq!((kept.category, kept.critical, kept.calls.len()), (Category::Positive, false, 1));
        let negation = case_verdict(&case("Don't heat the house", "negation", json!([])), &tools).unwrap();
        assert!(negation.critical, "upstream marks negations critical");
        let refused = [
            (case("Heat to 40", "positive", json!([set(40)])), CALL_OUTSIDE_SCHEMA),
            (case("Heat to 21", "positive", json!([set(21), set(22)])), CALLS_UNFIT_FOR_CATEGORY),
            (case("Heat to 40", "invalid", json!([set(20)])), CALLS_UNFIT_FOR_CATEGORY),
            (case("Make it warmer", "positive", json!([set(22)])), "ungrounded"),
            (case("Heat to 21", "urgent", json!([set(21)])), UNKNOWN_CATEGORY),
            (json!({"query": " ", "category": "missing", "calls": []}), NOT_A_CASE),
            (json!({"query": "Heat", "category": "missing"}), NOT_A_CASE),
        ];
        for (given, reason) in refused {
            assert_eq!(case_verdict(&given, &tools).map(|case| case.query), Err(reason), "{given}");
        }
    }

    #[test]
    fn bounds_and_enums_are_found_at_any_depth() {
        let enum_inside = json!([{"name": "a", "parameters": {"properties": {"x": {"items": {"enum": [1]}}}}}]);
        assert!(bounded(&enum_inside));
        assert!(!bounded(&json!([{"name": "a", "parameters": {"properties": {"x": {"type": "string"}}}}])));
        let named_minimum = json!([{"name": "a", "parameters": {"properties": {"minimum": {"type": "number"}}}}]);
        assert!(!bounded(&named_minimum), "an argument named minimum bounds nothing");
    }
}
