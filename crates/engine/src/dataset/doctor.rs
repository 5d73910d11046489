//! The dataset doctor: what in a file will teach the model the wrong thing, row by row, and what to
//! fix first.
//!
//! Every answer is checked against its row's tool schemas ([`check_row`]); across the file, the
//! doctor finds repeated rows (exactly, as the reference's generator deduplicates: the query
//! lower-cased and the answers; and nearly: the same words in another order, case or punctuation),
//! counts the calls per tool and each category's rows (one call, parallel calls, no call), warns when
//! no row teaches the model to hold back, and names the rows that do not fit the sequence length. Findings are advice: [`Checkup::passes`] says which rows `needle data --fix`
//! keeps (those with no finding whose [`Kind::fails_row`]).

use super::lines::python_strip;
use super::schema::{answers_of, check_row, normalized, tools_of, Kind, RowIssue};
use super::Example;
use serde::Serialize;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// Fewer calls of a tool than this, and the doctor says it needs more examples.
pub const MIN_CALLS_PER_TOOL: usize = 10;

/// More than this share of rows calling nothing, and the doctor says so.
const MOSTLY_NO_CALL: f64 = 0.5;

/// How many lines a finding lists (its `count` has them all).
const KEPT_LINES: usize = 100;

/// How many lines a finding's sentence names.
const NAMED_LINES: usize = 5;

/// How many findings a checkup lists ([`Checkup::unlisted_findings`] counts the rest): one row
/// offering a million tools, each called too seldom, would otherwise make a million of them.
pub const KEPT_FINDINGS: usize = 50;

/// How many tools [`Checkup::calls_per_tool`] keeps, the most called first
/// ([`Checkup::unlisted_tools`] counts the rest).
pub const KEPT_TOOLS: usize = 100;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    /// `--fix` leaves these rows out.
    Error,
    /// Worth a look; the rows stay.
    Advice,
}

/// One kind of problem, about one tool and argument where it has them, and the rows that have it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Finding {
    pub kind: Kind,
    pub severity: Severity,
    pub tool: Option<String>,
    pub argument: Option<String>,
    /// How many rows (for `few_examples`: calls of the tool).
    pub count: usize,
    /// The rows' 1-based lines, the first [`KEPT_LINES`].
    pub lines: Vec<usize>,
    pub message: String,
}

/// The doctor's report on a file.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Checkup {
    /// One sentence: what to fix first.
    pub summary: String,
    /// Errors first, then advice; within each, in the order of [`Kind`]; the first [`KEPT_FINDINGS`].
    pub findings: Vec<Finding>,
    /// Findings past the first [`KEPT_FINDINGS`], not listed.
    pub unlisted_findings: usize,
    pub rows: usize,
    /// Rows with at least one error: what `--fix` leaves out.
    pub failing_rows: usize,
    /// The rows of each category a row shows by itself, in [`RowCategory`]'s order, every category listed.
    pub categories: Vec<CategoryShare>,
    /// The tools rows offer, with the number of calls of each in all the answers: the
    /// [`KEPT_TOOLS`] most called (of equals, the first by name).
    pub calls_per_tool: BTreeMap<String, usize>,
    /// Tools offered past those [`Checkup::calls_per_tool`] keeps.
    pub unlisted_tools: usize,
    #[serde(skip)]
    failing: BTreeSet<usize>,
}

/// What a row teaches, as far as the row itself tells: by its number of calls. A row with no call
/// may answer a request missing a required value, one no tool serves, a negated one or one outside a
/// tool's bounds (an acceptance suite's missing, irrelevant, negation and invalid cases), but its
/// answer is the same empty list for all four and nothing in the row says which it is: they are one
/// category here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RowCategory {
    /// One call.
    Positive,
    /// Two calls or more.
    Parallel,
    /// An empty list of calls: the model holds back.
    NoCall,
}

impl RowCategory {
    pub const ALL: [RowCategory; 3] = [RowCategory::Positive, RowCategory::Parallel, RowCategory::NoCall];

    /// The category of a row answered with `calls` calls.
    pub fn of(calls: usize) -> Self {
        match calls {
            0 => RowCategory::NoCall,
            1 => RowCategory::Positive,
            _ => RowCategory::Parallel,
        }
    }

