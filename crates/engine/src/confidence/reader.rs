//! A trained head reading the turns a model answers: the companion file of the adapter (or the head
//! a `.cact` carries) loaded once, checked against the model, and each answer's calibrated head
//! probability computed from the hidden cells of the network that answered.

use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};

use super::cells::row_cells;
use super::file::{companion_path, HeadFileError, Reading, TrainedHead};
use super::fit::Calibration;
use super::head::{ConfidenceHead, HeadError};
use crate::cact::CactFile;
use crate::config::ModelConfig;
use crate::model::{Forward, ModelError};

/// A trained head ready to read turns, in the form it was calibrated in (Needle 3's through CQ-4,
/// as the `.cact` runs it).
#[derive(Debug, Clone)]
pub struct TurnHead {
    head: ConfidenceHead,
    calibration: Calibration,
    reads: Reading,
    path: PathBuf,
}

impl TurnHead {
    /// The head kept beside `adapter` for a model of `cfg`, or `None` when there is no companion
    /// file. A file that cannot be read, or whose head belongs to another model, is an error naming
    /// it and the fix.
    pub fn beside(adapter: &Path, cfg: &ModelConfig) -> Result<Option<Self>, HeadFileError> {
        let path = companion_path(adapter);
        if !path.exists() {
            return Ok(None);
        }
        let refit = format!(
            "fit it again for this adapter with `needle finetune --confidence`, or remove the file to score \
             {} with its decode probability alone",
            adapter.display()
        );
        let trained = TrainedHead::load(&path).map_err(|error| match error {
            HeadFileError::Invalid { path, problem } => {
                HeadFileError::Invalid { path, problem: format!("{problem}; {refit}") }
            }
            other => other,
        })?;
        let invalid = |problem: String| HeadFileError::Invalid { path: path.clone(), problem };
        if let Some(problem) = trained.misfit(cfg) {
            return Err(invalid(format!("{problem}; {refit}")));
        }
        let head = trained.head.through_cq().map_err(|e| invalid(e.to_string()))?;
        Ok(Some(Self { head, calibration: trained.calibration, reads: trained.reads, path }))
    }

    /// The confidence head `cact` (read from `path`) carries, or `None` when it carries none. The
    /// head is the file's as stored (Needle 3's matrices from their CQ-4 codes, the rest FP16), so
    /// it is already in the form the file runs it. A `.cact` records no calibration and no reading:
    /// the head `needle build` ships from a trained one has its calibration folded into the
    /// projection, so the calibration here is the identity, and the head reads the prompt and the
    /// answer, the one reading a trained head is fitted to. A head that cannot be read, or does
    /// not fit the file's own model, is an error naming the file.
    pub fn in_cact(cact: &CactFile, path: &Path) -> Result<Option<Self>, HeadFileError> {
        let head = cact.confidence_head(&Device::Cpu).map_err(|e| HeadFileError::Invalid {
            path: path.to_path_buf(),
            problem: format!("its confidence head cannot be read: {e}; build the file again with `needle build`"),
        })?;
        Ok(head.map(|head| Self {
            head,
            calibration: Calibration::IDENTITY,
            reads: Reading::PromptAndAnswer,
            path: path.to_path_buf(),
        }))
    }

    /// The file the head was read from: the adapter's companion file, or the `.cact`.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The calibrated probability that the turn's answer is right: `σ(a·logit + b)` of the head's
    /// logit on the cells of `prompt` (BOS first) and, where the head reads it, the `answer` the
    /// model gave, computed by `forward`.
    pub fn confidence(&self, forward: &mut Forward, prompt: &[u32], answer: &[u32]) -> crate::model::Result<f64> {
        // The head is read onto the CPU; the cells of one turn are small enough to follow it there
        // from whatever device the network runs on.
        let cells =
            row_cells(forward, &[self.reads.tokens(prompt, answer)], None)?.remove(0).to_device(&Device::Cpu)?;
        let keep = Tensor::ones((1, cells.dim(1)?), candle_core::DType::F32, &Device::Cpu)?;
        let logit = self.head.logits(&cells, &keep, None).map_err(model_error)?;
        Ok(self.calibration.confidence(f64::from(logit.to_vec1::<f32>()?[0])))
    }
}

/// A head error met while answering, as the model's: the head was checked against the model when
/// it was loaded, so what is left is the computation's own.
fn model_error(error: HeadError) -> ModelError {
    match error {
        HeadError::Model(error) => error,
        HeadError::Candle(error) => ModelError::Candle(error),
        other => ModelError::Candle(candle_core::Error::Msg(other.to_string())),
    }
}
