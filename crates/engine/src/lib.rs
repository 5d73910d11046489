//! The Needle Studio engine: everything between a dataset file and a `.cact`, with no GUI dependency.
//!
//! The data path, one module per stage:
//! file → examples ([`dataset`]) → tokens ([`tokenizer`]); model weights come from [`checkpoint`]
//! (format-v2 pickles, read without executing anything) described by [`config`]; the base model itself
//! comes from the Hugging Face hub or its cache ([`hub`]) when no checkpoint is given. [`calls`] tries
//! a model (checkpoint, adapter or built `.cact`) on prompts and scores its tool calls.

pub mod atomic;
pub mod backend;
pub mod cact;
pub mod calls;
pub mod checkpoint;
pub mod config;
pub mod dataset;
pub mod hub;
pub mod lora;
pub mod model;
pub mod pyjson;
pub mod tokenizer;
pub mod train;
