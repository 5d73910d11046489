//! A training from the app: `needle finetune --events jsonl` in the worker, its events turned into
//! messages for the window (progress, the loss chart, the log) and into the training's history record.

use std::time::{Duration, Instant};

use needle_engine::train::Event;
use serde::Serialize;
use tauri::ipc::Channel;

use crate::chart;
use crate::record::request::TrainingRequest;
use crate::record::trainings::{HistoryEntry, Records, TrainingRecord, TrainingStatus};
use crate::train::slot::{Claim, TrainingSlot};
use crate::worker::job::Job;
use crate::worker::process::{Exit, Line, Watcher, Worker};

/// What the window hears about a training.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum TrainingMessage {
    /// The worker's `started`, `step` and `epoch` events, as they are.
    Progress(Event),
    /// The loss chart, redrawn.
    Chart {
        svg: String,
    },
    Log {
        line: String,
    },
    Finished {
        entry: HistoryEntry,
    },
    Failed {
        message: String,
        entry: HistoryEntry,
    },
}

/// Shows a desktop notification: (title, body).
pub type Show = Box<dyn Fn(&str, &str) + Send>;

/// The desktop notification at a training's end, shown when the training took at least `after`.
pub struct Notify {
    pub after: Duration,
    pub show: Show,
}

/// Redraw the chart at most this often while steps stream in.
const CHART_EVERY: Duration = Duration::from_millis(250);

/// Where a training runs and is kept: the worker, the records on disk, and the one slot.
pub struct Place<'a> {
    pub worker: &'a Worker,
    pub records: &'a Records,
    pub slot: &'a TrainingSlot,
}

/// Starts `request` in the worker; messages go to `channel` until `finished` or `failed`.
pub fn start(
    place: &Place,
    request: &TrainingRequest,
    channel: Channel<TrainingMessage>,
    notify: Notify,
) -> Result<HistoryEntry, String> {
    let claim = place.slot.begin()?;
    let (record, adapter) = place.records.create(request)?;
    let job = Job::Train { finetune: request.finetune(adapter), plan_only: false };
    start_worker(place, claim, record, &job, channel, notify)
}

/// Continues training `id`, which ended early, from the state it saved: same settings, same folder,
/// same record, its loss curve carried on.
pub fn resume(
    place: &Place,
    id: &str,
    channel: Channel<TrainingMessage>,
    notify: Notify,
) -> Result<HistoryEntry, String> {
    let claim = place.slot.begin()?;
    let mut record = place.records.load(id)?;
    let entry = place.records.listed(record.entry.clone(), None);
    if !entry.resumable {
        return Err(match entry.status {
            TrainingStatus::Finished => "this training finished; there is nothing to resume".into(),
            _ => "this training saved no training state to resume from; start it again instead".into(),
        });
    }
    let job = Job::Resume(entry.request.finetune(place.records.adapter_path(&entry)));
    record.entry.status = TrainingStatus::Running;
    record.entry.message = None;
    start_worker(place, claim, record, &job, channel, notify)
}

/// Runs `job` in the worker for `record`, in the training slot `claim` holds.
fn start_worker(
    place: &Place,
    claim: Claim<'_>,
    mut record: TrainingRecord,
    job: &Job,
    channel: Channel<TrainingMessage>,
    notify: Notify,
) -> Result<HistoryEntry, String> {
    let saved = record.clone();
    let entry = record.entry.clone();
    let earlier_seconds = record.entry.seconds.take().unwrap_or(0.0);
    let watcher = TrainingWatcher {
        record,
        records: place.records.clone(),
        channel,
        notify,
        slot: place.slot.clone(),
        started: Instant::now(),
        earlier_seconds,
        last_chart: None,
    };
    let process = place.worker.spawn(job, watcher)?;
    claim.fill(entry.id.clone(), process);
    // Only once the worker runs: a resume that could not start leaves the record as it was. Its
    // watcher saves it again at every epoch and at the end, so a failure here loses nothing.
    let _ = place.records.save(&saved);
    Ok(entry)
}

struct TrainingWatcher {
    record: TrainingRecord,
    records: Records,
    channel: Channel<TrainingMessage>,
    notify: Notify,
    slot: TrainingSlot,
    started: Instant,
    /// Time spent in the invocations before this one (a resumed training).
    earlier_seconds: f64,
    last_chart: Option<Instant>,
}

impl Watcher for TrainingWatcher {
    fn line(&mut self, line: Line) {
        match line {
            Line::Stdout(text) => match serde_json::from_str::<Event>(&text) {
                Ok(event) => self.event(event),
                Err(_) => self.log(text),
            },
            Line::Stderr(text) => self.log(text),
        }
    }