    /// Its place in [`RowCategory::ALL`], to count categories in an array.
    pub fn index(self) -> usize {
        self as usize
    }
}

/// How many rows of a file are of one category, and their share of all its rows (rows whose
/// answers do not read are of none).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CategoryShare {
    pub category: RowCategory,
    pub rows: usize,
    pub share: f64,
}

/// A query as the reference generator's deduplication compares it: stripped and lower-cased.
pub fn query_key(query: &str) -> String {
    python_strip(query).1.to_lowercase()
}

/// The reference generator's deduplication key: the query stripped and lower-cased, and the answers
/// as JSON with sorted keys (their text as written when they are not JSON).
pub fn duplicate_key(example: &Example) -> (String, String) {
    let query = query_key(&example.query);
    let answers = match serde_json::from_str::<Value>(&example.answers) {
        Ok(value) => sorted_keys(value).to_string(),
        Err(_) => example.answers.clone(),
    };
    (query, answers)
}

fn sorted_keys(value: Value) -> Value {
    match value {
        Value::Object(map) => {
            let sorted: BTreeMap<String, Value> = map.into_iter().map(|(k, v)| (k, sorted_keys(v))).collect();
            Value::Object(sorted.into_iter().collect())
        }
        Value::Array(items) => Value::Array(items.into_iter().map(sorted_keys).collect()),
        other => other,
    }
}

/// The words of a query, sorted: two queries with the same key say the same thing.
fn near_key(query: &str) -> String {
    let text = normalized(query);
    let mut words: Vec<&str> = text.split_whitespace().collect();
    words.sort_unstable();
    words.join(" ")
}

impl Checkup {
    /// The doctor's report on `examples` (in file order), given the lines of those that do not fit
    /// the sequence length and how many lines of the file were not usable at all.
    pub fn new(examples: &[Example], too_long: &[usize], unusable_lines: usize) -> Self {
        let mut rows_with: BTreeMap<RowIssue, Vec<usize>> = BTreeMap::new();
        let mut note = |issue: RowIssue, line: usize| {
            let lines = rows_with.entry(issue).or_default();
            if lines.last() != Some(&line) {
                lines.push(line);
            }
        };
        let mut exact = HashMap::new();
        let mut near = HashMap::new();
        let mut calls_per_tool: BTreeMap<String, usize> = BTreeMap::new();
        let mut callers: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        let mut without_call = Vec::new();
        let mut categories = [0; RowCategory::ALL.len()];
        for example in examples {
            let line = example.line;
            for issue in check_row(example) {
                note(issue, line);
            }
            let repeat = exact.insert(duplicate_key(example), line).is_some();
            if repeat {
                note(RowIssue { kind: Kind::DuplicateRow, tool: None, argument: None }, line);
            }
            if near.insert(near_key(&example.query), line).is_some() && !repeat {
                note(RowIssue { kind: Kind::NearDuplicate, tool: None, argument: None }, line);
            }
            for tool in tools_of(example) {
                if let Some(name) = tool.get("name").and_then(Value::as_str) {
                    calls_per_tool.entry(name.to_owned()).or_default();
                }
            }
            // Unreadable answers are an error of their own, not a row that holds back.
            let calls = answers_of(example);
            if let Some(calls) = &calls {
                categories[RowCategory::of(calls.len()).index()] += 1;
            }
            if calls.as_ref().is_some_and(Vec::is_empty) {
                without_call.push(line);
            }
            for name in calls.iter().flatten().filter_map(|call| call.get("name")?.as_str()) {
                *calls_per_tool.entry(name.to_owned()).or_default() += 1;
                callers.entry(name.to_owned()).or_default().push(line);
            }
        }
        for &line in too_long {
            note(RowIssue { kind: Kind::TooLong, tool: None, argument: None }, line);
        }
        let failing: BTreeSet<usize> = rows_with
            .iter()
            .filter(|(issue, _)| issue.kind.fails_row())
            .flat_map(|(_, lines)| lines)
            .copied()
            .collect();
        // Only the first KEPT_FINDINGS of a kind can be listed: the others are counted, not written.
        let mut per_kind: BTreeMap<Kind, usize> = BTreeMap::new();
        let mut unlisted_findings = 0;
        let mut listed = |kind: Kind| {
            let seen = per_kind.entry(kind).or_default();
            *seen += 1;
            unlisted_findings += usize::from(*seen > KEPT_FINDINGS);
            *seen <= KEPT_FINDINGS
        };
        let mut findings: Vec<Finding> = rows_with
            .into_iter()
            .filter(|(issue, _)| listed(issue.kind))
            .map(|(issue, lines)| finding(issue, lines.len(), lines))
            .collect();
        for (tool, &calls) in calls_per_tool.iter().filter(|(_, &calls)| calls < MIN_CALLS_PER_TOOL) {
            if listed(Kind::FewExamples) {
                let issue = RowIssue { kind: Kind::FewExamples, tool: Some(tool.clone()), argument: None };
                findings.push(finding(issue, calls, callers.remove(tool).unwrap_or_default()));
            }
        }
        let rows = examples.len();
        let share = |count: usize| if rows == 0 { 0.0 } else { count as f64 / rows as f64 };
        let no_call_share = share(without_call.len());
        if no_call_share > MOSTLY_NO_CALL {
            let issue = RowIssue { kind: Kind::MostlyNoCall, tool: None, argument: None };
            let mut mostly = finding(issue, without_call.len(), without_call.clone());
            mostly.message =
                format!("{} of {rows} rows ({:.0}%) {}", without_call.len(), 100.0 * no_call_share, mostly.message);
            findings.push(mostly);
        }
        let readable = categories.iter().sum::<usize>();
        if readable > 0 && without_call.is_empty() {
            let issue = RowIssue { kind: Kind::NoRestraint, tool: None, argument: None };
            findings.push(finding(issue, readable, Vec::new()));
        }
        findings.sort_by_key(|f| (f.severity == Severity::Advice, f.kind));
        unlisted_findings += findings.len().saturating_sub(KEPT_FINDINGS);
        findings.truncate(KEPT_FINDINGS);
        let unlisted_tools = calls_per_tool.len().saturating_sub(KEPT_TOOLS);
        Checkup {
            summary: summary(&findings, unusable_lines),
            findings,
            unlisted_findings,
            rows,
            failing_rows: failing.len(),
            categories: RowCategory::ALL
                .iter()
                .zip(categories)
                .map(|(&category, rows)| CategoryShare { category, rows, share: share(rows) })
                .collect(),
            calls_per_tool: most_called(calls_per_tool),
            unlisted_tools,
            failing,
        }
    }

