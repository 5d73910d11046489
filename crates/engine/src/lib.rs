//! The Needle Studio engine: everything between a dataset file and a `.cact`, with no GUI dependency.
//!
//! The floors, from the ground up, each built on those below it (`tests/tests/rooms.rs` checks that
//! no module imports one that contains it and that no files of different folders import each other
//! round a circle):
//!
//! 0. [`generation`] (which Needle a model is), [`quant`] (the CQ quantizer), [`simd`] (the row
//!    primitives), and [`atomic`], [`pyjson`], [`backend`]: nothing of the crate below them (nor,
//!    in the tests, below `level_log`, which the quantizers feed their levels).
//! 1. [`config`] (a model's geometry, each generation's defaults and recipe) and [`tokenizer`]
//!    (SentencePiece, each generation's chat markers): the formats that answer for a generation.
//! 2. [`checkpoint`] (pickle and safetensors checkpoints) and [`dataset`] (rows → examples → tokens,
//!    each generation's chat template).
//! 3. [`hub`] (the base models on the hub) and [`generate`] (rows an LLM writes).
//! 4. [`model`]: the parts both paths share (parameters, each part's weights in [`model::weights`],
//!    linear layers, norms, kernels, packing), the two compute paths beside each other
//!    ([`model::san`] on candle, `model::fast` hand-written for the CPU, neither importing the
//!    other), and on top [`model::Forward`] and decoding, the one place that picks a path.
//! 5. [`lora`] (adapters on the model), [`settings`] (what a user chooses for a run and a build)
//!    and [`checks`] (what a turn's answer is once checked).
//! 6. [`cact`]: a checkpoint quantized and written as a `.cact`, and read back; [`w4a8`] computes
//!    with its codes as the file stores them.
//! 7. [`calls`] (a model tried on prompts, its calls scored), [`confidence`] (the head that says how
//!    sure the model is) and [`train`] (the fine-tuning loop): one floor, whose folders still import
//!    each other (no two of their files do, see `tests/tests/rooms.rs`).
//! 8. [`profile`] (each generation's answers assembled in one place, for the app) and [`suite`]
//!    (acceptance suites over everything below).
//!
//! The data path, one module per stage:
//! file → examples ([`dataset`]) → tokens ([`tokenizer`]) → batches ([`model::packing`], shared
//! prompt prefixes laid out once) → the network ([`model`], on the device [`backend`] picked) →
//! adapter ([`lora`], trained by [`train`]) → `.cact` ([`cact`]). Model weights come from
//! [`checkpoint`] (format-v2 pickles, read without executing anything) described by [`config`]; the
//! base model itself comes from the Hugging Face hub or its cache ([`hub`]) when no checkpoint is
//! given. [`calls`] tries a model (checkpoint, adapter or built `.cact`) on prompts and scores its
//! tool calls. [`atomic`] writes every output whole or not at all; [`pyjson`] prints JSON as Python's
//! `json.dumps` does, which the chat template depends on. [`generate`] asks an LLM for more training
//! rows, each checked by the dataset doctor ([`dataset::Checkup`]) before it is kept. [`settings`] is
//! the one list of what a user chooses for a run and a build — defaults, ranges and messages — that
//! the CLI, the app and its UI all read.
//!
//! One boundary splits the crate. Training and evaluation are tensor code: [`model`], [`lora`],
//! [`train`], [`calls`], entered through [`model::Params::from_checkpoint`] (candle's tensors; on
//! the CPU, the hand-written path of [`model::CpuNetwork`] reads them in place). Export is byte
//! code: [`cact`] quantizes the checkpoint's own arrays (an adapter first merged into them, in their
//! stored dtype, by [`lora::merge`], the one merge evaluation uses too) and writes them with no tensor
//! library, so the file matches the reference's bytes; [`cact::weights`] is also the one way back,
//! dequantizing a built file into tensors so that what is scored is what ships.

pub mod atomic;
pub mod backend;
pub mod cact;
pub mod calls;
pub mod checkpoint;
pub mod checks;
pub mod confidence;
pub mod config;
pub mod dataset;
pub mod generate;
pub mod generation;
pub mod hub;
pub mod lora;
pub mod model;
pub mod profile;
pub mod pyjson;
pub mod quant;
pub mod settings;
pub mod simd;
pub mod suite;
pub mod tokenizer;
pub mod train;
pub mod w4a8;

#[cfg(test)]
mod fixtures;
#[cfg(test)]
mod level_log;
