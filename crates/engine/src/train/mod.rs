//! LoRA fine-tuning: the reference's `finetune_local` recipe, its schedule and optimizer.

pub mod adamw;
#[cfg(test)]
mod parity_tests;
pub mod schedule;
pub mod trainer;

pub use adamw::{AdamW, AdamWConfig};
pub use schedule::Schedule;
pub use trainer::{StepOutcome, Trainer};
