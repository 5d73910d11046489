//! Training data written by an LLM, as the reference's `generate_dataset` and `augment_jsonl` write
//! it: batches of examples asked of an OpenAI-compatible chat endpoint (OpenRouter by default), a
//! bounded pool of requests in flight, each reply's JSON array read, every row checked by the
//! dataset doctor ([`check_row`]) and deduplicated by the reference's key ([`duplicate_key`]), until
//! the requested count is reached.
//!
//! Rows the doctor rejects are counted by reason, never dropped unsaid. A cancel keeps what has
//! arrived. Nothing here reads or writes a file: the CLI does.

mod client;
mod error;
mod event;
mod mix;
mod prompt;
mod suite;

pub use client::{Endpoint, DEFAULT_ENDPOINT, ENDPOINT_VAR, KEY_VARS};
pub use error::GenerateError;
pub use event::GenerateEvent;
pub use mix::Mix;
pub use prompt::REFUSALS_PER_BATCH;
pub use suite::{generate_suite, GeneratedSuite, SuiteRequest, DEFAULT_SUITE_CASES};

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex, PoisonError};
use std::time::Duration;

use serde::Serialize;
use serde_json::{Map, Value};

use crate::dataset::schema::answers_of;
use crate::dataset::{check_row, duplicate_key, Example, Kind, RowCategory};
use crate::generation::Generation;
use client::RequestError;
use mix::Quotas;

/// The reference's model (its endpoint and the environment variables it reads are the client's).
pub const DEFAULT_MODEL: &str = "deepseek/deepseek-v4-flash";
/// `generate-data`'s defaults, as the reference's; `finetune --generate` uses [`FINETUNE_WORKERS`].
pub const DEFAULT_NUM_SAMPLES: usize = 100;
pub const DEFAULT_BATCH_SIZE: usize = 25;
pub const DEFAULT_WORKERS: usize = 16;
pub const FINETUNE_WORKERS: usize = 8;
/// The reference's limit on one request, in seconds.
pub const DEFAULT_TIMEOUT_S: u64 = 180;

/// Why a reply's row was not kept, besides the doctor's [`Kind`]s.
const UNREADABLE_REPLY: &str = "unreadable_reply";
const NOT_AN_EXAMPLE: &str = "not_an_example";
/// A good row of a category whose share is already kept.
const SHARE_FULL: &str = "share_full";

#[derive(Debug, Clone)]
pub struct GenerateSettings {
    /// How many rows to keep.
    pub num_samples: usize,
    /// Rows asked for in one request.
    pub batch_size: usize,
    /// Requests in flight at once.
    pub workers: usize,
    pub model: String,
    pub timeout: Duration,
    /// The share of rows with no call and with several calls, where set.
    pub mix: Mix,
}

impl Endpoint {
    /// `--endpoint`, else `OPENROUTER_URL`, else OpenRouter's; the key from [`KEY_VARS`]. OpenRouter
    /// without a key is an error that names the variables; another server may need none.
    pub fn resolve(flag: Option<&str>) -> Result<Self, GenerateError> {
        let from_env = |name: &str| std::env::var(name).ok().filter(|value| !value.trim().is_empty());
        let url = flag.map(str::to_owned).or_else(|| from_env(ENDPOINT_VAR)).unwrap_or_else(|| DEFAULT_ENDPOINT.into());
        let key = KEY_VARS.iter().find_map(|name| from_env(name));
        if key.is_none() && url == DEFAULT_ENDPOINT {
            return Err(GenerateError::NoKey { url });
        }
        Ok(Self { url, key })
    }
}

/// Where `--augment DATA.jsonl` writes by default, as the reference names it
/// (`path.replace(".jsonl", "") + ".augmented.jsonl"`); the app offers the same.
pub fn augmented_path(data: &Path) -> PathBuf {
    PathBuf::from(format!("{}.augmented.jsonl", data.display().to_string().replace(".jsonl", "")))
}

