//! The Train step's state: the worker trainings run in, their records on disk, the one training in
//! progress, the devices a training may ask for, and the preferences (when a training's end is
//! notified).

use std::sync::Arc;

use needle_engine::train::Plan;

use crate::model::preferences::Remembered;
use crate::record::request::TrainingRequest;
use crate::record::trainings::Records;
use crate::train::draft::TrainingDraft;
use crate::train::job::Place;
use crate::train::slot::TrainingSlot;
use crate::worker::job::Job;
use crate::worker::process::Worker;

/// Shared by the Train step's commands; cloning is cheap.
#[derive(Clone)]
pub struct TrainStep {
    pub worker: Worker,
    pub records: Records,
    pub slot: TrainingSlot,
    /// The device selector's choices (the Model step's).
    pub devices: Arc<[String]>,
    pub preferences: Arc<Remembered>,
}

impl TrainStep {
    pub fn place(&self) -> Place<'_> {
        Place { worker: &self.worker, records: &self.records, slot: &self.slot }
    }

    /// The training as asked for, or every problem with it in one message.
    pub fn check(&self, draft: &TrainingDraft) -> Result<TrainingRequest, String> {
        draft.check(&self.devices).map_err(|errors| {
            let problems: Vec<String> = errors.iter().map(|(field, message)| format!("{field}: {message}")).collect();
            format!("the training is not ready: {}", problems.join("; "))
        })
    }

    /// `needle finetune --dry-run` in the worker: steps, sequence length, memory estimate.
    pub fn plan(&self, draft: &TrainingDraft) -> Result<Plan, String> {
        let request = self.check(draft)?;
        // Its own scratch folder: plans made side by side never share a file.
        let scratch = tempfile::tempdir().map_err(|error| format!("could not make a scratch folder: {error}"))?;
        let job = Job::Train { finetune: request.finetune(scratch.path().join("adapter.pkl")), plan_only: true };
        let out = self.worker.output(&job)?;
        serde_json::from_str(out.trim())
            .map_err(|error| format!("the worker's plan was not understood ({error}): {out}"))
    }
}