    /// Whether the row on `line` has no finding that [`Kind::fails_row`].
    pub fn passes(&self, line: usize) -> bool {
        !self.failing.contains(&line)
    }
}

/// The [`KEPT_TOOLS`] most called tools of `calls` (of equals, the first by name).
fn most_called(calls: BTreeMap<String, usize>) -> BTreeMap<String, usize> {
    if calls.len() <= KEPT_TOOLS {
        return calls;
    }
    let mut ranked: Vec<(String, usize)> = calls.into_iter().collect();
    // Stable: equals keep their name order.
    ranked.sort_by_key(|(_, calls)| std::cmp::Reverse(*calls));
    ranked.truncate(KEPT_TOOLS);
    ranked.into_iter().collect()
}

fn finding(issue: RowIssue, count: usize, mut lines: Vec<usize>) -> Finding {
    let severity = if issue.kind.fails_row() { Severity::Error } else { Severity::Advice };
    let message = describe(&issue, count, &named(&lines));
    lines.truncate(KEPT_LINES);
    Finding { kind: issue.kind, severity, tool: issue.tool, argument: issue.argument, count, lines, message }
}

/// "line 4", "lines 4, 9 and 12", "lines 4, 9, 12, 15, 20 and 7 more".
fn named(lines: &[usize]) -> String {
    let shown: Vec<String> = lines.iter().take(NAMED_LINES).map(usize::to_string).collect();
    let more = lines.len().saturating_sub(NAMED_LINES);
    match (shown.len(), more) {
        (0, _) => "no line".to_owned(),
        (1, _) => format!("line {}", shown[0]),
        (_, 0) => format!("lines {} and {}", shown[..shown.len() - 1].join(", "), shown[shown.len() - 1]),
        _ => format!("lines {} and {more} more", shown.join(", ")),
    }
}

