//! The Needle Studio engine: everything between a dataset file and a `.cact`, with no GUI dependency.
//!
//! The data path, one module per stage:
//! file → examples ([`dataset`]) → tokens ([`tokenizer`]) → batches ([`model::packing`], shared
//! prompt prefixes laid out once) → the network ([`model`], on the device [`backend`] picked) →
//! adapter ([`lora`], trained by [`train`]) → `.cact` ([`cact`]). Model weights come from [`checkpoint`] (format-v2 pickles, read without
//! executing anything) described by [`config`]; what differs between the model's generations (file kinds, chat
//! format, `.cact` layout, recipe, the default) is one [`generation::Profile`] per generation; the base model itself comes from the Hugging Face hub
//! or its cache ([`hub`]) when no checkpoint is given. [`calls`] tries a model (checkpoint, adapter or
//! built `.cact`) on prompts and scores its tool calls. [`atomic`] writes every output whole or not at
//! all; [`pyjson`] prints JSON as Python's `json.dumps` does, which the chat template depends on.
//! [`generate`] asks an LLM for more training rows, each checked by the dataset doctor
//! ([`dataset::Checkup`]) before it is kept. [`settings`] is the one list of what a user chooses for a run and a build — defaults, ranges and
//! messages — that the CLI, the app and its UI all read.
//!
//! One boundary splits the crate. Training and evaluation are tensor code: [`model`], [`lora`],
//! [`train`], [`calls`], entered through [`model::Params::from_checkpoint`] (candle's tensors; on
//! the CPU, the hand-written path of [`model::CpuNetwork`] reads them in place). Export is byte
//! code: [`cact`] quantizes the checkpoint's own arrays (an adapter first merged into them, in their
//! stored dtype, by [`lora::merge`], the one merge evaluation uses too) and writes them with no tensor
//! library, so the file matches the reference's bytes; [`cact::needle2`] is also the one way back,
//! dequantizing a built file into tensors so that what is scored is what ships.

pub mod atomic;
pub mod backend;
pub mod cact;
pub mod calls;
pub mod checkpoint;
pub mod config;
pub mod dataset;
pub mod generate;
pub mod generation;
pub mod hub;
pub mod lora;
pub mod model;
pub mod pyjson;
pub mod settings;
pub mod tokenizer;
pub mod train;
pub mod w4a8;

/// The committed fixtures (`tests/fixtures`) the unit tests read.
#[cfg(test)]
mod fixtures {
    use std::path::{Path, PathBuf};

    pub fn fixture(relative: &str) -> PathBuf {
        Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures")).join(relative)
    }

    /// The checkpoint `models/<stem>`: a Needle 3 safetensors file where there is one, else a pickle.
    pub fn checkpoint_path(stem: &str) -> PathBuf {
        let needle3 = fixture(&format!("models/{stem}.safetensors"));
        if needle3.exists() {
            needle3
        } else {
            fixture(&format!("models/{stem}.pkl"))
        }
    }
}
