//! One example's answers checked against the tools its row offers: each call names an offered tool,
//! gives its required arguments and no others, with values of the declared types and enums, and
//! takes its values from the query.
//!
//! Tools are read as the reference's data writes them (`{"name", "description", "parameters": {JSON
//! schema of an object}}`), or in OpenAI's wrapping (`{"type": "function", "function": {...}}`).

use super::Example;
use serde::Serialize;
use serde_json::{Map, Value};

/// What is wrong with one row, by kind; the doctor counts and words them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// `answers` is not a JSON list (or a JSON string holding one).
    UnreadableAnswers,
    /// An entry of `answers` is not `{"name": "...", "arguments": {...}}`.
    NotACall,
    /// A call names a tool its row does not offer.
    UnknownTool,
    /// A call leaves out an argument its tool requires.
    MissingArgument,
    /// A call gives an argument its tool does not declare.
    UnknownArgument,
    /// An argument's value is not of its declared type.
    WrongType,
    /// An argument's value is not one its declared `enum` allows.
    NotInEnum,
    /// The same query (case aside) with the same answers as an earlier row.
    DuplicateRow,
    /// The row does not fit the sequence length: its end, the answer, is cut off.
    TooLong,
    /// An argument's value appears nowhere in the query.
    Ungrounded,
    /// The same words as an earlier row's query, in another order, case or punctuation.
    NearDuplicate,
    /// No row calls nothing: the file never teaches the model to hold back (ahead of the counts
    /// below: a model that always calls acts on requests it should refuse).
    NoRestraint,
    /// A tool that is offered but called in too few rows to learn.
    FewExamples,
    /// Most rows call nothing.
    MostlyNoCall,
}

impl Kind {
    /// Whether a row with this finding is left out by `--fix` (and by generation); the others are
    /// advice.
    pub fn fails_row(self) -> bool {
        matches!(
            self,
            Kind::UnreadableAnswers
                | Kind::NotACall
                | Kind::UnknownTool
                | Kind::MissingArgument
                | Kind::UnknownArgument
                | Kind::WrongType
                | Kind::NotInEnum
                | Kind::DuplicateRow
                | Kind::TooLong
        )
    }

    /// The name it serializes with, to count rejected rows by.
    pub fn name(self) -> &'static str {
        match self {
            Kind::UnreadableAnswers => "unreadable_answers",
            Kind::NotACall => "not_a_call",
            Kind::UnknownTool => "unknown_tool",
            Kind::MissingArgument => "missing_argument",
            Kind::UnknownArgument => "unknown_argument",
            Kind::WrongType => "wrong_type",
            Kind::NotInEnum => "not_in_enum",
            Kind::DuplicateRow => "duplicate_row",
            Kind::TooLong => "too_long",
            Kind::Ungrounded => "ungrounded",
            Kind::NearDuplicate => "near_duplicate",
            Kind::NoRestraint => "no_restraint",
            Kind::FewExamples => "few_examples",
            Kind::MostlyNoCall => "mostly_no_call",
        }
    }
}

/// One finding on one row: its kind, and the tool and argument it is about where there is one.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RowIssue {
    pub kind: Kind,
    pub tool: Option<String>,
    pub argument: Option<String>,
}

impl RowIssue {
    fn new(kind: Kind, tool: Option<&str>, argument: Option<&str>) -> Self {
        Self { kind, tool: tool.map(str::to_owned), argument: argument.map(str::to_owned) }
    }
}

/// The answers of `example` as a list of values, or `None` when they are not a JSON list.
pub fn answers_of(example: &Example) -> Option<Vec<Value>> {
    match serde_json::from_str(&example.answers) {
        Ok(Value::Array(calls)) => Some(calls),
        _ => None,
    }
}

/// The row's own findings (not those that need the other rows: duplicates, counts, length).
pub fn check_row(example: &Example) -> Vec<RowIssue> {
    let Some(calls) = answers_of(example) else {
        return vec![RowIssue::new(Kind::UnreadableAnswers, None, None)];
    };
    let tools = tools_of(example);
    let query = normalized(&example.query);
    let mut issues = Vec::new();
    for call in &calls {
        let (Some(name), Some(arguments)) = (call.get("name").and_then(Value::as_str), call_arguments(call)) else {
            issues.push(RowIssue::new(Kind::NotACall, None, None));
            continue;
        };
        let Some(tool) = tools.iter().find(|tool| tool.get("name").and_then(Value::as_str) == Some(name)) else {
            issues.push(RowIssue::new(Kind::UnknownTool, Some(name), None));
            continue;
        };
        check_arguments(name, tool, &arguments, &mut issues);
        for (argument, value) in &arguments {
            if !grounded(value, &query, is_enum(tool, argument)) {
                issues.push(RowIssue::new(Kind::Ungrounded, Some(name), Some(argument)));
            }
        }
    }
    issues
}

/// A call's arguments: an object, or a JSON string holding one (as OpenAI's format writes them);
/// none at all is an empty object.
fn call_arguments(call: &Value) -> Option<Map<String, Value>> {
    match call.get("arguments") {
        None | Some(Value::Null) => Some(Map::new()),
        Some(Value::Object(arguments)) => Some(arguments.clone()),
        Some(Value::String(text)) => match serde_json::from_str(text) {
            Ok(Value::Object(arguments)) => Some(arguments),
            _ => None,
        },
        Some(_) => None,
    }
}

