//! What can go wrong building or running the network: one error type for both compute paths.

/// What can go wrong building or running the network.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(
        "checkpoint parameter `{path}` is missing (expected shape {expected:?}); the checkpoint does not \
         match its config — check the config's layer/width/engram settings or re-export the checkpoint"
    )]
    MissingParam { path: String, expected: Vec<usize> },
    #[error(
        "checkpoint parameter `{path}` has shape {actual:?} but the config implies {expected:?}; fix the \
         config's geometry (d_model, heads, layers, lanes, engram settings) to match the params"
    )]
    ParamShape { path: String, expected: Vec<usize>, actual: Vec<usize> },
    #[error(
        "checkpoint parameter `{path}` is not used by a network with this config ({count} unexpected in \
         all); the config describes fewer layers/engram sites/parts than the params hold"
    )]
    UnexpectedParam { path: String, count: usize },
    #[error(
        "tokenizer `{path}` has a vocabulary of {tokenizer_vocab} but the model's is {model_vocab}; use the \
         tokenizer.model the checkpoint was trained with"
    )]
    VocabMismatch { path: std::path::PathBuf, tokenizer_vocab: usize, model_vocab: usize },
    #[error("the model was given no tokens (an empty batch or zero-length rows); pass at least one token")]
    EmptyBatch,
    #[error("invalid model config: `{field}` {reason}")]
    InvalidConfig { field: &'static str, reason: String },
    #[error(
        "token id {id} at batch row {row}, position {position} is outside the model's vocabulary of \
         {vocab}; use the tokenizer that belongs to this checkpoint"
    )]
    TokenOutOfRange { id: u32, row: usize, position: usize, vocab: usize },
    #[error(
        "answer token id {id} is beyond the {rows} vocabulary rows the model's output head scores \
         (`out_vocab`), so the model can never write it; use the tokenizer that belongs to this checkpoint"
    )]
    TargetOutsideHead { id: u32, rows: usize },
    #[error(
        "adapter entry `{path}`: {reason}; the adapter was trained for another base model (its recorded \
         base is `{base}`) — pass the checkpoint it was trained from"
    )]
    AdapterMismatch { path: String, reason: String, base: String },
    #[error(
        "{what} is not supported yet: Needle Studio runs Needle 3 only in part so far (use a Needle 2 model for it)"
    )]
    Unsupported { what: String },
    #[error("tensor computation failed: {0}")]
    Candle(#[from] candle_core::Error),
}

pub type Result<T> = std::result::Result<T, ModelError>;
