//! The depth ladder from the Export step: `needle eval --ladder --events jsonl` in the worker scores
//! every rung of a Needle 3 training's tuned model, its progress and then its table (with a chart)
//! sent to the window. One sweep at a time; Cancel asks the worker to stop (`cancel` on stdin).

use std::sync::{Arc, Mutex};

use needle_engine::calls::ladder::{laddered_generations, Ladder, LadderEvent};
use needle_engine::train::finetune::SCORED_EXAMPLES;
use serde::Serialize;
use tauri::ipc::Channel;

use crate::chart;
use crate::ground::lock;
use crate::record::trainings::Records;
use crate::worker::job::Job;
use crate::worker::process::{CancelAnswer, Exit, Line, Process, Watcher, Worker};

/// The sweep running, for Cancel.
pub type Sweep = Arc<Mutex<Option<Running>>>;

/// A sweep's worker, and whether Cancel has asked it to stop (a second Cancel ends it).
pub struct Running {
    process: Arc<Process>,
    stopping: bool,
}

/// What the window hears about a sweep.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum LadderMessage {
    /// The worker's `started`, `rung`, `answered` and `scored` events, as they are.
    Progress(Box<LadderEvent>),
    /// Every rung scored, and the chart of their exact calls.
    Finished {
        ladder: Ladder,
        svg: String,
    },
    Cancelled,
    Failed {
        message: String,
    },
}

/// Scores each rung of training `training_id`'s tuned model on its held-out examples.
pub fn start(
    worker: &Worker,
    records: &Records,
    sweep: &Sweep,
    training_id: &str,
    channel: Channel<LadderMessage>,
) -> Result<(), String> {
    let entry = records.load(training_id)?.entry;
    let adapter = entry.adapter.ok_or("this training saved no adapter yet, so it has no ladder to score")?;
    let mut running = lock(sweep);
    if running.is_some() {
        return Err("a ladder is being scored; wait for it or cancel it".into());
    }
    let job = Job::Ladder {
        checkpoint: entry.request.checkpoint,
        adapter,
        tokenizer: entry.request.tokenizer,
        dataset: entry.request.dataset,
        settings: entry.request.settings,
        examples: SCORED_EXAMPLES,
    };
    let watcher = LadderWatcher { sweep: Arc::clone(sweep), channel, ladder: None, cancelled: false, failure: None };
    *running = Some(Running { process: worker.spawn(&job, watcher)?, stopping: false });
    Ok(())
}

/// Why training `training_id`'s model has no ladder (a generation trained without one), or `None`.
pub fn refusal(records: &Records, training_id: &str) -> Result<Option<String>, String> {
    let checkpoint = records.load(training_id)?.entry.request.checkpoint;
    Ok(match needle_engine::checkpoint::file_generation(&checkpoint) {
        Some(generation) if !generation.profile().ships.depth_ladder => Some(format!(
            "The depth ladder is {}'s: every depth of such a model is a smaller model. This {generation} model \
             is built whole.",
            laddered_generations()
        )),
        _ => None,
    })
}

/// Asks the sweep going to stop at its next answer, or, asked again, ends its worker at once; its
/// outcome follows on its channel.
pub fn cancel(sweep: &Sweep) -> CancelAnswer {
    match lock(sweep).as_mut() {
        None => CancelAnswer::Idle,
        Some(running) => running.process.cancel(&mut running.stopping),
    }
}

struct LadderWatcher {
    sweep: Sweep,
    channel: Channel<LadderMessage>,
    ladder: Option<Ladder>,
    cancelled: bool,
    failure: Option<String>,
}

impl Watcher for LadderWatcher {
    fn line(&mut self, line: Line) {
        // Stderr only matters if the worker dies; `Exit` keeps its tail.
        let Line::Stdout(text) = line else { return };
        match serde_json::from_str::<LadderEvent>(&text) {
            Ok(LadderEvent::Finished { ladder }) => self.ladder = Some(ladder),
            Ok(LadderEvent::Cancelled { .. }) => self.cancelled = true,
            Ok(LadderEvent::Failed { message }) => self.failure = Some(message),
            Ok(progress) => self.send(LadderMessage::Progress(Box::new(progress))),
            Err(_) => {}
        }
    }

    fn exit(mut self, exit: Exit) {
        *lock(&self.sweep) = None;
        let message = match (self.ladder.take(), self.cancelled) {
            (Some(ladder), _) => LadderMessage::Finished { svg: chart::ladder(&ladder), ladder },
            (None, true) => LadderMessage::Cancelled,
            (None, false) if exit.killed => LadderMessage::Cancelled,
            (None, false) => LadderMessage::Failed {
                message: self.failure.take().unwrap_or_else(|| exit.describe("the ladder worker")),
            },
        };
        self.send(message);
    }
}

impl LadderWatcher {
    fn send(&self, message: LadderMessage) {
        // A closed window drops its channel; the sweep's outcome then has no one to tell.
        let _ = self.channel.send(message);
    }
}