fn describe(issue: &RowIssue, count: usize, lines: &str) -> String {
    let tool = issue.tool.as_deref().unwrap_or("");
    let argument = issue.argument.as_deref().unwrap_or("");
    let rows = if count == 1 { "1 row".to_owned() } else { format!("{count} rows") };
    // The verb after `rows`: singular for one row.
    let v = |one: &'static str, many: &'static str| if count == 1 { one } else { many };
    match issue.kind {
        Kind::UnreadableAnswers => format!(
            "{rows} {} \"answers\" that are not a JSON list of calls ({lines}); write them as \
             [{{\"name\": \"...\", \"arguments\": {{...}}}}]",
            v("has", "have")
        ),
        Kind::NotACall => format!(
            "{rows} {} an answer that is not {{\"name\": \"...\", \"arguments\": {{...}}}} ({lines}); fix its shape",
            v("has", "have")
        ),
        Kind::UnknownTool => format!(
            "{rows} {} {tool}, which {} \"tools\" do not offer ({lines}); fix the name or add the tool's schema",
            v("calls", "call"),
            v("its", "their")
        ),
        Kind::MissingArgument => format!(
            "{rows} {} {tool} without its required argument \"{argument}\" ({lines}); add it, or take it out of \
             the schema's \"required\"",
            v("calls", "call")
        ),
        Kind::UnknownArgument => format!(
            "{rows} {} {tool} an argument \"{argument}\" its schema does not declare ({lines}); fix the name or \
             declare it",
            v("gives", "give")
        ),
        Kind::WrongType => format!(
            "{rows} {} {tool}'s \"{argument}\" a value that is not of its declared type ({lines}); fix the value \
             or the schema",
            v("gives", "give")
        ),
        Kind::NotInEnum => format!(
            "{rows} {} {tool}'s \"{argument}\" a value its enum does not allow ({lines}); use one of the enum's values",
            v("gives", "give")
        ),
        Kind::DuplicateRow => {
            format!("{rows} {} an earlier row's query and answers ({lines}); remove the repeats", v("repeats", "repeat"))
        }
        Kind::TooLong => format!(
            "{rows} {} the sequence length and {} the end of {} answer ({lines}); raise --max-len or shorten {}",
            v("does not fit", "do not fit"),
            v("loses", "lose"),
            v("its", "their"),
            v("it", "them")
        ),
        Kind::Ungrounded => format!(
            "{rows} {} {tool}'s \"{argument}\" a value that appears nowhere in the query ({lines}); usually a \
             labelling error: take the value from the query, or word the query so that it contains it",
            v("gives", "give")
        ),
        Kind::NearDuplicate => format!(
            "{rows} {} the same words as an earlier row's query ({lines}); vary the wording or drop {}",
            v("has", "have"),
            v("it", "them")
        ),
        Kind::FewExamples => format!(
            "{tool} is called in {} ({lines}); give each tool at least {MIN_CALLS_PER_TOOL} examples \
             (`needle generate-data --augment` writes more)",
            if count == 1 { "1 answer".to_owned() } else { format!("{count} answers") }
        ),
        Kind::MostlyNoCall => format!(
            "call no tool ({lines}); most rows should show the call that serves the query, with a few that no tool serves"
        ),
        Kind::NoRestraint => format!(
            "none of the {count} rows answers with no call: nothing teaches the model to hold back when a request \
             leaves out a required value, is negated, asks for a value outside a tool's bounds or fits no tool; add \
             such requests with empty answers (12 of every 32 cases of upstream's acceptance suites are; `needle \
             generate-data --augment DATA.jsonl --negative-share 0.3` writes them)"
        ),
    }
}