/// What came back.
#[derive(Debug, Clone, Serialize)]
pub struct Generated {
    /// The kept rows, each with its `tools`, in arrival order.
    #[serde(skip)]
    pub rows: Vec<Map<String, Value>>,
    pub wanted: usize,
    pub failed_requests: usize,
    pub rejected: BTreeMap<&'static str, usize>,
    /// Kept rows with advice from the doctor (a value not found in the query), by kind.
    pub advice: BTreeMap<&'static str, usize>,
    /// Stopped by a cancel before the count was reached.
    pub cancelled: bool,
}

/// The tools of a dataset's rows, each name once, in order of first appearance (the reference's
/// `_collect_tools`); `examples` as [`crate::dataset::Dataset`] read them.
pub fn tools_of_examples(examples: &[Example]) -> Vec<Value> {
    let mut names = HashSet::new();
    let mut tools = Vec::new();
    for example in examples {
        let Ok(Value::Array(row_tools)) = serde_json::from_str::<Value>(&example.tools) else { continue };
        for tool in row_tools {
            if let Some(name) = tool.get("name").and_then(Value::as_str) {
                if names.insert(name.to_owned()) {
                    tools.push(tool);
                }
            }
        }
    }
    tools
}

/// Asks for `settings.num_samples` new rows serving `tools`, none repeating `existing` or each other.
///
/// As the reference: up to 1.3 × the count is asked for in batches, at most three times that many
/// requests in all, `workers` at a time, and the first rows to arrive are kept. A cancel returns what
/// has arrived; requests still in flight end on their own.
pub fn generate(
    tools: &Value,
    existing: &[Example],
    settings: &GenerateSettings,
    endpoint: &Endpoint,
    cancel: &AtomicBool,
    mut on_event: impl FnMut(&GenerateEvent),
) -> Result<Generated, GenerateError> {
    for (what, value) in [
        ("--num-samples", settings.num_samples),
        ("--batch-size", settings.batch_size),
        ("--workers", settings.workers),
    ] {
        if value == 0 {
            return Err(GenerateError::Zero { what });
        }
    }
    settings.mix.check()?;
    let wanted = settings.num_samples;
    let quotas = Quotas::new(&settings.mix, wanted);
    let target = wanted * 13 / 10;
    let max_requests = (target / settings.batch_size * 3).max(1);
    let threads = settings.workers.min(target.div_ceil(settings.batch_size).max(1));

    // The reference's pool: a request is made for each ticket; the first `threads` tickets go out
    // at once, and one more after each reply while rows are still wanted and the limit allows.
    let stop = Arc::new(AtomicBool::new(false));
    let agent = client::agent(settings.timeout);
    let messages = Arc::new(prompt::messages(tools, settings.batch_size, &settings.mix));
    let (ticket_sender, tickets) = mpsc::channel::<()>();
    let tickets = Arc::new(Mutex::new(tickets));
    let (sender, replies) = mpsc::channel();
    for _ in 0..threads {
        let (stop, tickets, agent, messages, sender) =
            (Arc::clone(&stop), Arc::clone(&tickets), agent.clone(), Arc::clone(&messages), sender.clone());
        let (endpoint, model) = (endpoint.clone(), settings.model.clone());
        std::thread::spawn(move || loop {
            let ticket = tickets.lock().unwrap_or_else(PoisonError::into_inner).recv();
            if ticket.is_err() || stop.load(Ordering::Relaxed) {
                return;
            }
            let reply = client::complete(&agent, &endpoint, &model, &messages, &stop);
            if sender.send(reply).is_err() {
                return;
            }
        });
    }
    drop(sender);
    // The workers hold the receiving end until this function returns, so a ticket always arrives.
    for _ in 0..threads {
        let _ = ticket_sender.send(());
    }
    let (mut submitted, mut in_flight) = (threads, threads);

    let mut seen: HashSet<(String, String)> = existing.iter().map(duplicate_key).collect();
    let mut kept = Kept { quotas, per_category: [0; 3] };
    let mut out = Generated {
        rows: Vec::new(),
        wanted,
        failed_requests: 0,
        rejected: BTreeMap::new(),
        advice: BTreeMap::new(),
        cancelled: false,
    };
    let mut last_failure = None;
    let result = loop {
        if out.rows.len() >= wanted {
            break Ok(());
        }
        if cancel.load(Ordering::Relaxed) {
            out.cancelled = true;
            break Ok(());
        }
        if in_flight == 0 {
            break Ok(());
        }
        let reply = match replies.recv_timeout(Duration::from_millis(100)) {
            Ok(reply) => reply,
            Err(mpsc::RecvTimeoutError::Timeout) => continue,
            Err(mpsc::RecvTimeoutError::Disconnected) => break Ok(()),
        };
        in_flight -= 1;
        match reply {
            Ok(text) => keep_rows(&text, tools, &mut seen, &mut kept, &mut out),
            Err(RequestError::Refused { status, body }) => {
                break Err(GenerateError::Refused { url: endpoint.url.clone(), status, body })
            }
            Err(RequestError::Failed(message)) => {
                out.failed_requests += 1;
                on_event(&GenerateEvent::RequestFailed { message: message.clone() });
                last_failure = Some(message);
            }
            Err(RequestError::Cancelled) => continue,
        }
        if out.rows.len() < wanted && submitted < max_requests {
            let _ = ticket_sender.send(());
            submitted += 1;
            in_flight += 1;
        }
        on_event(&GenerateEvent::Progress {
            generated: out.rows.len().min(wanted),
            wanted,
            failed_requests: out.failed_requests,
            rejected: out.rejected.clone(),
        });
    };
    // Idle workers see their tickets end; one waiting on a reply sees this and makes no other.
    stop.store(true, Ordering::Relaxed);
    drop(ticket_sender);
    result?;
    out.rows.truncate(wanted);
    match last_failure {
        Some(last) if out.rows.is_empty() && !out.cancelled => {
            Err(GenerateError::NothingGenerated { failed: out.failed_requests, last })
        }
        _ => Ok(out),
    }
}

