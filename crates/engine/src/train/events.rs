//! Progress of a training run as typed events: the CLI renders them as a progress bar or as JSON
//! lines (`--events jsonl`), and the desktop app consumes the same stream.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// One thing that happened during `needle finetune`, in order: `started`, then `step`s with an
/// `epoch` and a `saved` after each epoch, then `finished` — or `failed` at any point.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    Started {
        backend: String,
        device: String,
        /// Training examples (after the validation split).
        examples: usize,
        /// Held-out validation examples.
        validation: usize,
        seq_len: usize,
        /// Optimizer updates in the whole run.
        steps: usize,
        warmup: usize,
        memory_estimate_bytes: u64,
        /// The update the run starts from (non-zero when resumed).
        first_step: usize,
    },
    Step {
        step: usize,
        total: usize,
        loss: f32,
        lr: f32,
        tokens_per_s: f64,
        eta_s: f64,
    },
    Epoch {
        epoch: usize,
        /// The loss of the epoch's last batch (the reference prints the same).
        loss: f32,
        /// Mean validation loss over validation batches; `None` without a validation split.
        val: Option<f32>,
    },
    Saved {
        path: PathBuf,
    },
    Finished {
        adapter: PathBuf,
        seconds: f64,
        /// True when the run was cancelled before its last step.
        partial: bool,
    },
    Failed {
        message: String,
    },
}
