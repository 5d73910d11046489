//! More examples for the chosen dataset, from the app: `needle generate-data --augment DATA --events
//! jsonl` in the worker, its progress passed on, Cancel keeping what arrived (a second Cancel ends
//! the worker), and the new rows read back from the written file. The key reaches the worker through
//! its environment ([`crate::secrets`]). One generation at a time.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use needle_engine::generate::{self, DEFAULT_BATCH_SIZE, DEFAULT_ENDPOINT, DEFAULT_MODEL, DEFAULT_NUM_SAMPLES};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tauri::ipc::Channel;

use crate::ground::{ending_in, lock};
use crate::secrets::keys::{KeySource, Keys};
use crate::worker::job::Job;
use crate::worker::process::{CancelAnswer, Exit, Line, Process, Watcher, Worker};

/// How many of the new rows the window is shown (the file has them all).
const SHOWN_ROWS: usize = 50;

/// The most rows one generation may ask for.
const MAX_COUNT: usize = 100_000;

/// What the window sends: each field as typed.
#[derive(Debug, Clone, Deserialize)]
pub struct GenerateRequest {
    /// The dataset to write more of: its tools are asked for, and its rows come first in the output.
    pub dataset: PathBuf,
    /// Where the originals and the new rows go [default: `DATA.augmented.jsonl`].
    pub output: PathBuf,
    pub count: String,
    /// [default: the reference's model]
    pub model: String,
    /// An OpenAI-compatible chat-completions URL [default: `OPENROUTER_URL`, else OpenRouter's].
    pub endpoint: String,
    /// The share of the new rows that must get no call (0.3 for 30%) [default, empty: the LLM's own mix].
    #[serde(default)]
    pub negative_share: String,
}

/// What the Generate form starts with.
#[derive(Debug, Clone, Serialize)]
pub struct GenerateSetup {
    pub count: usize,
    pub model: &'static str,
    /// The endpoint used when the field is left empty.
    pub endpoint: String,
    pub key: KeySource,
    pub state: GenerationState,
}

/// The generation as the app last heard of it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum GenerationState {
    Idle,
    Running {
        generated: usize,
        wanted: usize,
        failed_requests: usize,
        /// Rows not kept so far, by reason (the doctor's kinds, `duplicate_row`, ...).
        rejected: BTreeMap<String, usize>,
        /// Cancel was pressed: what arrived is being written.
        stopping: bool,
    },
    Written(Box<Written>),
    Failed {
        message: String,
    },
}

/// The file is written: the originals, then the new rows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Written {
    pub path: PathBuf,
    /// Rows in the file.
    pub written: usize,
    /// New rows among them (the last ones).
    pub generated: usize,
    pub wanted: usize,
    pub failed_requests: usize,
    pub rejected: BTreeMap<String, usize>,
    /// Kept rows the doctor has advice about, by kind.
    pub advice: BTreeMap<String, usize>,
    /// Stopped by Cancel before the count was reached.
    pub cancelled: bool,
    /// The first new rows, as written.
    #[serde(default)]
    pub rows: Vec<Value>,
}

/// What the window hears: each reply's progress, each failed request, then the outcome.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum GenerateMessage {
    Progress { state: GenerationState },
    RequestFailed { message: String },
    Finished { state: GenerationState },
}

/// The worker's `--events jsonl` lines (`needle_engine::generate::GenerateEvent`, then the CLI's
/// `written`).
#[derive(Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
enum Printed {
    Progress { generated: usize, wanted: usize, failed_requests: usize, rejected: BTreeMap<String, usize> },
    RequestFailed { message: String },
    Written(Box<Written>),
}

/// The one generation slot: its state and its worker.
#[derive(Default)]
pub struct Generations(Mutex<Slot>);

#[derive(Default)]
struct Slot {
    state: Option<GenerationState>,
    process: Option<Arc<Process>>,
}

impl Generations {
    pub fn state(&self) -> GenerationState {
        lock(&self.0).state.clone().unwrap_or(GenerationState::Idle)
    }

    /// First press: the worker stops asking and writes what arrived. Second press: it is ended.
    pub fn cancel(&self) -> CancelAnswer {
        let mut slot = lock(&self.0);
        let Slot { state, process: Some(process) } = &mut *slot else { return CancelAnswer::Idle };
        match state {
            Some(GenerationState::Running { stopping, .. }) => process.cancel(stopping),
            _ => {
                process.kill();
                CancelAnswer::Killed
            }
        }
    }

    fn update(&self, state: GenerationState) -> GenerationState {
        let mut slot = lock(&self.0);
        let stopping = matches!(slot.state, Some(GenerationState::Running { stopping: true, .. }));
        let state = match state {
            GenerationState::Running { generated, wanted, failed_requests, rejected, .. } => {
                GenerationState::Running { generated, wanted, failed_requests, rejected, stopping }
            }
            other => other,
        };
        slot.state = Some(state.clone());
        state
    }

    fn finish(&self, state: GenerationState) {
        let mut slot = lock(&self.0);
        slot.state = Some(state);
        slot.process = None;
    }
}

/// What the Generate form starts with: the defaults, where the key comes from, and the generation
/// in progress or last finished.
pub fn setup(key: &Keys, generations: &Generations) -> GenerateSetup {
    let endpoint = std::env::var(generate::ENDPOINT_VAR)
        .ok()
        .filter(|url| !url.trim().is_empty())
        .unwrap_or(DEFAULT_ENDPOINT.into());
    GenerateSetup {
        count: DEFAULT_NUM_SAMPLES,
        model: DEFAULT_MODEL,
        endpoint,
        key: key.source(),
        state: generations.state(),
    }
}

