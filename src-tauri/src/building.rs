//! Building a run's `.cact` from the app: `needle build --events jsonl` in the worker, then the file
//! read back (as `needle inspect` does) for its size and tensor count.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use needle_engine::cact::{CactFile, ExportEvent};
use needle_engine::calls::{Accuracy, Answered, ModelScore};
use needle_engine::train::finetune::SCORED_EXAMPLES;
use serde::Serialize;
use tauri::ipc::Channel;

use crate::history::{CactInfo, History, HistoryEntry, TrainingRecord};
use crate::studio::Studio;
use crate::worker::{Exit, Line, Watcher, Worker};

/// What the window hears about a build.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum BuildMessage {
    /// The worker's `stage` and `merged` events, as they are.
    Progress(ExportEvent),
    /// The file is written; its weights are answering the held-out examples.
    Scoring,
    Built {
        cact: CactInfo,
        /// Boxed: the entry dwarfs the other messages.
        entry: Box<HistoryEntry>,
    },
    Failed {
        message: String,
    },
}

/// Builds run `run_id`'s adapter merged into its base as a `bits`-bit `.cact` at `out`.
pub fn start(
    studio: &Studio,
    run_id: &str,
    bits: u8,
    out: PathBuf,
    channel: Channel<BuildMessage>,
) -> Result<(), String> {
    if out.as_os_str().is_empty() {
        return Err("choose where to save the .cact".into());
    }
    let out = crate::ending_in(&out, "cact");
    let record = studio.history().load(run_id)?;
    let entry = &record.entry;
    let adapter = entry.adapter.clone().ok_or("this run saved no adapter yet, so there is nothing to build")?;
    let width = needle_engine::settings::build_width(bits)?;
    let generation = needle_engine::checkpoint::file_generation(&entry.request.checkpoint);
    if let Some(refusal) = generation.and_then(|generation| generation.refuses_bits(width)) {
        return Err(format!("{refusal}; choose another width"));
    }
    let args: Vec<OsString> = vec![
        "build".into(),
        "--lora".into(),
        adapter.into(),
        "--tokenizer".into(),
        entry.request.tokenizer.clone().into(),
        "--bits".into(),
        bits.to_string().into(),
        "--out".into(),
        out.into(),
        "--events".into(),
        "jsonl".into(),
        "--".into(),
        entry.request.checkpoint.clone().into(),
    ];
    let worker = studio.worker().clone();
    let watcher =
        BuildWatcher { record, history: studio.history().clone(), worker, channel, built: None, failure: None };
    studio.worker().spawn(args, watcher).map(drop)
}

struct BuildWatcher {
    record: TrainingRecord,
    history: History,
    /// Scores the written file (`needle eval --weights`) after the build.
    worker: Worker,
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
    /// Opens the written file, scores it on the run's held-out examples, records it in the run's
    /// history, and says what was built.
    fn read_back(&mut self, path: PathBuf, scheme: String) -> Result<BuildMessage, String> {
        let file = CactFile::open(&path).map_err(|error| error.to_string())?;
        let (bytes, tensors) = (file.size() as u64, file.records.len());
        drop(file);
        self.send(BuildMessage::Scoring);
        let (scores, scores_error) = match self.score(&path) {
            Ok(scores) => (scores, None),
            Err(error) => (None, Some(error)),
        };
        let cact = CactInfo { path, bytes, tensors, scheme, scores, scores_error, published: None };
        self.record.entry.cact = Some(cact.clone());
        self.history.save(&self.record)?;
        Ok(BuildMessage::Built { cact, entry: Box::new(self.record.entry.clone()) })
    }

    /// `needle eval --weights FILE --accuracy` on the examples the run held out (the same ones its
    /// base and tuned scores used), so the table compares like with like.
    fn score(&self, cact: &Path) -> Result<Option<ModelScore>, String> {
        let entry = &self.record.entry;
        // Only a run whose base and tuned models were scored has a row to compare the file with.
        if entry.scores.is_none() {
            return Ok(None);
        }
        let scratch = tempfile::tempdir().map_err(|error| format!("no scratch folder for the scoring: {error}"))?;
        let answers = scratch.path().join("wrong.jsonl");
        let args: Vec<OsString> = vec![
            "eval".into(),
            "--weights".into(),
            cact.into(),
            "--tokenizer".into(),
            entry.request.tokenizer.clone().into(),
            "--accuracy".into(),
            "--answers".into(),
            answers.clone().into(),
            "--json".into(),
            "--val-split".into(),
            entry.request.settings.val_split.to_string().into(),
            "--seed".into(),
            entry.request.settings.seed.to_string().into(),
            "--max-len".into(),
            entry.request.settings.max_len.to_string().into(),
            "--max-examples".into(),
            SCORED_EXAMPLES.to_string().into(),
            "--".into(),
            entry.request.dataset.clone().into(),
        ];
        #[derive(serde::Deserialize)]
        struct Printed {
            loss: f64,
            accuracy: Accuracy,
        }
        let out = self.worker.output(args)?;
        let printed: Printed = serde_json::from_str(out.trim())
            .map_err(|error| format!("the .cact's evaluation was not understood ({error}): {out}"))?;
        let wrong = std::fs::read_to_string(&answers)
            .map_err(|error| format!("the .cact's wrong answers could not be read: {error}"))?
            .lines()
            .map(serde_json::from_str)
            .collect::<Result<Vec<Answered>, _>>()
            .map_err(|error| format!("the .cact's wrong answers were not understood ({error})"))?;
        Ok(Some(ModelScore { loss: printed.loss, calls: printed.accuracy, wrong }))
    }

    fn send(&self, message: BuildMessage) {
        // A closed window drops its channel; the file is written and recorded all the same.
        let _ = self.channel.send(message);
    }
}
