//! A dataset file read as the reference reads it: its lines, the examples kept and the problems
//! recorded, each row rendered and tokenized.

use super::example::Example;
use super::{
    fit_max_len, ChatFormat, Checkup, DatasetReport, Encoded, Field, Issue, JsonStyle, Problem, Problems, TextFields,
    Tokenized,
};
use crate::generation::Generation;
use crate::pyjson::{self, kind_of, python_truthy};
use crate::tokenizer::Tokenizer;
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};

impl Example {
    /// A question to try a model with (`needle run`, the app's Try): tools, query and an optional
    /// system prompt, read as a row holding them would be (3.x strips the system prompt) and so
    /// rendered as a training example would be; the answer is what the model is asked for.
    pub fn question(tools: &Value, query: &str, system: &str, generation: Generation) -> Result<Self, Issue> {
        let row: Map<String, Value> =
            [("query", Value::from(query)), ("tools", tools.clone()), ("system", Value::from(system))]
                .into_iter()
                .map(|(key, value)| (key.to_owned(), value))
                .collect();
        Self::from_object(&row, generation)
    }

    /// An example read from one JSON object (a generated row), as a line of a file would be; the
    /// issue when the reference could not train on it.
    pub fn from_object(object: &Map<String, Value>, generation: Generation) -> Result<Self, Issue> {
        if !object.contains_key("query") {
            return Err(Issue::MissingQuery);
        }
        example_from_object(0, object, generation).map(|(example, _)| example)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DatasetError {
    #[error("cannot read dataset {path}: {source}; check the path and that the file is readable")]
    Read { path: PathBuf, source: std::io::Error },
    #[error(
        "no usable example in {path}: {summary}; every example must be one line holding a JSON object \
         with a \"query\" string"
    )]
    NoUsableExample { path: PathBuf, summary: String, problems: Problems },
    #[error(
        "max_len (--max-len) is {cap}, but a training row needs at least {MIN_CAP} positions \
         (BOS and one trained token); use 128 or more"
    )]
    CapTooSmall { cap: usize },
    #[error("cannot write {path}: {source}; check that its folder is writable and the disk has room")]
    Write { path: PathBuf, source: std::io::Error },
}

/// Below this, no target token can be inside a row and nothing would train.
const MIN_CAP: usize = 2;

/// A dataset file read and validated.
#[derive(Debug, Clone)]
pub struct Dataset {
    pub path: PathBuf,
    /// The examples that train, in file order.
    pub examples: Vec<Example>,
    /// Problems found while reading, in line order; those that [`Issue::skips_example`] left their
    /// line out of `examples`.
    pub problems: Problems,
}

/// Everything a training run needs from the dataset, tokenized once.
#[derive(Debug, Clone)]
pub struct Prepared {
    /// The sequence length of every row (the reference's `fit_max_len`).
    pub seq_len: usize,
    /// The examples' tokens, in file order.
    pub tokenized: Vec<Tokenized>,
    pub report: DatasetReport,
}

impl Prepared {
    /// One training row per example, in file order ([`Tokenized::row`]): the loss of rows padded
    /// to `seq_len` (padding comes after every scored token, under a causal mask).
    ///
    /// Built on demand: a report alone (`needle data`) never needs them.
    pub fn rows(&self) -> impl ExactSizeIterator<Item = Encoded> + '_ {
        self.tokenized.iter().map(|t| t.row(self.seq_len))
    }
}

enum LineOutcome {
    Blank,
    Example(Example, Vec<Issue>),
    Skipped(Issue),
}

impl Dataset {
    /// Reads `path` a line at a time as `generation`'s package reads it; an error only when the
    /// file cannot be read or holds no usable example.
    pub fn load(path: &Path, generation: Generation) -> Result<Dataset, DatasetError> {
        let read_error = |source| DatasetError::Read { path: path.to_owned(), source };
        let file = std::fs::File::open(path).map_err(read_error)?;
        let mut examples = Vec::new();
        let mut problems = Problems::default();
        for numbered in super::lines::numbered_lines(std::io::BufReader::new(file)) {
            let (line, raw) = numbered.map_err(read_error)?;
            match read_line(line, &raw, generation) {
                LineOutcome::Blank => {}
                LineOutcome::Example(example, warnings) => {
                    for issue in warnings {
                        problems.push(Problem { line, issue });
                    }
                    examples.push(example);
                }
                LineOutcome::Skipped(issue) => problems.push(Problem { line, issue }),
            }
        }
        if examples.is_empty() {
            let summary = problems.summary();
            return Err(DatasetError::NoUsableExample { path: path.to_owned(), summary, problems });
        }
        Ok(Dataset { path: path.to_owned(), examples, problems })
    }

