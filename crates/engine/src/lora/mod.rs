//! LoRA adapters as the reference trains them: which weights get one, how they start, and how
//! they enter the network.
//!
//! Each adapted kernel `W` (`[layers, in, out]` for the stacked blocks) gets `A` `[layers, in, r]`
//! and `B` `[layers, r, out]`; the network computes `x·W + (alpha / r)·(x·A)·B` (see
//! [`crate::model::LowRank`]). `A` starts as N(0, 1)/r
//! and `B` as zeros, so training starts from the base model's exact outputs.

mod adapter;
pub mod file;
pub mod fit;
pub mod load;
pub mod merge;

pub use adapter::*;
pub use file::{adapter_kind, load_adapter, save_adapter, AdapterFileError, AdapterMeta};
pub use fit::{check_fit, FactorDims, FitError, FitProblem, MAX_RANK};
pub use load::{merge_adapter_file, LoadError, MergeInto};
pub use merge::{merge_into_checkpoint, merge_into_params, MergeError};
