//! What is wrong with a line, where, and how to fix it.
//!
//! The reference silently skips some bad lines (no `query`), crashes on others (invalid JSON,
//! non-UTF-8, a non-string `query`) and silently truncates long examples. We keep its choice of
//! which examples train, but say every time what happened.

use serde::ser::SerializeStruct;
use serde::{Serialize, Serializer};
use std::collections::BTreeMap;
use std::fmt;
use std::ops::Deref;

/// How many problems are kept word for word; beyond them only their count by kind is kept, so a
/// file of a million bad lines costs no more than one of a hundred (and the window gets a list it
/// can show).
pub const KEPT_PROBLEMS: usize = 100;

/// An example field whose type is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Field {
    Query,
    Reasoning,
    System,
    Tools,
    Answers,
    FunctionCalls,
}

impl Field {
    /// The key as written in the JSONL file.
    pub fn key(self) -> &'static str {
        match self {
            Field::Query => "query",
            Field::Reasoning => "reasoning",
            Field::System => "system",
            Field::Tools => "tools",
            Field::Answers => "answers",
            Field::FunctionCalls => "function_calls",
        }
    }
}

/// One thing wrong with one line.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Issue {
    /// Bytes that are not UTF-8, first bad one at `column` (1-based, in characters).
    NotUtf8 {
        column: usize,
    },
    /// The line starts with U+FEFF, which Python's `json.loads` rejects.
    ByteOrderMark,
    InvalidJson {
        column: usize,
        reason: String,
    },
    /// `NaN`/`Infinity`/`-Infinity` at `column`: Python's json reads them (so the reference trains
    /// on the line), standard JSON and we do not.
    NonFiniteNumber {
        column: usize,
    },
    /// Valid JSON, but not an object; `found` names what it is ("a list", ...).
    NotAnObject {
        found: &'static str,
    },
    MissingQuery,
    /// Neither a `query` nor a single-turn chat (`messages`): Needle 3's package skips it.
    NotChat,
    /// A chat line Needle 3's package cannot read (it would crash).
    BadChat {
        reason: String,
    },
    /// A field the template concatenates as text holds something else (the reference crashes).
    NotAString {
        field: Field,
        found: &'static str,
    },
    /// `tools`/`answers` is neither a list nor a string: kept and rendered as its JSON text,
    /// as the reference does, but probably not what was meant.
    RenderedAsJson {
        field: Field,
        found: &'static str,
    },
    /// `system` is a non-string that Python treats as false: kept, with no system turn.
    SystemIgnored {
        found: &'static str,
    },
    /// The encoded example is longer than the run's sequence length and was cut at the end.
    Truncated {
        tokens: usize,
        seq_len: usize,
        target_tokens: usize,
        target_tokens_kept: usize,
    },
}

impl Issue {
    /// Whether the line is left out of training (otherwise it trains, with this warning).
    pub fn skips_example(&self) -> bool {
        !matches!(self, Issue::RenderedAsJson { .. } | Issue::SystemIgnored { .. } | Issue::Truncated { .. })
    }

    /// The `kind` it serializes with, to count problems by.
    pub fn kind(&self) -> &'static str {
        match self {
            Issue::NotUtf8 { .. } => "not_utf8",
            Issue::ByteOrderMark => "byte_order_mark",
            Issue::InvalidJson { .. } => "invalid_json",
            Issue::NonFiniteNumber { .. } => "non_finite_number",
            Issue::NotAnObject { .. } => "not_an_object",
            Issue::MissingQuery => "missing_query",
            Issue::NotChat => "not_chat",
            Issue::BadChat { .. } => "bad_chat",
            Issue::NotAString { .. } => "not_a_string",
            Issue::RenderedAsJson { .. } => "rendered_as_json",
            Issue::SystemIgnored { .. } => "system_ignored",
            Issue::Truncated { .. } => "truncated",
        }
    }

    fn column(&self) -> Option<usize> {
        match self {
            Issue::NotUtf8 { column } | Issue::InvalidJson { column, .. } | Issue::NonFiniteNumber { column } => {
                Some(*column)
            }
            _ => None,
        }
    }
}

