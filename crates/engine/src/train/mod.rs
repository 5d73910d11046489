//! LoRA fine-tuning: the reference's `finetune_local` recipe, its schedule and optimizer.

pub mod adamw;
pub mod bench;
pub mod confidence;
#[cfg(test)]
mod cpu_parity_tests;
mod error;
pub mod events;
pub mod finetune;
pub mod gradients;
pub mod memory;
#[cfg(test)]
mod parity_tests;
pub mod schedule;
pub mod state;
pub mod timing;
pub mod trainer;

pub use adamw::{AdamW, AdamWConfig};
pub use confidence::{HeadFit, HeadSummary};
pub use error::{GoldenError, TrainError};
pub use events::Event;
pub use finetune::{FinetuneOptions, Outcome, Plan, Session};
pub use schedule::Schedule;
pub use trainer::{StepOutcome, Trainer};