fn summary(findings: &[Finding], unusable_lines: usize) -> String {
    if unusable_lines > 0 {
        let lines = if unusable_lines == 1 { "1 line is".to_owned() } else { format!("{unusable_lines} lines are") };
        return format!("Fix first: {lines} not usable examples at all (see the problems listed by line).");
    }
    match findings.first() {
        None => "Nothing to fix: every call matches its tool's schema and takes its values from the query, no row \
                 repeats another, and every tool has examples enough."
            .to_owned(),
        Some(first) if first.severity == Severity::Error => format!("Fix first: {}.", first.message),
        Some(first) => format!("No errors; look first at this: {}.", first.message),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generation::Generation;
    use serde_json::json;

    fn example(line: usize, query: &str, answers: Value) -> Example {
        let tools = json!([{"name": "set_thermostat", "parameters": {"type": "object", "properties": {
            "room": {"type": "string"}, "celsius": {"type": "number"},
            "mode": {"type": "string", "enum": ["heat", "cool"]}}, "required": ["room", "celsius"]}}]);
        let row = json!({"query": query, "tools": tools, "answers": answers});
        Example { line, ..Example::from_object(row.as_object().unwrap(), Generation::Needle2).unwrap() }
    }

    fn call(arguments: Value) -> Value {
        json!([{"name": "set_thermostat", "arguments": arguments}])
    }

    fn rows_of(checkup: &Checkup, category: RowCategory) -> usize {
        checkup.categories.iter().find(|c| c.category == category).map_or(0, |c| c.rows)
    }

    fn finding(checkup: &Checkup, kind: Kind) -> &Finding {
        checkup.findings.iter().find(|f| f.kind == kind).unwrap_or_else(|| panic!("no {kind:?} in {checkup:#?}"))
    }

    #[test]
    fn each_finding_names_its_lines_and_errors_come_first() {
        let examples = [
            example(1, "Kitchen to 19.5 please", call(json!({"room": "kitchen", "celsius": 19.5}))),
            example(2, "kitchen to 19.5 PLEASE", call(json!({"room": "kitchen", "celsius": 19.5}))),
            example(3, "Please, kitchen to 19.5!", call(json!({"room": "kitchen", "celsius": 19.5}))),
            example(4, "Bedroom warmer", call(json!({"room": "bedroom"}))),
            example(5, "Office to 20", call(json!({"room": "office", "celsius": "20"}))),
            example(6, "Office to 21 and cool it", call(json!({"room": "office", "celsius": 21, "mode": "freeze"}))),
            example(7, "Hall to 22", call(json!({"room": "hallway", "celsius": 22.0}))),
            example(8, "Play jazz", json!([{"name": "play_music", "arguments": {}}])),
            example(9, "What's the weather?", json!([])),
        ];
        let checkup = Checkup::new(&examples, &[4], 0);
        assert_eq!(finding(&checkup, Kind::DuplicateRow).lines, [2]);
        assert_eq!(finding(&checkup, Kind::NearDuplicate).lines, [3]);
        assert_eq!(finding(&checkup, Kind::MissingArgument).lines, [4]);
        assert_eq!(finding(&checkup, Kind::MissingArgument).argument.as_deref(), Some("celsius"));
        assert_eq!(finding(&checkup, Kind::WrongType).lines, [5]);
        assert_eq!(finding(&checkup, Kind::NotInEnum).lines, [6]);
        assert_eq!(finding(&checkup, Kind::Ungrounded).lines, [7], "18.0 is grounded by 18, 19.5 by 19.5");
        assert_eq!(finding(&checkup, Kind::UnknownTool).tool.as_deref(), Some("play_music"));
        assert_eq!(finding(&checkup, Kind::TooLong).lines, [4]);
        let few: Vec<(Option<&str>, usize)> = checkup
            .findings
            .iter()
            .filter(|f| f.kind == Kind::FewExamples)
            .map(|f| (f.tool.as_deref(), f.count))
            .collect();
        assert_eq!(few, [(Some("play_music"), 1), (Some("set_thermostat"), 7)]);
        assert_eq!((rows_of(&checkup, RowCategory::NoCall), checkup.failing_rows), (1, 5));
        assert!(checkup.passes(1) && checkup.passes(3) && checkup.passes(7) && !checkup.passes(2));
        assert_eq!(checkup.findings[0].severity, Severity::Error);
        assert_eq!(checkup.summary, format!("Fix first: {}.", checkup.findings[0].message));
        let advice_only = Checkup::new(&examples[6..7], &[], 0);
        assert!(advice_only
            .summary
            .starts_with("No errors; look first at this: 1 row gives set_thermostat's \"room\""));
        assert!(checkup
            .findings
            .iter()
            .skip_while(|f| f.severity == Severity::Error)
            .all(|f| f.severity == Severity::Advice));
    }

    #[test]
    fn a_clean_file_says_so_and_unusable_lines_come_first() {
        let mut examples: Vec<Example> = (1..=MIN_CALLS_PER_TOOL)
            .map(|n| {
                example(
                    n,
                    &format!("Room {n} to {n} degrees"),
                    call(json!({"room": format!("room {n}"), "celsius": n})),
                )
            })
            .collect();
        examples.push(example(MIN_CALLS_PER_TOOL + 1, "Don't touch the heating", json!([])));
        assert!(Checkup::new(&examples, &[], 0).summary.starts_with("Nothing to fix"));
        assert!(Checkup::new(&examples, &[], 2).summary.starts_with("Fix first: 2 lines are not usable"));
    }

    #[test]
    fn each_category_has_its_share_and_a_file_that_always_calls_is_told_to_hold_back() {
        let one = || call(json!({"room": "kitchen", "celsius": 20}));
        let two = json!([{"name": "set_thermostat", "arguments": {"room": "kitchen", "celsius": 20}},
                         {"name": "set_thermostat", "arguments": {"room": "office", "celsius": 20}}]);
        let examples = [
            example(1, "Kitchen to 20", one()),
            example(2, "Kitchen to 20 now", one()),
            example(3, "Kitchen and office to 20", two),
            example(4, "Don't heat the kitchen", json!([])),
            example(5, "Kitchen to 20 please", json!("not a list")),
        ];
        let checkup = Checkup::new(&examples, &[], 0);
        let shares: Vec<(RowCategory, usize, f64)> =
            checkup.categories.iter().map(|c| (c.category, c.rows, c.share)).collect();
        // The unreadable row is of no category: it teaches nothing, holding back least of all.
        assert_eq!(
            shares,
            [(RowCategory::Positive, 2, 0.4), (RowCategory::Parallel, 1, 0.2), (RowCategory::NoCall, 1, 0.2)]
        );
        let json = serde_json::to_value(&checkup).unwrap();
        assert_eq!(json["categories"][2], json!({"category": "no_call", "rows": 1, "share": 0.2}));
        assert!(checkup.findings.iter().all(|f| f.kind != Kind::NoRestraint), "{checkup:#?}");

        let always = Checkup::new(&examples[..3], &[], 0);
        let warning = finding(&always, Kind::NoRestraint);
        assert_eq!((warning.severity, warning.count), (Severity::Advice, 3));
        assert!(warning.message.starts_with("none of the 3 rows answers with no call"), "{}", warning.message);
        assert_eq!(always.summary, format!("No errors; look first at this: {}.", warning.message));
        assert_eq!(rows_of(&always, RowCategory::NoCall), 0, "every category is listed, the empty ones too");
        // An empty file has nothing to warn about.
        assert!(Checkup::new(&[], &[], 0).findings.is_empty());
    }

    #[test]
    fn a_row_offering_a_million_tools_lists_the_first_findings_and_counts_the_rest() {
        let tools: Vec<Value> = (0..1_000_000).map(|n| json!({"name": format!("tool_{n:07}")})).collect();
        let row = json!({"query": "set the kitchen to 20", "tools": tools, "answers": call(json!({"room": "k"}))});
        let example = Example::from_object(row.as_object().unwrap(), Generation::Needle2).unwrap();
        let checkup = Checkup::new(&[example], &[], 0);
        assert_eq!(checkup.findings.len(), KEPT_FINDINGS);
        // Every tool is called too seldom, set_thermostat is called but not offered, and no row holds back.
        let all = checkup.findings.len() + checkup.unlisted_findings;
        assert_eq!(all, 1_000_000 + 3, "{:?}", checkup.findings.iter().map(|f| f.kind).collect::<Vec<_>>());
        assert_eq!(checkup.findings[0].kind, Kind::UnknownTool, "errors stay first");
        assert_eq!((checkup.calls_per_tool.len(), checkup.unlisted_tools), (KEPT_TOOLS, 1_000_001 - KEPT_TOOLS));
        assert_eq!(checkup.calls_per_tool.get("set_thermostat"), Some(&1), "the most called tools are kept");
        assert!(serde_json::to_string(&checkup).unwrap().len() < 64 << 10);
    }

    #[test]
    fn most_rows_without_a_call_is_advice() {
        let examples = [example(1, "hi", json!([])), example(2, "hello there", json!([]))];
        let checkup = Checkup::new(&examples, &[], 0);
        assert!(finding(&checkup, Kind::MostlyNoCall).message.starts_with("2 of 2 rows (100%) call no tool"));
        assert_eq!(checkup.categories[2].share, 1.0);
    }
}