/// The rows kept per category, against what each category may take.
struct Kept {
    quotas: Quotas,
    per_category: [usize; 3],
}

/// Reads one reply's rows into `out`: the reference's filter (objects with a `query` and `answers`,
/// given the batch's `tools` when they have none), then the doctor, then the dedup key, then the
/// share of the row's category.
fn keep_rows(reply: &str, tools: &Value, seen: &mut HashSet<(String, String)>, kept: &mut Kept, out: &mut Generated) {
    let Some(rows) = prompt::parse_array(reply) else {
        *out.rejected.entry(UNREADABLE_REPLY).or_default() += 1;
        return;
    };
    for row in rows {
        let reason = match row_verdict(row, tools, seen) {
            Ok(good) if !kept.quotas.admits(good.category, &kept.per_category) => SHARE_FULL,
            Ok(good) => {
                for kind in good.advice {
                    *out.advice.entry(kind.name()).or_default() += 1;
                }
                kept.per_category[good.category.index()] += 1;
                out.rows.push(good.row);
                continue;
            }
            Err(reason) => reason,
        };
        *out.rejected.entry(reason).or_default() += 1;
    }
}

/// A row the doctor passes, with its advice (kinds that do not fail a row) and category.
#[derive(Debug)]
struct GoodRow {
    row: Map<String, Value>,
    advice: Vec<Kind>,
    category: RowCategory,
}

/// The row with its advice and category, or why it is not kept.
fn row_verdict(row: Value, tools: &Value, seen: &mut HashSet<(String, String)>) -> Result<GoodRow, &'static str> {
    let Value::Object(mut row) = row else { return Err(NOT_AN_EXAMPLE) };
    if !row.contains_key("answers") {
        return Err(NOT_AN_EXAMPLE);
    }
    row.entry("tools").or_insert_with(|| tools.clone());
    let example = Example::from_object(&row, Generation::default()).map_err(|_| NOT_AN_EXAMPLE)?;
    let issues = check_row(&example);
    if let Some(error) = issues.iter().find(|issue| issue.kind.fails_row()) {
        return Err(error.kind.name());
    }
    if !seen.insert(duplicate_key(&example)) {
        return Err(Kind::DuplicateRow.name());
    }
    let mut advice: Vec<Kind> = issues.into_iter().map(|issue| issue.kind).collect();
    advice.dedup();
    // The doctor read the answers as a list, or refused the row.
    let calls = answers_of(&example).map_or(0, |calls| calls.len());
    Ok(GoodRow { row, advice, category: RowCategory::of(calls) })
}

#[cfg(test)]
mod tests;
