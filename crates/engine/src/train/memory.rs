//! The memory model of a training run: what the plan (`--dry-run`, the app's Check plan) predicts,
//! and what decides how many packed tokens a pass holds and whether the backward pass recomputes
//! activations layer by layer.
//!
//! A step holds the f32 base weights, the adapter four times over (value, gradient, two moments)
//! and the activations the backward pass reads. The hand-written CPU path knows its buffers
//! exactly ([`CpuNetwork::bytes_per_token`]), none of them `T × T`. Candle's path (CUDA, Metal)
//! is counted per token and layer in units of the tensors its forward keeps (lane-wide,
//! model-wide, MLP-wide, and per-head attention rows); those counts were calibrated against the
//! peak resident memory `needle bench` and `needle finetune` measured at Needle 2 (4 × 128,
//! 4 × 512, 16 × 256), a tiny model at 16 × 1024 and a mid-size one at the reference's defaults
//! (batch 16, rows near 1024).

use serde::{Deserialize, Serialize};

use crate::backend::{device_memory_free, system_memory};
use crate::config::ModelConfig;
use crate::model::{CpuNetwork, Device};

/// The least activations a pass may hold where memory is the system's (the CPU, Metal): all a
/// machine of 8 GB or less gives. On the CPU path a bigger batch is split into passes whose
/// gradients are summed (no more time: the products stay large), and only a row too long for the
/// budget on its own recomputes layer by layer. Candle's path first recomputes (about a third
/// more time), then also splits its batch into micro-batches.
pub const ACTIVATION_BUDGET: u64 = 512 << 20;

/// The most a pass holds where memory is the system's: enough for a 1024-token row of the released
/// Needle 3 (about 650 MB kept on the CPU path) to run without recomputing its layers, which costs
/// a third of its step. The CPU path still packs its passes within [`ACTIVATION_BUDGET`]: more rows
/// a pass only save passes, whose products are large already.
const SYSTEM_BUDGET_MAX: u64 = 1 << 30;

/// The activations a pass may hold on `device`: half of what is free on a GPU with memory of its
/// own (the other half for the weights, the adapter and the allocator's slack; a GPU is sized for
/// this: recomputing there only costs time); where memory is the system's, [`system_budget`].
pub fn activation_budget(device: &Device) -> u64 {
    match device_memory_free(device) {
        Some(free) => (free / 2).max(ACTIVATION_BUDGET),
        None => system_budget(system_memory().map(|(total, _)| total)),
    }
}

/// A sixteenth of a machine of `total` bytes, within [`ACTIVATION_BUDGET`] and
/// [`SYSTEM_BUDGET_MAX`]: a 16 GB laptop gives a training the memory to skip recomputing 1024-token
/// rows, an 8 GB one keeps the floor.
fn system_budget(total: Option<u64>) -> u64 {
    total.map_or(ACTIVATION_BUDGET, |total| (total / 16).clamp(ACTIVATION_BUDGET, SYSTEM_BUDGET_MAX))
}

/// Rows of `seq_len` positions that one forward pass without gradients (evaluation) may hold
/// within `budget`, at most `batch`. Such a pass keeps nothing for a backward one: it holds one
/// layer's working set at a time (the training counts of lane-, model- and MLP-wide tensors, but
/// only the scores and their softmax of the attention rows) and every position's logits. Zero
/// when not even one row fits.
pub fn forward_rows(config: &ModelConfig, seq_len: usize, batch: usize, budget: u64) -> usize {
    const FORWARD_ATTENTION_ROWS: f64 = 2.0;
    let per_token = layer_floats_per_token(config, seq_len, FORWARD_ATTENTION_ROWS) + config.vocab_size as f64;
    let per_row = (4.0 * seq_len as f64 * per_token).max(1.0);
    ((budget as f64 / per_row) as usize).min(batch)
}

/// Floats one layer's working set holds per token of a row of `seq_len`, with `attention_rows`
/// per-head attention rows of the row's length (see the constants above).
fn layer_floats_per_token(cfg: &ModelConfig, seq_len: usize, attention_rows: f64) -> f64 {
    LANE_WIDE * (cfg.mhc_lanes * cfg.d_model) as f64
        + MODEL_WIDE * cfg.d_model as f64
        + MLP_WIDE * cfg.hadamard_width() as f64
        + attention_rows * (cfg.num_heads * seq_len) as f64
}

