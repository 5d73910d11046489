//! The memory model of a training run: what the plan (`--dry-run`, the app's Check plan) predicts,
//! and what decides whether the backward pass recomputes activations layer by layer.
//!
//! A step holds the f32 base weights, the adapter four times over (value, gradient, two moments)
//! and the activations the backward pass reads. Those are counted per token and layer in units of
//! the tensors the forward keeps (lane-wide, model-wide, MLP-wide, and per-head attention rows);
//! the counts were calibrated against the peak resident memory `needle bench` and `needle finetune`
//! measured at Needle 2 (4 × 128, 4 × 512, 16 × 256), a tiny model at 16 × 1024 and a mid-size one
//! at the reference's defaults (batch 16, rows near 1024).

use serde::{Deserialize, Serialize};

use crate::config::ModelConfig;

/// The activations a step may hold. Above it a step first recomputes layer by layer (about a
/// third more time), then also splits its batch into micro-batches whose gradients are summed
/// (no more time, smaller matrix products).
pub const ACTIVATION_BUDGET: u64 = 512 << 20;

/// Kept tensors per token and layer, by width (calibrated, see the module comment).
const LANE_WIDE: f64 = 7.0;
const MODEL_WIDE: f64 = 40.0;
const MLP_WIDE: f64 = 9.0;
/// Attention rows per head and query: the scores, their softmax and, in the backward pass, the
/// gradients of both and the candle accumulation buffers beside them.
const ATTENTION_ROWS: f64 = 7.0;
/// Vocabulary-wide rows per scored position (logits and their gradient).
const VOCAB_ROWS: f64 = 2.0;
/// The process itself: code, allocator slack, the tokenizer and the dataset.
const FIXED_BYTES: f64 = 160e6;

/// The predicted peak of a run's steps.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct MemoryPlan {
    pub peak_bytes: u64,
    /// Whether steps recompute activations layer by layer (see [`ACTIVATION_BUDGET`]).
    pub recompute: bool,
    /// Rows per forward and backward pass (the whole batch unless the budget needs less).
    pub micro_batch: usize,
}

/// The shape of the work: the model, its parameter counts and the largest batch.
#[derive(Debug, Clone, Copy)]
pub struct StepShape<'a> {
    pub config: &'a ModelConfig,
    pub parameters: usize,
    pub trainable: usize,
    /// Rows in the largest batch.
    pub batch: usize,
    /// Positions in its longest row.
    pub seq_len: usize,
    /// Scored positions in the batch (the vocabulary projection runs on these only).
    pub scored: usize,
}

impl StepShape<'_> {
    /// Activation bytes one layer keeps for the backward pass.
    fn layer_bytes(&self) -> f64 {
        let cfg = self.config;
        let tokens = (self.batch * self.seq_len) as f64;
        let d = cfg.d_model as f64;
        let per_token = LANE_WIDE * (cfg.mhc_lanes * cfg.d_model) as f64
            + MODEL_WIDE * d
            + MLP_WIDE * cfg.hadamard_width() as f64
            + ATTENTION_ROWS * (cfg.num_heads * self.seq_len) as f64;
        4.0 * tokens * per_token
    }

    /// The lanes between two layers: what a recomputing step keeps of every layer.
    fn lanes_bytes(&self) -> f64 {
        4.0 * (self.batch * self.seq_len * self.config.mhc_lanes * self.config.d_model) as f64
    }

    /// The base weights and the adapter with its gradient and moments.
    fn fixed_bytes(&self) -> f64 {
        FIXED_BYTES + 4.0 * (self.parameters as f64 + 4.0 * self.trainable as f64)
    }

    /// Activation bytes of a pass over `rows` of the batch, recomputing or not: the layers' and
    /// the vocabulary rows of those rows' scored positions.
    fn activations(&self, rows: usize, recompute: bool) -> f64 {
        let part = StepShape { batch: rows, ..*self };
        let layers = self.config.num_layers as f64;
        let scored = self.scored as f64 * rows as f64 / self.batch.max(1) as f64;
        let vocab = 4.0 * VOCAB_ROWS * scored * self.config.vocab_size as f64;
        vocab
            + match recompute {
                false => layers * part.layer_bytes(),
                true => (layers + 1.0) * part.lanes_bytes() + part.layer_bytes(),
            }
    }

    /// The plan for this shape: the whole stack's activations for the whole batch if they fit
    /// [`ACTIVATION_BUDGET`], else layer-by-layer recomputation on the largest micro-batch that
    /// fits (one row at least).
    pub fn plan(&self) -> MemoryPlan {
        let budget = ACTIVATION_BUDGET as f64;
        let batch = self.batch.max(1);
        let recompute = self.activations(batch, false) > budget;
        let micro_batch = match recompute {
            false => batch,
            true => (1..=batch).rev().find(|&rows| self.activations(rows, true) <= budget).unwrap_or(1),
        };
        let peak = self.fixed_bytes() + self.activations(micro_batch, recompute);
        MemoryPlan { peak_bytes: peak as u64, recompute, micro_batch }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn big_steps_recompute_in_micro_batches_within_the_budget() {
        let cfg = ModelConfig::needle2();
        let shape = |batch, seq_len| StepShape {
            config: &cfg,
            parameters: 90_000_000,
            trainable: 2_000_000,
            batch,
            seq_len,
            scored: batch * seq_len / 2,
        };
        let small = StepShape { config: &ModelConfig { num_layers: 1, d_model: 64, ..cfg.clone() }, ..shape(1, 16) };
        assert!(!small.plan().recompute);
        let big = shape(16, 256);
        let plan = big.plan();
        assert!(plan.recompute && plan.micro_batch < 16, "{plan:?}");
        let whole = big.fixed_bytes() + big.activations(16, false);
        assert!((plan.peak_bytes as f64) < whole / 4.0, "{plan:?} vs {whole}");
        assert!(plan.peak_bytes as f64 <= big.fixed_bytes() + ACTIVATION_BUDGET as f64);
        // A single row that does not fit still runs, recomputed, one row at a time.
        let huge = shape(2, 16384).plan();
        assert_eq!((huge.recompute, huge.micro_batch), (true, 1));
    }
}
