//! The Data step's state: the worker its reports and generations run in, their slots, the key
//! Generate asks with, and the chosen base model's generation (how lines are read).

use std::path::Path;
use std::sync::Arc;

use crate::data::generate::Generations;
use crate::data::report;
use crate::model::preferences::Remembered;
use crate::secrets::keys::Keys;
use crate::worker::process::{Slot, Worker};

/// Shared by the Data step's commands; cloning is cheap.
#[derive(Clone)]
pub struct DataStep {
    pub worker: Worker,
    /// The dataset report being computed: a newer request (another file, max length or tokenizer)
    /// ends it.
    pub report: Arc<Slot>,
    pub generations: Arc<Generations>,
    pub key: Arc<Keys>,
    pub preferences: Arc<Remembered>,
}

impl DataStep {
    pub fn new(worker: Worker, key: Arc<Keys>, preferences: Arc<Remembered>) -> Self {
        Self { worker, report: Arc::default(), generations: Arc::default(), key, preferences }
    }

    /// The dataset report (see [`report::report`]).
    pub fn report(
        &self,
        path: &Path,
        tokenizer: Option<&Path>,
        checkpoint: Option<&Path>,
        max_len: &serde_json::Value,
    ) -> Result<serde_json::Value, String> {
        let chosen = self.preferences.generation();
        report::report(&self.worker, &self.report, path, tokenizer, checkpoint, chosen, max_len)
    }
}
