//! A checked training: what it trains on, from which base, where, and how; the Train step makes one
//! from the window's draft, and every training's record keeps the one it ran.

use std::path::PathBuf;

use needle_engine::settings::TrainSettings;
use serde::{Deserialize, Serialize};

use crate::worker::job::Finetune;

/// A checked training: what it trains on, from which base, where, and how.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainingRequest {
    pub dataset: PathBuf,
    pub checkpoint: PathBuf,
    pub tokenizer: PathBuf,
    pub device: String,
    pub settings: TrainSettings,
}

impl TrainingRequest {
    /// The training as the worker takes it, its adapter saved to `adapter`.
    pub fn finetune(&self, adapter: PathBuf) -> Finetune {
        Finetune {
            dataset: self.dataset.clone(),
            checkpoint: self.checkpoint.clone(),
            tokenizer: self.tokenizer.clone(),
            device: self.device.clone(),
            settings: self.settings,
            adapter,
        }
    }
}