/// Scored positions the CPU path projects to the vocabulary at a time (its logits buffer).
const LOGIT_ROWS: f64 = 512.0;
/// The CPU path's fixed cost: code, allocator and thread-pool slack, the tokenizer and dataset.
const CPU_FIXED_BYTES: f64 = 120e6;

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
    /// Rows per forward and backward pass at the longest rows (the whole batch unless the budget
    /// needs less).
    pub micro_batch: usize,
    /// Packed tokens a pass may hold.
    #[serde(default)]
    pub tokens_per_pass: usize,
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
    /// The adapter's rank.
    pub rank: usize,
    /// Whether steps run the hand-written CPU path (else candle's autograd).
    pub hand_written: bool,
    /// The activations a pass may hold ([`activation_budget`]).
    pub activation_budget: u64,
}

impl StepShape<'_> {
    /// Activation bytes one layer keeps for the backward pass.
    fn layer_bytes(&self) -> f64 {
        let tokens = (self.batch * self.seq_len) as f64;
        4.0 * tokens * layer_floats_per_token(self.config, self.seq_len, ATTENTION_ROWS)
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

    /// The plan for this shape (see [`ACTIVATION_BUDGET`]).
    pub fn plan(&self) -> MemoryPlan {
        if self.hand_written {
            return self.cpu_plan();
        }
        self.candle_plan()
    }

    /// The CPU path: passes of as many packed tokens as the budget holds with every layer's
    /// activations kept, or, when one row does not fit, with only the lanes between layers kept.
    fn cpu_plan(&self) -> MemoryPlan {
        let (cfg, budget) = (self.config, self.activation_budget as f64);
        let seq_len = self.seq_len.max(1);
        let kept = CpuNetwork::bytes_per_token(cfg, self.rank, true, false) as f64;
        let recompute = seq_len as f64 * kept > budget;
        let per_token = if recompute { CpuNetwork::bytes_per_token(cfg, self.rank, true, true) as f64 } else { kept };
        // Passes are packed within the floor: more rows in a pass save no time (its products are large
        // already); a budget above it only spares a long row its recomputation.
        let pass_budget = budget.min(ACTIVATION_BUDGET as f64);
        let tokens_per_pass = ((pass_budget / per_token) as usize).max(seq_len);
        let pass_tokens = tokens_per_pass.min(self.batch.max(1) * seq_len);
        let logits = 4.0 * LOGIT_ROWS.min(self.scored.max(1) as f64) * cfg.vocab_size as f64;
        let peak = CPU_FIXED_BYTES
            + 4.0 * (self.parameters as f64 + 4.0 * self.trainable as f64)
            + pass_tokens as f64 * per_token
            + logits;
        MemoryPlan {
            peak_bytes: peak as u64,
            recompute,
            micro_batch: (tokens_per_pass / seq_len).clamp(1, self.batch.max(1)),
            tokens_per_pass,
        }
    }

    /// Candle's path: the whole stack's activations for the whole batch if they fit the budget,
    /// else layer-by-layer recomputation on the largest micro-batch that fits (one row at least).
    fn candle_plan(&self) -> MemoryPlan {
        let budget = self.activation_budget as f64;
        let batch = self.batch.max(1);
        let recompute = self.activations(batch, false) > budget;
        let micro_batch = match recompute {
            false => batch,
            true => (1..=batch).rev().find(|&rows| self.activations(rows, true) <= budget).unwrap_or(1),
        };
        let peak = self.fixed_bytes() + self.activations(micro_batch, recompute);
        MemoryPlan {
            peak_bytes: peak as u64,
            recompute,
            micro_batch,
            tokens_per_pass: micro_batch * self.seq_len.max(1),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A step of a 90M-parameter model with a rank-16 adapter, half of every row scored.
    fn step(config: &ModelConfig, batch: usize, seq_len: usize, hand_written: bool) -> StepShape<'_> {
        StepShape {
            config,
            parameters: 90_000_000,
            trainable: 2_000_000,
            batch,
            seq_len,
            scored: batch * seq_len / 2,
            rank: 16,
            hand_written,
            activation_budget: ACTIVATION_BUDGET,
        }
    }

    #[test]
    fn evaluation_passes_hold_as_many_rows_as_the_budget_does() {
        let cfg = ModelConfig::needle2();
        let tiny = ModelConfig { num_layers: 2, d_model: 64, vocab_size: 512, ..cfg.clone() };
        assert_eq!(forward_rows(&tiny, 128, 16, ACTIVATION_BUDGET), 16, "a small model: the whole batch");
        let (short, long) =
            (forward_rows(&cfg, 128, 64, ACTIVATION_BUDGET), forward_rows(&cfg, 1024, 64, ACTIVATION_BUDGET));
        assert!(short > long && long >= 1, "rows of 128: {short} a pass, of 1024: {long}");
        assert_eq!(forward_rows(&cfg, 1 << 20, 16, ACTIVATION_BUDGET), 0, "a million-token row fits no pass");
    }

    #[test]
    fn big_steps_recompute_in_micro_batches_within_the_budget() {
        let cfg = ModelConfig::needle2();
        let shape = |batch, seq_len| step(&cfg, batch, seq_len, false);
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
        // A GPU's own memory holds the same step whole.
        let gpu = StepShape { activation_budget: 60 << 30, ..big }.plan();
        assert_eq!((gpu.recompute, gpu.micro_batch), (false, 16), "{gpu:?}");
    }

    #[test]
    fn a_machine_with_memory_to_spare_trains_needle3_rows_of_1024_without_recomputing() {
        const GIB: u64 = 1 << 30;
        assert_eq!(system_budget(None), ACTIVATION_BUDGET, "unknown memory: the floor");
        assert_eq!(system_budget(Some(8 * GIB)), ACTIVATION_BUDGET);
        assert_eq!(system_budget(Some(16 * GIB)), GIB);
        assert_eq!(system_budget(Some(256 * GIB)), SYSTEM_BUDGET_MAX);
        let needle3 = ModelConfig::needle3();
        let rows = |budget| StepShape { activation_budget: budget, ..step(&needle3, 4, 1024, true) }.plan();
        let (small, big) = (rows(system_budget(Some(8 * GIB))), rows(system_budget(Some(16 * GIB))));
        assert!(small.recompute && small.micro_batch == 1, "{small:?}");
        assert!(!big.recompute && big.micro_batch == 1, "{big:?}");
        // Rows that fit the floor are packed within it whatever the machine: a bigger budget buys no speed there.
        let short = |budget| StepShape { activation_budget: budget, ..step(&needle3, 16, 128, true) }.plan();
        assert_eq!(short(ACTIVATION_BUDGET), short(SYSTEM_BUDGET_MAX));
        assert!(big.peak_bytes < small.peak_bytes + SYSTEM_BUDGET_MAX, "{big:?} vs {small:?}");
    }

    #[test]
    fn the_cpu_path_splits_big_batches_into_passes_and_recomputes_only_rows_too_long_for_the_budget() {
        let needle2 = ModelConfig::needle2();
        let small_model = ModelConfig { d_model: 256, num_heads: 4, num_kv_heads: 2, num_layers: 6, ..needle2.clone() };
        let shape = |config, batch, seq_len| step(config, batch, seq_len, true);
        // The benchmark's step keeps everything in one pass.
        let bench = shape(&needle2, 4, 128).plan();
        assert!(!bench.recompute && bench.micro_batch == 4 && bench.tokens_per_pass >= 512, "{bench:?}");
        // The reference's defaults on a small model: passes of several rows, nothing recomputed.
        let defaults = shape(&small_model, 16, 1024).plan();
        assert!(!defaults.recompute && (2..16).contains(&defaults.micro_batch), "{defaults:?}");
        // On Needle 2 a row of 1024 keeps too much: the lanes between layers only, a row per pass.
        let big = shape(&needle2, 16, 1024).plan();
        assert!(big.recompute && big.micro_batch == 1, "{big:?}");
        assert!(big.peak_bytes < bench.peak_bytes + ACTIVATION_BUDGET, "{big:?}");
        // A row longer than the budget holds still runs, alone.
        let huge = shape(&needle2, 2, 16384).plan();
        assert_eq!((huge.recompute, huge.micro_batch, huge.tokens_per_pass), (true, 1, 16384));
    }
}