    /// Line `number` (1-based, counted as [`Dataset::load`] counts them, so a finding's line is this
    /// one) of the file at `path` as it is written, or `None` past the file's end.
    pub fn line_of(path: &Path, number: usize) -> Result<Option<String>, DatasetError> {
        let read_error = |source| DatasetError::Read { path: path.to_owned(), source };
        let file = std::fs::File::open(path).map_err(read_error)?;
        for numbered in super::lines::numbered_lines(std::io::BufReader::new(file)) {
            let (line, raw) = numbered.map_err(read_error)?;
            if line == number {
                return Ok(Some(String::from_utf8_lossy(&raw).into_owned()));
            }
        }
        Ok(None)
    }

    /// Tokenizes every example once, picks the sequence length for `cap` (`--max-len`) and
    /// reports on the result.
    pub fn prepare(&self, tokenizer: &Tokenizer, cap: usize) -> Result<Prepared, DatasetError> {
        if cap < MIN_CAP {
            return Err(DatasetError::CapTooSmall { cap });
        }
        let tokenized: Vec<Tokenized> = self.examples.iter().map(|e| Tokenized::new(tokenizer, e)).collect();
        let longest = tokenized.iter().map(Tokenized::sequence_len).max().unwrap_or(0);
        let seq_len = fit_max_len(longest, cap);
        let report = DatasetReport::new(&self.path, &self.examples, &self.problems, &tokenized, cap, seq_len);
        Ok(Prepared { seq_len, tokenized, report })
    }

    /// Writes to `out`, atomically, the lines of the usable examples that `checkup` passes, as they
    /// are in the file; returns how many.
    pub fn write_passing(&self, checkup: &Checkup, out: &Path) -> Result<usize, DatasetError> {
        let read_error = |source| DatasetError::Read { path: self.path.clone(), source };
        let file = std::fs::File::open(&self.path).map_err(read_error)?;
        let usable: std::collections::BTreeSet<usize> = self.examples.iter().map(|e| e.line).collect();
        let mut kept = Vec::new();
        let mut count = 0;
        for numbered in super::lines::numbered_lines(std::io::BufReader::new(file)) {
            let (line, raw) = numbered.map_err(read_error)?;
            if usable.contains(&line) && checkup.passes(line) {
                kept.extend_from_slice(&raw);
                kept.push(b'\n');
                count += 1;
            }
        }
        crate::atomic::write_atomically(out, &kept)
            .map_err(|source| DatasetError::Write { path: out.to_owned(), source })?;
        Ok(count)
    }
}

/// Applies the reference's reading to one line: `strip()`, skip if blank, `json.loads`, skip
/// unless it has a `query` (3.x: or is a single-turn chat), then render (which is where the
/// reference crashes on wrong types).
fn read_line(line: usize, raw: &[u8], generation: Generation) -> LineOutcome {
    let text = match std::str::from_utf8(raw) {
        Ok(text) => text,
        Err(error) => {
            let valid = String::from_utf8_lossy(&raw[..error.valid_up_to()]);
            return LineOutcome::Skipped(Issue::NotUtf8 { column: valid.chars().count() + 1 });
        }
    };
    let (leading, text) = super::lines::python_strip(text);
    if text.is_empty() {
        return LineOutcome::Blank;
    }
    if text.starts_with('\u{feff}') {
        return LineOutcome::Skipped(Issue::ByteOrderMark);
    }
    let value: Value = match serde_json::from_str(text) {
        Ok(value) => value,
        Err(error) => {
            if let Some(start) = python_only_literal_at(text, error.column()) {
                let column = leading + super::lines::char_column(text, start);
                return LineOutcome::Skipped(Issue::NonFiniteNumber { column });
            }
            let column = leading + super::lines::char_column(text, error.column());
            return LineOutcome::Skipped(Issue::InvalidJson { column, reason: json_error_reason(&error) });
        }
    };
    let Value::Object(object) = value else {
        return LineOutcome::Skipped(Issue::NotAnObject { found: kind_of(&value) });
    };
    let object = match (ChatFormat::of(generation).chat_rows, object.contains_key("query")) {
        (true, false) => match super::chat::from_chat(&object) {
            Ok(Some(example)) => example,
            Ok(None) => return LineOutcome::Skipped(Issue::NotChat),
            Err(issue) => return LineOutcome::Skipped(issue),
        },
        _ => object,
    };
    match example_from_object(line, &object, generation) {
        Ok((example, warnings)) => LineOutcome::Example(example, warnings),
        Err(issue) => LineOutcome::Skipped(issue),
    }
}

