//! The Evaluate step's state: the worker models answer in, the trainings' records (their adapters),
//! and the chosen base model (what Try asks without a training).

use std::sync::Arc;

use crate::model::preferences::Remembered;
use crate::record::trainings::Records;
use crate::worker::process::Worker;

/// Shared by the Evaluate step's commands; cloning is cheap.
#[derive(Clone)]
pub struct EvaluateStep {
    pub worker: Worker,
    pub records: Records,
    pub base: Arc<Remembered>,
}