    fn exit(mut self, exit: Exit) {
        let id = self.record.entry.id.clone();
        let closing = self.slot.is_closing(&id);
        let entry = &mut self.record.entry;
        if closing && matches!(entry.status, TrainingStatus::Running | TrainingStatus::Stopped) {
            // Asked to stop, or killed, because the app is closing: whatever the worker managed to
            // save is kept, and Resume goes on from there.
            entry.status = TrainingStatus::Interrupted;
            let resume = if entry.adapter.is_some() { "; Resume continues from the last save" } else { "" };
            entry.message =
                Some(format!("cut short at step {} of {} when the app closed{resume}", entry.steps_done, entry.steps));
        } else if entry.status == TrainingStatus::Running {
            // The worker ended without `finished` or `failed`: killed by Cancel, or it crashed.
            if exit.killed {
                entry.status = TrainingStatus::Stopped;
                entry.message = Some(match &entry.adapter {
                    Some(_) => "stopped at once; the adapter from the last finished epoch is kept".into(),
                    None => "stopped at once, before the first epoch ended: no adapter was saved".into(),
                });
            } else {
                entry.status = TrainingStatus::Failed;
                entry.message = Some(exit.describe("the training worker"));
            }
        }
        let elapsed = self.started.elapsed();
        entry.seconds.get_or_insert(self.earlier_seconds + elapsed.as_secs_f64());
        if let Err(error) = self.slot.finish(&id, || self.records.save(&self.record)) {
            self.log(error);
        }
        self.send(TrainingMessage::Chart { svg: self.chart() });
        let entry = self.records.listed(self.record.entry.clone(), None);
        if elapsed >= self.notify.after {
            (self.notify.show)("Needle Studio", &summary(&entry));
        }
        match (entry.status, entry.message.clone()) {
            (TrainingStatus::Failed, message) => {
                self.send(TrainingMessage::Failed { message: message.unwrap_or_default(), entry });
            }
            _ => self.send(TrainingMessage::Finished { entry }),
        }
    }
}

impl TrainingWatcher {
    fn event(&mut self, event: Event) {
        let entry = &mut self.record.entry;
        let mut redraw = false;
        match &event {
            Event::Started { backend, device, steps, first_step, .. } => {
                entry.backend = Some(format!("{backend} ({device})"));
                entry.steps = *steps;
                entry.steps_done = *first_step;
                // A resumed training replays the steps after its last save: their old losses go.
                self.record.curve.train.retain(|&(step, _)| step <= *first_step);
                self.record.curve.val.retain(|&(step, _)| step <= *first_step);
            }
            Event::Step { step, loss, .. } => {
                entry.steps_done = *step;
                entry.final_loss = Some(*loss);
                self.record.curve.train.push((*step, *loss));
                redraw = self.last_chart.is_none_or(|at| at.elapsed() >= CHART_EVERY);
            }
            Event::Unscored { message } => {
                self.log(format!("the held-out examples were not scored: {message}"));
            }
            Event::HeadFitted { rows, right, auroc, seconds, .. } => {
                let auroc = auroc.map_or(String::new(), |v| format!(", cross-fitted AUROC {v:.3}"));
                self.log(format!(
                    "fitted the confidence head on {rows} training rows ({right} answered right){auroc}, in {seconds:.1} s"
                ));
            }
            Event::NoHead { message } => self.log(format!("no confidence head: {message}")),
            Event::Scoring { examples } => {
                self.log(format!("answering {examples} held-out examples with the base and the tuned model"));
            }
            Event::Epoch { epoch, loss, val } => {
                entry.final_val = *val;
                if let Some(val) = val {
                    self.record.curve.val.push((entry.steps_done, *val));
                }
                let val = val.map(|v| format!(", validation {v:.4}")).unwrap_or_default();
                self.log(format!("epoch {epoch}: loss {loss:.4}{val}"));
                redraw = true;
            }
            Event::Saved { path } => {
                entry.adapter = Some(path.clone());
                let line = format!("saved the adapter to {}", path.display());
                if let Err(error) = self.records.save(&self.record) {
                    self.log(error);
                }
                self.log(line);
                return;
            }
            Event::Finished { adapter, seconds, partial, accuracy } => {
                entry.adapter = Some(adapter.clone());
                entry.scores = accuracy.clone();
                entry.seconds = Some(self.earlier_seconds + seconds);
                entry.status = if *partial { TrainingStatus::Stopped } else { TrainingStatus::Finished };
                if *partial {
                    entry.message = Some(format!(
                        "stopped after step {} of {}; the adapter holds what was learned so far",
                        entry.steps_done, entry.steps
                    ));
                }
                return;
            }
            Event::Failed { message } => {
                entry.status = TrainingStatus::Failed;
                entry.message = Some(message.clone());
                return;
            }
        }
        self.send(TrainingMessage::Progress(event));
        if redraw {
            self.last_chart = Some(Instant::now());
            self.send(TrainingMessage::Chart { svg: self.chart() });
        }
    }

    fn chart(&self) -> String {
        let curve = &self.record.curve;
        chart::loss(&curve.train, &curve.val, self.record.entry.steps)
    }

    fn log(&self, line: String) {
        self.send(TrainingMessage::Log { line });
    }

    fn send(&self, message: TrainingMessage) {
        // A closed window drops its channel; the training goes on and its record is still saved.
        let _ = self.channel.send(message);
    }
}

/// One line for the notification.
fn summary(entry: &HistoryEntry) -> String {
    let name = entry.request.dataset.file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    match (entry.status, entry.final_loss) {
        (TrainingStatus::Failed, _) => {
            format!("Fine-tuning on {name} failed: {}", entry.message.as_deref().unwrap_or(""))
        }
        (TrainingStatus::Stopped, _) => format!("Fine-tuning on {name} stopped; the adapter is saved."),
        (TrainingStatus::Interrupted, _) => format!("Fine-tuning on {name} was cut short; Resume continues it."),
        (_, Some(loss)) => format!("Fine-tuning on {name} finished: final loss {loss:.4}."),
        _ => format!("Fine-tuning on {name} finished."),
    }
}
