//! The network, computed in f32: candle modules, and a hand-written CPU path.
//!
//! The network of both generations is the reference's `SimpleAttentionNetwork` (network, stack,
//! block, attention, MLPs, engram: each part's weights in [`weights`], computed by [`san`] on candle
//! and by `fast` by hand, in files of the same names), Needle 3 adding to Needle 2's layers (q/k heads narrower than
//! the v heads, Q/K/V convolution taps, windowed layers, an output slice of the vocabulary) and
//! changing its MLP (learned Monarch transforms where Needle 2 has fixed Walsh rotations); the
//! config's [`crate::generation::Generation`] picks. Under both paths: the weights source ([`params`]),
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
mod error;
pub mod eval;
mod fast;
mod forward;
mod host;
pub mod kernels;
pub mod linear;
pub mod loss;
pub mod norm;
pub mod packing;
pub mod params;
#[cfg(test)]
mod parity_tests;
mod qat;
pub mod san;
pub mod weights;

pub use candle_core::Device;
pub use decode::{Batch, Completion, Prefilled, Stop, Until};
pub use error::{ModelError, Result};
pub use eval::{evaluate, EvalSummary};
pub use fast::{CpuNetwork, HostFactors, Workspace};
pub use forward::Forward;
pub use linear::{HostGrads, LowRank};
pub use loss::{masked_ce_sum, masked_loss};
pub use params::{ParamPath, Params};
pub use qat::Qat;
pub use weights::network::Network;