impl fmt::Display for Issue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Issue::NotUtf8 { .. } => write!(f, "bytes that are not UTF-8; re-save the file with UTF-8 encoding"),
            Issue::ByteOrderMark => write!(
                f,
                "starts with a byte-order mark (U+FEFF), which Python's json rejects; save the file as UTF-8 without BOM"
            ),
            Issue::InvalidJson { reason, .. } => {
                write!(f, "invalid JSON ({reason}); each line must hold exactly one complete JSON object")
            }
            Issue::NonFiniteNumber { .. } => write!(
                f,
                "NaN and Infinity are not JSON (Python's json accepts them, so the reference would train on this line); \
                 write a finite number, a string or null"
            ),
            Issue::NotAnObject { found } => write!(
                f,
                "the line is {found}, not a JSON object; write each example as {{\"query\": ..., \"tools\": [...], \"answers\": [...]}}"
            ),
            Issue::MissingQuery => {
                write!(f, "no \"query\" field; add the user request as \"query\": \"...\"")
            }
            Issue::NotChat => write!(
                f,
                "neither a \"query\" nor a single-turn chat; add the user request as \"query\": \"...\", or give \
                 \"messages\" one user turn answered by one assistant turn"
            ),
            Issue::BadChat { reason } => write!(f, "an unreadable chat line: {reason}; fix the messages to the OpenAI chat form"),
            Issue::NotAString { field, found } => write!(
                f,
                "\"{}\" is {found} but must be a string; write it as text (or remove the field)",
                field.key()
            ),
            Issue::RenderedAsJson { field, found } => write!(
                f,
                "\"{}\" is {found}, expected a list (or a JSON string); it is used as its JSON text, as the reference \
                 does; wrap a single item in [ ]",
                field.key()
            ),
            Issue::SystemIgnored { found } => write!(
                f,
                "\"system\" is {found}, not a string, so there is no system turn; remove it or give a string"
            ),
            Issue::Truncated { tokens, seq_len, target_tokens, target_tokens_kept } => write!(
                f,
                "{tokens} tokens do not fit the sequence length {seq_len}; the end is cut off and the answer keeps \
                 {target_tokens_kept} of its {target_tokens} tokens; raise --max-len or shorten the example"
            ),
        }
    }
}

/// An [`Issue`] on a 1-based line of the file.
#[derive(Debug, Clone, PartialEq)]
pub struct Problem {
    pub line: usize,
    pub issue: Issue,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}", self.line)?;
        if let Some(column) = self.issue.column() {
            write!(f, ", column {column}")?;
        }
        let outcome = if self.issue.skips_example() { " (line skipped)" } else { "" };
        write!(f, ": {}{outcome}", self.issue)
    }
}

/// `{"line", "issue": {"kind", ...}, "skipped", "message"}`: the structured fields for the app,
/// the sentence for people.
impl Serialize for Problem {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut record = serializer.serialize_struct("Problem", 4)?;
        record.serialize_field("line", &self.line)?;
        record.serialize_field("issue", &self.issue)?;
        record.serialize_field("skipped", &self.issue.skips_example())?;
        record.serialize_field("message", &self.to_string())?;
        record.end()
    }
}

/// The problems of a file: the first [`KEPT_PROBLEMS`] in line order, and how many of each kind
/// there are in all. Dereferences to the kept ones.
///
/// Serialized flat into a report: `problems` (the kept ones), `problem_counts`, `problems_total`.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Problems {
    #[serde(rename = "problems")]
    kept: Vec<Problem>,
    /// Every problem, kept or not, by [`Issue::kind`].
    #[serde(rename = "problem_counts")]
    pub counts: BTreeMap<&'static str, usize>,
    #[serde(rename = "problems_total")]
    pub total: usize,
    /// Problems that leave their line out of training.
    #[serde(skip)]
    pub skipping: usize,
}

impl Problems {
    /// Records `problem`; problems must come in line order.
    pub fn push(&mut self, problem: Problem) {
        *self.counts.entry(problem.issue.kind()).or_default() += 1;
        self.total += 1;
        self.skipping += usize::from(problem.issue.skips_example());
        if self.kept.len() < KEPT_PROBLEMS {
            self.kept.push(problem);
        }
    }

    /// Both lists together, in line order (a line's problems from `self` ahead of `other`'s).
    pub fn merged(&self, other: &Problems) -> Problems {
        let mut kept: Vec<Problem> = self.kept.iter().chain(&other.kept).cloned().collect();
        kept.sort_by_key(|problem| problem.line);
        kept.truncate(KEPT_PROBLEMS);
        let mut counts = self.counts.clone();
        for (kind, count) in &other.counts {
            *counts.entry(kind).or_default() += count;
        }
        Problems { kept, counts, total: self.total + other.total, skipping: self.skipping + other.skipping }
    }

    /// One line: how many, and the first.
    pub fn summary(&self) -> String {
        match self.kept.first() {
            None => "the file has no non-blank line".to_owned(),
            Some(first) => format!("{} line(s) have problems, the first: {first}", self.total),
        }
    }
}

impl Deref for Problems {
    type Target = [Problem];

    fn deref(&self) -> &[Problem] {
        &self.kept
    }
}

impl<'a> IntoIterator for &'a Problems {
    type Item = &'a Problem;
    type IntoIter = std::slice::Iter<'a, Problem>;

    fn into_iter(self) -> Self::IntoIter {
        self.kept.iter()
    }
}