/// The output file as the window names it: its choice (always a `.jsonl`), else beside the dataset as
/// `--augment` names it.
pub fn output_path(dataset: &Path, output: &Path) -> PathBuf {
    if output.as_os_str().is_empty() {
        return generate::augmented_path(dataset);
    }
    ending_in(output, "jsonl")
}

/// The no-call share as typed: empty for none, else a number from 0 to 1.
fn negative_share(typed: &str) -> Result<Option<f64>, String> {
    let typed = typed.trim();
    if typed.is_empty() {
        return Ok(None);
    }
    match typed.parse::<f64>() {
        Ok(share) if (0.0..=1.0).contains(&share) => Ok(Some(share)),
        _ => Err("No-call share: a share from 0 to 1 (0.3 for 30%), or empty for the model's own mix".into()),
    }
}

/// Starts writing `request.count` more rows of `request.dataset`; the outcome comes on `channel`.
pub fn start(
    worker: &Worker,
    key: &Keys,
    generations: &Arc<Generations>,
    request: &GenerateRequest,
    channel: Channel<GenerateMessage>,
) -> Result<(), String> {
    let count: usize = request
        .count
        .trim()
        .parse()
        .ok()
        .filter(|n| (1..=MAX_COUNT).contains(n))
        .ok_or_else(|| format!("Count: a whole number from 1 to {MAX_COUNT}"))?;
    let negative_share = negative_share(&request.negative_share)?;
    if request.dataset.as_os_str().is_empty() {
        return Err("choose a dataset first: its tools are what the new examples call".into());
    }
    let output = output_path(&request.dataset, &request.output);
    let model = Some(request.model.trim()).filter(|m| !m.is_empty()).unwrap_or(DEFAULT_MODEL);
    let job = Job::Generate {
        dataset: request.dataset.clone(),
        count,
        // A few rows are asked for in batches of that few: no request writes rows nobody keeps, and
        // the bar moves with each reply.
        batch_size: DEFAULT_BATCH_SIZE.min(count),
        negative_share,
        model: model.into(),
        endpoint: Some(request.endpoint.trim()).filter(|url| !url.is_empty()).map(Into::into),
        output,
    };
    let env = key.worker_env();
    let env: Vec<(&str, Option<&str>)> = env.iter().map(|(name, value)| (*name, value.as_deref())).collect();

    let mut slot = lock(&generations.0);
    if slot.process.is_some() {
        return Err("examples are already being generated: cancel that or wait for it".into());
    }
    let running = GenerationState::Running {
        generated: 0,
        wanted: count,
        failed_requests: 0,
        rejected: BTreeMap::new(),
        stopping: false,
    };
    let watcher = GenerateWatcher { generations: Arc::clone(generations), channel, written: None };
    // Spawned under the slot's lock: the watcher's first update waits until the process is in the slot.
    let process = worker.spawn_with_env(&job, &env, watcher)?;
    *slot = Slot { state: Some(running), process: Some(process) };
    Ok(())
}

struct GenerateWatcher {
    generations: Arc<Generations>,
    channel: Channel<GenerateMessage>,
    written: Option<Box<Written>>,
}

impl Watcher for GenerateWatcher {
    fn line(&mut self, line: Line) {
        // Stderr only matters if the worker fails; `Exit` keeps its tail.
        let Line::Stdout(text) = line else { return };
        match serde_json::from_str::<Printed>(&text) {
            Ok(Printed::Progress { generated, wanted, failed_requests, rejected }) => {
                let running =
                    GenerationState::Running { generated, wanted, failed_requests, rejected, stopping: false };
                let state = self.generations.update(running);
                self.send(GenerateMessage::Progress { state });
            }
            Ok(Printed::RequestFailed { message }) => self.send(GenerateMessage::RequestFailed { message }),
            Ok(Printed::Written(written)) => self.written = Some(written),
            Err(_) => {}
        }
    }

    fn exit(mut self, exit: Exit) {
        let state = match self.written.take() {
            Some(mut written) => {
                written.rows = new_rows(&written.path, written.written.saturating_sub(written.generated));
                GenerationState::Written(written)
            }
            None if exit.killed => GenerationState::Failed {
                message: "generation was ended by a second Cancel; nothing was written".into(),
            },
            None => GenerationState::Failed { message: exit.describe("the generation worker") },
        };
        self.generations.finish(state.clone());
        self.send(GenerateMessage::Finished { state });
    }
}

impl GenerateWatcher {
    fn send(&self, message: GenerateMessage) {
        // A closed window drops its channel; the file is written all the same.
        let _ = self.channel.send(message);
    }
}

/// The first [`SHOWN_ROWS`] rows of `path` after its first `originals` lines: the new ones.
fn new_rows(path: &Path, originals: usize) -> Vec<Value> {
    let Ok(file) = std::fs::File::open(path) else { return Vec::new() };
    let mut reader = BufReader::new(file);
    let mut line = Vec::new();
    let mut rows = Vec::new();
    let mut number = 0;
    while rows.len() < SHOWN_ROWS && reader.read_until(b'\n', &mut line).is_ok_and(|read| read > 0) {
        number += 1;
        if number > originals {
            rows.extend(serde_json::from_slice::<Value>(&line).ok());
        }
        line.clear();
    }
    rows
}