/// The tools a row offers, each unwrapped from OpenAI's `{"type": "function", "function": ...}`.
pub fn tools_of(example: &Example) -> Vec<Map<String, Value>> {
    let Ok(Value::Array(tools)) = serde_json::from_str::<Value>(&example.tools) else { return Vec::new() };
    tools
        .into_iter()
        .filter_map(|tool| match tool {
            Value::Object(tool) => match tool.get("function").and_then(Value::as_object) {
                Some(function) => Some(function.clone()),
                None => Some(tool),
            },
            _ => None,
        })
        .collect()
}

fn parameters(tool: &Map<String, Value>) -> Option<&Map<String, Value>> {
    tool.get("parameters").and_then(Value::as_object)
}

fn property<'a>(tool: &'a Map<String, Value>, argument: &str) -> Option<&'a Value> {
    parameters(tool)?.get("properties")?.get(argument)
}

fn is_enum(tool: &Map<String, Value>, argument: &str) -> bool {
    property(tool, argument).is_some_and(|schema| schema.get("enum").is_some())
}

/// Required arguments present, no undeclared ones, types and enums as declared. A tool without a
/// `parameters` schema (or without `properties`) constrains nothing it does not declare.
fn check_arguments(name: &str, tool: &Map<String, Value>, arguments: &Map<String, Value>, issues: &mut Vec<RowIssue>) {
    let Some(parameters) = parameters(tool) else { return };
    let required = parameters.get("required").and_then(Value::as_array).into_iter().flatten();
    for argument in required.filter_map(Value::as_str) {
        if !arguments.contains_key(argument) {
            issues.push(RowIssue::new(Kind::MissingArgument, Some(name), Some(argument)));
        }
    }
    let Some(properties) = parameters.get("properties").and_then(Value::as_object) else { return };
    for (argument, value) in arguments {
        let Some(schema) = properties.get(argument) else {
            issues.push(RowIssue::new(Kind::UnknownArgument, Some(name), Some(argument)));
            continue;
        };
        if !matches_type(value, schema.get("type")) {
            issues.push(RowIssue::new(Kind::WrongType, Some(name), Some(argument)));
        } else if let Some(Value::Array(allowed)) = schema.get("enum") {
            if !allowed.iter().any(|option| same_value(option, value)) {
                issues.push(RowIssue::new(Kind::NotInEnum, Some(name), Some(argument)));
            }
        }
    }
}

/// JSON Schema's `type`: one name or a list of them; a name it does not know, or none, allows all.
pub(crate) fn matches_type(value: &Value, declared: Option<&Value>) -> bool {
    match declared {
        Some(Value::String(name)) => matches_type_name(value, name),
        Some(Value::Array(names)) => names.iter().filter_map(Value::as_str).any(|name| matches_type_name(value, name)),
        _ => true,
    }
}

fn matches_type_name(value: &Value, name: &str) -> bool {
    match name {
        "string" => value.is_string(),
        "number" => value.is_number(),
        // JSON Schema counts 18.0 as an integer, as Python's tool runners do.
        "integer" => as_number(value).is_some_and(|x| x.fract() == 0.0),
        "boolean" => value.is_boolean(),
        "array" => value.is_array(),
        "object" => value.is_object(),
        "null" => value.is_null(),
        _ => true,
    }
}

pub(crate) fn as_number(value: &Value) -> Option<f64> {
    match value {
        Value::Number(number) => number.as_str().parse().ok(),
        _ => None,
    }
}

/// Equal as JSON, numbers by value (an enum of `[1, 2]` allows `2.0`).
pub(crate) fn same_value(a: &Value, b: &Value) -> bool {
    match (as_number(a), as_number(b)) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

/// Lower case, every run of characters that are not letters or digits one space, padded with a
/// space at each end so that a word can be matched whole (` 18 ` is not in ` 180 `).
pub(super) fn normalized(text: &str) -> String {
    let mut out = String::from(" ");
    for c in text.chars().flat_map(char::to_lowercase) {
        if c.is_alphanumeric() {
            out.push(c);
        } else if !out.ends_with(' ') {
            out.push(' ');
        }
    }
    if !out.ends_with(' ') {
        out.push(' ');
    }
    out
}

/// Whether `value` can be read off the query (`normalized`): a string's words appear in it, a
/// number is one of its words (`18.0` as `18` too), a list's or object's values each are. Booleans,
/// nulls, empty strings and enum values are choices the query implies rather than spells, so they
/// always count as grounded.
fn grounded(value: &Value, query: &str, enum_value: bool) -> bool {
    match value {
        _ if enum_value => true,
        Value::String(text) => {
            let words = normalized(text);
            words == " " || query.contains(&words)
        }
        Value::Number(number) => {
            let text = number.as_str();
            let integral = as_number(value).filter(|x| x.fract() == 0.0 && x.abs() < 1e15).map(|x| format!("{x:.0}"));
            std::iter::once(text.to_owned()).chain(integral).any(|form| query.contains(&normalized(&form)))
        }
        Value::Array(items) => items.iter().all(|item| grounded(item, query, false)),
        Value::Object(fields) => fields.values().all(|item| grounded(item, query, false)),
        Value::Bool(_) | Value::Null => true,
    }
}
