//! Loading the weights to run or build: the one error every loader answers with, and the adapter
//! file read and merged, so `needle build`, evaluation and training wrap the same three failures
//! (a checkpoint that cannot be read, an adapter file that cannot, an adapter that does not fit)
//! once each instead of three variants each.

use std::path::Path;

use super::file::{load_adapter, AdapterFileError};
use super::merge::{merge_into_checkpoint, merge_into_params, MergeError};
use crate::checkpoint::{Checkpoint, CheckpointError, PickledAdapter};
use crate::model::Params;

/// Why weights could not be loaded. Each message is its source's own, which names the file.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error(transparent)]
    Adapter(#[from] AdapterFileError),
    /// Names the adapter file and the weight.
    #[error(transparent)]
    Merge(#[from] MergeError),
}

/// Where an adapter is merged (see [`super::merge`] for why the two differ).
pub enum MergeInto<'a> {
    /// The checkpoint's arrays as stored, as `needle build` (and 3.x's build) merges.
    Checkpoint(&'a mut Checkpoint),
    /// Weights already widened to float32, as evaluation (and 3.x's finetune) merges.
    Params(&'a mut Params),
}

/// Reads the adapter file at `lora` and merges it into `target`; the adapter, for what it holds.
pub fn merge_adapter_file(lora: &Path, target: MergeInto) -> Result<PickledAdapter, LoadError> {
    let adapter = load_adapter(lora)?;
    match target {
        MergeInto::Checkpoint(ckpt) => merge_into_checkpoint(ckpt, &adapter)?,
        MergeInto::Params(params) => {
            merge_into_params(params, &adapter)?;
        }
    }
    Ok(adapter)
}
