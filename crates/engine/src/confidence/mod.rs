//! The confidence head: how sure the model is of a turn, read off its hidden cells.
//!
//! Both generations carry a `confidence_head` that pools the hidden cells of every depth — the
//! scaled token embedding, then the lane mean of the mHC stream after each block, `[B, T, R, d]`
//! with `R = num_layers + 1` — over the tokens that are not PAD, and projects the pooled vectors to
//! one logit per sequence; the confidence is its sigmoid. The generations pool differently
//! (docs/confidence.md has the math, shapes and the `.cact` layout of each):
//!
//! - **Needle 2** (2.0.8's `ConfidenceHead`): `k` probes (8) of width `d`, each a softmax over all
//!   `T·R` token × depth cells at once; the `k` pooled vectors, concatenated, go through one dense
//!   layer (`proj`).
//! - **Needle 3** (3.2.8's `ProbeHead`): `k` probes per depth row, each a softmax over that row's
//!   tokens; the pooled vectors RMS-normalised and scaled by `gain`; then `q` queries, each a
//!   softmax over all `R·k` pooled vectors (scores plus `row_bias`); the `q` results, concatenated,
//!   through `proj`. A shallower rung of the depth ladder masks the rows of the blocks it skips.
//!
//! The head is a pure function of its inputs ([`ConfidenceHead::logits`]), computed in f32 as the
//! rest of the network is; parameters are named as the checkpoint names them
//! (`confidence_head/proj/kernel`).

pub mod cells;
#[cfg(test)]
mod cells_tests;
pub mod file;
pub mod fit;
pub mod forward;
pub mod head;
#[cfg(test)]
mod parity_tests;
pub mod reader;
#[cfg(test)]
mod reader_tests;

pub use file::{companion_path, HeadFileError, Reading, TrainedHead};
pub use fit::{cross_fit, Calibration, Fitted};
pub use forward::HeadStack;
pub use head::{confidence, ConfidenceHead, HeadError, PooledHead, ProbeHead, Result, KEY};
pub use reader::TurnHead;
