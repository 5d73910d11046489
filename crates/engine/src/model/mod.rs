//! The network, computed in f32: candle modules, and a hand-written CPU path.
//!
//! The network of both generations is the reference's `SimpleAttentionNetwork` ([`san`]: network,
//! stack, block, attention, engram), Needle 3 adding to Needle 2's layers (q/k heads narrower than
//! the v heads, Q/K/V convolution taps, windowed layers, an output slice of the vocabulary) and
//! changing its MLP (learned Monarch transforms where Needle 2 has fixed Walsh rotations); the
//! config's [`crate::generation::Generation`] picks. Around it: the weights source ([`params`]),
//! linear and low-rank layers ([`linear`]), norms, the fused [`kernels`], the loss, batch
//! [`packing`], evaluation and decoding.
//!
//! A batch is laid out packed ([`packing`]): its rows without their padding, and the prompt
//! prefix that rows share (an app's tools prompt) once, its keys and values read by every row that
//! continues it.
//!
//! Two paths compute the same network. On the CPU, the hand-written one ([`CpuNetwork`]): each
//! layer's forward keeps what its own backward needs, the backward is written out by hand,
//! attention is flash-style, and the matrix products are `gemm` calls on the weights in place. On
//! every device, candle's ops with its autograd: the frozen base enters through
//! [`kernels::frozen_matmul`] (no weight gradient), LoRA is a [`LowRank`] update beside it, and
//! the widest element-wise steps are fused [`kernels`] with hand-written backward passes. The
//! candle path is what CUDA and Metal run, and what the CPU path is checked against. [`Forward`]
//! (in `forward.rs`) holds whichever path a network takes, and is the one place that chooses.
//!
//! Greedy decoding ([`decode`]) runs the same layers a few tokens at a time, with each layer's keys
//! cached and the engram memories recomputed from the few tokens of history they reach.
//! Parameters are read from a [`Params`] source whose paths are the checkpoint's own
//! (`stack/layers/block/self_attn/q_proj/kernel`).

pub mod decode;
pub mod eval;
mod fast;
mod forward;
pub mod kernels;
pub mod linear;
pub mod loss;
pub mod norm;
pub mod packing;
pub mod params;
#[cfg(test)]
mod parity_tests;
pub mod san;

pub use candle_core::Device;
pub use decode::{Completion, Prefilled, Stop};
pub use eval::{evaluate, EvalSummary};
pub use fast::{CpuNetwork, HostFactors, HostGrads, Workspace};
pub use forward::Forward;
pub use linear::LowRank;
pub use loss::{masked_ce_sum, masked_loss};
pub use params::{ParamPath, Params, Qat};
pub use san::Network;

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