/// Where a `NaN`, `Infinity` or `-Infinity` starts (1-based byte column), when serde_json stopped
/// at one: not JSON, but Python's `json.loads` reads them as floats. serde_json stops at the first
/// byte of `NaN`/`Infinity`, and at the `I` of `-Infinity`.
fn python_only_literal_at(text: &str, byte_column: usize) -> Option<usize> {
    let at = byte_column.checked_sub(1)?;
    let rest = text.get(at..)?;
    if rest.starts_with("NaN") || rest.starts_with("-Infinity") {
        return Some(byte_column);
    }
    if !rest.starts_with("Infinity") {
        return None;
    }
    let after_minus = at.checked_sub(1).and_then(|minus| text.as_bytes().get(minus)) == Some(&b'-');
    Some(if after_minus { byte_column - 1 } else { byte_column })
}

/// serde_json's message without its " at line 1 column N" suffix: we report the file's position.
fn json_error_reason(error: &serde_json::Error) -> String {
    let message = error.to_string();
    match message.rsplit_once(" at line ") {
        Some((reason, _)) => reason.to_owned(),
        None => message,
    }
}

/// The fields of `render_example`, with its defaults, or why the reference could not use them.
fn example_from_object(
    line: usize,
    object: &Map<String, Value>,
    generation: Generation,
) -> Result<(Example, Vec<Issue>), Issue> {
    let query = match object.get("query") {
        None => return Err(Issue::MissingQuery),
        Some(value) => required_text(Field::Query, value)?,
    };
    let mut warnings = Vec::new();
    let (reasoning, system) = match ChatFormat::of(generation).text_fields {
        TextFields::AsWritten => {
            let reasoning =
                object.get("reasoning").map_or(Ok(String::new()), |v| required_text(Field::Reasoning, v))?;
            let system = match object.get("system") {
                None => String::new(),
                Some(Value::String(text)) => text.clone(),
                // `if system` in the reference: a false-y non-string means no system turn ...
                Some(value) if !python_truthy(value) => {
                    warnings.push(Issue::SystemIgnored { found: kind_of(value) });
                    String::new()
                }
                // ... and a true-y one is concatenated to a string, which raises.
                Some(value) => return Err(Issue::NotAString { field: Field::System, found: kind_of(value) }),
            };
            (reasoning, system)
        }
        // 3.x: `(example.get(field) or "").strip()`: anything false-y is empty, a true-y non-string raises.
        TextFields::Stripped => {
            let stripped = |field: Field| match object.get(field.key()) {
                Some(value) if python_truthy(value) => {
                    required_text(field, value).map(|text| super::lines::python_strip(&text).1.to_owned())
                }
                _ => Ok(String::new()),
            };
            (stripped(Field::Reasoning)?, stripped(Field::System)?)
        }
    };
    let tools = json_text(Field::Tools, object.get("tools"), generation, &mut warnings);
    let answers = match object.get("answers") {
        Some(value) => json_text(Field::Answers, Some(value), generation, &mut warnings),
        None => json_text(Field::FunctionCalls, object.get("function_calls"), generation, &mut warnings),
    };
    Ok((Example { generation, line, system, query, reasoning, tools, answers }, warnings))
}

fn required_text(field: Field, value: &Value) -> Result<String, Issue> {
    match value {
        Value::String(text) => Ok(text.clone()),
        other => Err(Issue::NotAString { field, found: kind_of(other) }),
    }
}

/// `tools`/`answers` as the template inserts them: strings verbatim, anything else through
/// `json.dumps` (3.x's with `ensure_ascii=False`); an absent field is an empty list.
fn json_text(field: Field, value: Option<&Value>, generation: Generation, warnings: &mut Vec<Issue>) -> String {
    match value {
        None => "[]".to_owned(),
        Some(Value::String(text)) => text.clone(),
        Some(value) => {
            if !value.is_array() {
                warnings.push(Issue::RenderedAsJson { field, found: kind_of(value) });
            }
            match ChatFormat::of(generation).json {
                JsonStyle::Ascii => pyjson::dumps_compact(value),
                JsonStyle::Unicode => pyjson::dumps_compact_unicode(value),
            }
        }
    }
}
