//! What can stop a run, before or during training, and a golden file the gradient check cannot use.

use std::path::PathBuf;

use crate::calls::WeightsLoadError;
use crate::confidence::file::HeadFileError;
use crate::confidence::head::HeadError;
use crate::dataset::DatasetError;
use crate::lora::{AdapterFileError, LoadError};
use crate::model::ModelError;
use crate::settings::OutOfRange;
use crate::tokenizer::TokenizerError;

/// What can stop a run, before or during training.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error(transparent)]
    OutOfRange(#[from] OutOfRange),
    #[error("output directory {} is not writable: {source}; pick another --out/--checkpoint-dir", dir.display())]
    OutputDir { dir: PathBuf, source: std::io::Error },
    #[error("--resume: no saved state at {}; run once without --resume first", path.display())]
    NothingToResume { path: PathBuf },
    #[error("{} has no weight LoRA can adapt (no non-zero q/k/v/gate/out projection kernel under stack/layers)", checkpoint.display())]
    NoTargets { checkpoint: PathBuf },
    #[error(
        "{}: no training row's answer fits in {seq_len} positions (--max-len {cap}, the model's max_seq_len \
         {max_seq_len}): the shortest prompt takes {shortest_prompt} (BOS included); shorten the tools prompt or use \
         a model with a longer context",
        data.display()
    )]
    AnswersPastLength { data: PathBuf, seq_len: usize, cap: usize, max_seq_len: usize, shortest_prompt: usize },
    #[error(
        "step {step}: the {which} loss is {loss}, so the run stopped there without saving the adapter; {}",
        diverged_fix(*step)
    )]
    NonFiniteLoss { step: usize, which: &'static str, loss: f32 },
    #[error(
        "step {step}: the adapter's `{factor}` holds a NaN or an infinity, so the run stopped there without \
         saving it; the update left the range float32 holds: lower --lr"
    )]
    NonFiniteFactor { step: usize, factor: String },
    #[error(transparent)]
    Dataset(#[from] DatasetError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error(transparent)]
    Model(#[from] ModelError),
    /// Writing the adapter or the run's state, or reading the state back for `--resume`: the
    /// run's own files, where [`LoadError`] is the weights it starts from.
    #[error(transparent)]
    Adapter(#[from] AdapterFileError),
    /// Boxed, as `Golden`: the largest of the errors, it would make every `Result` of training carry its size.
    #[error(transparent)]
    Weights(Box<WeightsLoadError>),
    #[error(transparent)]
    Head(#[from] HeadError),
    #[error(transparent)]
    HeadFile(#[from] HeadFileError),
    #[error(transparent)]
    Golden(Box<GoldenError>),
}

impl From<WeightsLoadError> for TrainError {
    fn from(error: WeightsLoadError) -> Self {
        TrainError::Weights(Box::new(error))
    }
}

impl From<GoldenError> for TrainError {
    fn from(error: GoldenError) -> Self {
        TrainError::Golden(Box::new(error))
    }
}

pub type Result<T> = std::result::Result<T, TrainError>;

/// Why a loss at `step` is not a number, and what to do: the first step's is the base model's own
/// (a fresh adapter changes nothing), a later one's comes of the updates.
fn diverged_fix(step: usize) -> &'static str {
    match step {
        0 | 1 => "the base model's outputs already overflow float32, so the checkpoint is damaged: use another",
        _ => "the updates took the weights past the range float32 holds: lower --lr",
    }
}

/// A golden file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum GoldenError {
    #[error("{}: {source}; pass a safetensors file", path.display())]
    Read { path: PathBuf, source: Box<candle_core::Error> },
    #[error(
        "{}: no tensor `{key}`; a batch holds `ids` and `mask` ([rows, length]), an adapter `<weight>/A` and \
         `<weight>/B` for each adapted weight",
        path.display()
    )]
    Missing { path: PathBuf, key: String },
    #[error(
        "{}: adapts {found:?}, but the weights LoRA adapts in the checkpoint are {expected:?}; pass the \
         adapter made for this checkpoint",
        path.display()
    )]
    Targets { path: PathBuf, expected: Vec<String>, found: Vec<String> },
    #[error("{}: `{key}` is not a [rows, length] table of numbers ({source})", path.display())]
    Shape { path: PathBuf, key: String, source: Box<candle_core::Error> },
}
