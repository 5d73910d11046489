//! Building a training's `.cact` from the app: `needle build --events jsonl` in the worker, then the file
//! read back (as `needle inspect` does) for its size and tensor count.

use std::path::{Path, PathBuf};

use needle_engine::cact::{CactFile, ExportEvent};
use serde::Serialize;
use tauri::ipc::Channel;

use crate::evaluate::score::quant_rows;
use crate::evaluate::threshold;
use crate::ground::ending_in;
use crate::record::trainings::{CactInfo, HistoryEntry, Records, TrainingRecord};
use crate::worker::job::Job;
use crate::worker::process::{Exit, Line, Watcher, Worker};

/// What the window hears about a build.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum BuildMessage {
    /// The worker's `stage` and `merged` events, as they are.
    Progress(ExportEvent),
    /// The file is written; its weights are answering the held-out examples.
    Scoring,
    /// Boxed: the file's record and the entry dwarf the other messages.
    Built {
        cact: Box<CactInfo>,
        entry: Box<HistoryEntry>,
    },
    Failed {
        message: String,
    },
}

/// What to build: a `bits`-bit `.cact` at `out`, of the whole model or (`layers`) one rung of its depth
/// ladder.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct BuildRequest {
    pub bits: u8,
    pub layers: Option<usize>,
    pub out: PathBuf,
}

/// Builds training `training_id`'s adapter merged into its base as `request` asks.
pub fn start(
    worker: &Worker,
    records: &Records,
    training_id: &str,
    request: BuildRequest,
    channel: Channel<BuildMessage>,
) -> Result<(), String> {
    let BuildRequest { bits, layers, out } = request;
    if out.as_os_str().is_empty() {
        return Err("choose where to save the .cact".into());
    }
    let out = ending_in(&out, "cact");
    let record = records.load(training_id)?;
    let entry = &record.entry;
    if let (Some(layers), Some(whole)) = (layers, &entry.cact) {
        if same_file(&out, &whole.path) {
            return Err(format!(
                "{} is the whole model's file, which Publish uploads; build the {layers}-layer rung into a file of \
                 its own",
                out.display()
            ));
        }
    }
    let adapter = entry.adapter.clone().ok_or("this training saved no adapter yet, so there is nothing to build")?;
    let width = needle_engine::settings::build_width(bits)?;
    let generation = needle_engine::checkpoint::file_generation(&entry.request.checkpoint);
    if let Some(refusal) = generation.and_then(|generation| generation.refuses_bits(width)) {
        return Err(format!("{refusal}; choose another width"));
    }
    let job = Job::Build {
        checkpoint: entry.request.checkpoint.clone(),
        adapter,
        tokenizer: entry.request.tokenizer.clone(),
        bits: width,
        layers,
        out,
    };
    let (records, scorer) = (records.clone(), worker.clone());
    let watcher = BuildWatcher { record, records, worker: scorer, layers, channel, built: None, failure: None };
    worker.spawn(&job, watcher).map(drop)
}

/// Whether `a` and `b` name one file: compared as written, then as the filesystem resolves them.
fn same_file(a: &Path, b: &Path) -> bool {
    a == b || std::fs::canonicalize(a).is_ok_and(|a| std::fs::canonicalize(b).is_ok_and(|b| a == b))
}

struct BuildWatcher {
    record: TrainingRecord,
    records: Records,
    /// Scores the written file beside the model it was built from (`needle eval --quant-rows`).
    worker: Worker,
    /// The rung's depth when the file is one rung of the ladder; `None` for the whole model, the only
    /// one that compares with the tuned model row for row.
    layers: Option<usize>,
    channel: Channel<BuildMessage>,
    /// The written file and its quantization scheme.
    built: Option<(PathBuf, String)>,
    failure: Option<String>,
}

impl Watcher for BuildWatcher {
    fn line(&mut self, line: Line) {
        // Stderr only matters if the worker dies; `Exit` keeps its tail.
        let Line::Stdout(text) = line else { return };
        match serde_json::from_str::<ExportEvent>(&text) {
            Ok(ExportEvent::Built { path, scheme, .. }) => self.built = Some((path, scheme)),
            Ok(ExportEvent::Failed { message }) => self.failure = Some(message),
            Ok(progress) => self.send(BuildMessage::Progress(progress)),
            Err(_) => {}
        }
    }

    fn exit(mut self, exit: Exit) {
        let message = match self.built.take() {
            Some((path, scheme)) => match self.read_back(path, scheme) {
                Ok(message) => message,
                Err(message) => BuildMessage::Failed { message },
            },
            None => BuildMessage::Failed {
                message: self.failure.take().unwrap_or_else(|| exit.describe("the build worker")),
            },
        };
        self.send(message);
    }
}

impl BuildWatcher {
    /// Opens the written file, scores it beside the tuned model on the training's held-out examples,
    /// records it in the training's history, and says what was built.
    fn read_back(&mut self, path: PathBuf, scheme: String) -> Result<BuildMessage, String> {
        let file = CactFile::open(&path).map_err(|error| error.to_string())?;
        let (bytes, tensors) = (file.size() as u64, file.records.len());
        drop(file);
        self.send(BuildMessage::Scoring);
        let scored = match self.layers {
            None => quant_rows(&self.worker, &self.record.entry, &path),
            Some(_) => Ok(None),
        };
        let (rows, scores_error) = match scored {
            Ok(rows) => (rows, None),
            Err(error) => (None, Some(error)),
        };
        let cact = CactInfo { path, bytes, tensors, scheme, rows, scores_error, published: None, layers: self.layers };
        self.record.entry.record_built(cact.clone());
        if self.layers.is_none() {
            threshold::write_beside_cact(&self.record.entry)?;
        }
        self.records.save(&self.record)?;
        Ok(BuildMessage::Built { cact: Box::new(cact), entry: Box::new(self.record.entry.clone()) })
    }

    fn send(&self, message: BuildMessage) {
        // A closed window drops its channel; the file is written and recorded all the same.
        let _ = self.channel.send(message);
    }
}
