//! The model's configuration, as the reference's `TransformerConfig` defines it: Needle 2's fields,
//! and Needle 3's beside them with the values that turn each of its features off (as 3.x's
//! `TransformerConfig.from_saved` reads a config that lacks them), so one config describes both
//! generations and [`ModelConfig::generation`] says which the file was.
//!
//! A checkpoint's `config` dict may leave keys out; every default lives in [`ModelConfig::default`]
//! and nowhere else. Unknown keys are ignored, as the reference ignores them.
//!
//! A config comes from a file, so [`ModelConfig::validate`] bounds every count the engine sizes
//! something from before anything is sized from it, and the sizes derived from several fields
//! ([`ModelConfig::head_dim`], [`ModelConfig::engram_dims`]) are computed with checked arithmetic.
//!
//! Every architecture rule that turns config fields into a width lives here, once: the network
//! ([`crate::model`]) and the `.cact` header ([`crate::cact::geometry`]) both ask these methods.

use std::ops::RangeInclusive;

use serde::{Deserialize, Serialize};

use crate::generation::Generation;

/// Target width of one engram table entry when `engram_heads` is 0 (the reference's `ENGRAM_SUB_DIM`).
const ENGRAM_SUB_DIM: usize = 128;

/// Taps of every engram site's causal convolution over its values (fixed by the architecture; the
/// `.cact` header records it for the runtime).
pub const ENGRAM_CONV_TAPS: usize = 4;

// The largest value each count may take: generous bounds on what a real model could have (Needle 2 has
// a vocabulary of 8192, d_model 768, 12 heads, 27 layers, 4 lanes, 8192 engram slots), low enough that
// every product of a few of them fits in 64 bits and no config alone can ask for an absurd allocation.
const MAX_VOCAB: usize = 1 << 24;
const MAX_WIDTH: usize = 1 << 16;
const MAX_HEADS: usize = 1 << 10;
const MAX_LAYERS: usize = 1 << 10;
const MAX_POSITIONS: usize = 1 << 24;
const MAX_LANES: usize = 64;
const MAX_ORDERS: usize = 16;
const MAX_ORDER: usize = 64;
const MAX_SLOTS: usize = 1 << 24;
const MAX_CONV_TAPS: usize = 64;
const MAX_PROBES: usize = 1 << 10;

/// The activation widths quantization-aware training can use (3.x's `fake_quant` at `act_bits`):
/// one bit leaves no level but zero (every value NaN), and past 32 the largest level overflows the
/// int32 3.x computes it in (so does our shift past 64).
pub const ACT_BITS: RangeInclusive<u32> = 2..=32;

/// The key/value cache widths 3.x knows: 0 leaves keys and values unquantized in training, 1 to 7
/// are codebook widths, 8 is int8 (3.x treats any wider value as 8; the `.cact` header records it).
pub const KV_BITS: RangeInclusive<u32> = 0..=8;

/// The weight dtypes a config may name (3.x's `DTYPE_MAP`).
const DTYPES: [&str; 3] = ["float32", "bfloat16", "float16"];

/// A config value a Needle model cannot have: the field and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{field}` {problem}")]
pub struct ConfigError {
    pub field: &'static str,
    /// What the value is and what was expected, e.g. "is 0; it must be in 1..=64".
    pub problem: String,
}

/// Geometry and numerics of a Needle 2 network (the reference's `TransformerConfig`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ModelConfig {
    pub vocab_size: usize,
    pub d_model: usize,
    /// Width of the attention projections; 0 in a checkpoint means `d_model` (resolved by [`ModelConfig::resolved`]).
    pub attn_dim: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub num_layers: usize,
    pub max_seq_len: usize,
    pub pad_token_id: u32,
    pub contrastive_dim: usize,
    pub rope_theta: f64,
    pub dtype: String,
    pub flash: bool,
    pub engram_orders: Vec<usize>,
    pub engram_heads: usize,
    pub engram_slots: usize,
    pub engram_layers: Vec<usize>,
    pub mhc_lanes: usize,
    pub kv_window: usize,
    pub kv_bits: u32,
    pub act_bits: u32,
    /// Per-tensor bit widths for `.cact` export (`parse_bits_map` syntax); empty means none.
    pub weight_bits: String,
    pub remat: bool,
    pub scan_unroll: usize,
    /// Needle 3: the q/k and v head widths (0: `attn_dim / num_heads`, as in Needle 2).
    pub qk_head_dim: usize,
    pub v_head_dim: usize,
    /// Needle 3: how many positions back a windowed layer attends (0: every layer sees the whole
    /// row), and the layers that see the whole row all the same.
    pub sliding_window: usize,
    pub global_layers: Vec<usize>,
    /// Needle 3: taps of the causal depthwise convolution on Q, K and V (0: none).
    pub qkv_conv_taps: usize,
    /// Needle 3: the embedding rows the output head scores (0: all of them).
    pub out_vocab: usize,
    /// Needle 3: the stride of the engram hash seeds (0: `engram_heads`; a width-sliced model keeps
    /// its parent's).
    pub engram_seed_heads: usize,
    /// Needle 3's width ladder: when it lists widths, the Monarch MLP permutes each half apart.
    pub ladder_widths: Vec<usize>,
    /// Needle 3's depth ladder: the order blocks join the nested rungs in (empty: the bisection
    /// order of the depth; a sliced rung carries its parent's, so slicing it again stays nested).
    pub ladder_order: Vec<usize>,
    /// Needle 3: the confidence head's probes per depth row and its queries over the pooled
    /// probes (3.x's `confidence_probes`/`confidence_queries`): the shape a head is initialised
    /// with when a base has none (a loaded head keeps its own). Needle 2's head has 8 probes,
    /// fixed.
    pub confidence_probes: usize,
    pub confidence_queries: usize,
    /// The generation the config was read for; not a field of the reference's config.
    #[serde(skip)]
    pub generation: Generation,
}

impl Default for ModelConfig {
    fn default() -> Self {
        Self {
            vocab_size: 8192,
            d_model: 512,
            attn_dim: 0,
            num_heads: 8,
            num_kv_heads: 4,
            num_layers: 12,
            max_seq_len: 2048,
            pad_token_id: 0,
            contrastive_dim: 128,
            rope_theta: 100000.0,
            dtype: "bfloat16".into(),
            flash: true,
            engram_orders: vec![2, 3],
            engram_heads: 0,
            engram_slots: 8192,
            engram_layers: vec![2, 15],
            mhc_lanes: 4,
            kv_window: 0,
            kv_bits: 8,
            act_bits: 8,
            weight_bits: String::new(),
            remat: true,
            scan_unroll: 1,
            qk_head_dim: 0,
            v_head_dim: 0,
            sliding_window: 0,
            global_layers: Vec::new(),
            qkv_conv_taps: 0,
            out_vocab: 0,
            engram_seed_heads: 0,
            ladder_widths: Vec::new(),
            ladder_order: Vec::new(),
            confidence_probes: 4,
            confidence_queries: 4,
            generation: Generation::Needle2,
        }
    }
}

/// How a generation's package trains and scores.
#[derive(Debug, Clone, Copy)]
pub struct Recipe {
    /// Training sees the weights and activations as the `.cact` quantizes them.
    pub quantization_aware: bool,
    /// The end-of-run scores answer with the weights a `.cact` ships (W4), not the float ones.
    pub scores_shipped_weights: bool,
}

impl Recipe {
    /// How `generation`'s package trains: Needle 3's always quantization-aware, scored as shipped.
    pub const fn of(generation: Generation) -> Self {
        match generation {
            Generation::Needle2 => Recipe { quantization_aware: false, scores_shipped_weights: false },
            Generation::Needle3 => Recipe { quantization_aware: true, scores_shipped_weights: true },
        }
    }
}

impl ModelConfig {
    /// The config a saved model of `generation` takes for the keys it leaves out.
    pub fn defaults_for(generation: Generation) -> Self {
        match generation {
            Generation::Needle2 => Self::default(),
            Generation::Needle3 => Self::needle3_defaults(),
        }
    }

    /// The released Needle 2 geometry (the reference's `PRESETS["needle"]`): what benchmarks measure.
    pub fn needle2() -> Self {
        Self {
            d_model: 768,
            num_heads: 12,
            num_kv_heads: 6,
            num_layers: 27,
            engram_layers: vec![2, 15],
            ..Self::default()
        }
    }

    /// The released Needle 3 geometry (3.x's `TransformerConfig` defaults): what `needle bench
    /// --preset needle3` measures.
    pub fn needle3() -> Self {
        Self {
            qk_head_dim: 48,
            v_head_dim: 64,
            sliding_window: 1024,
            global_layers: vec![4, 9, 14, 19],
            qkv_conv_taps: 3,
            ..Self::needle3_defaults()
        }
    }

    /// Needle 3's defaults for the fields a saved config leaves out (3.x's `TransformerConfig` and
    /// `from_saved`: its own geometry, and each Needle 3 feature off unless the config names it).
    pub fn needle3_defaults() -> Self {
        Self {
            vocab_size: 16384,
            d_model: 768,
            num_heads: 12,
            num_kv_heads: 2,
            num_layers: 20,
            max_seq_len: 4096,
            engram_slots: 18432,
            engram_layers: vec![3, 7, 11, 15, 19],
            generation: Generation::Needle3,
            ..Self::default()
        }
    }

    /// Applies the reference constructor's normalisation: `attn_dim` 0 means `d_model`.
    pub fn resolved(mut self) -> Self {
        self.attn_dim = self.resolved_attn_dim();
        self
    }

    /// Per-head width of queries and keys: `qk_head_dim`, else [`Self::head_dim`].
    pub fn qk_head_dim(&self) -> usize {
        if self.qk_head_dim == 0 {
            self.head_dim()
        } else {
            self.qk_head_dim
        }
    }

    /// Per-head width of values (and of the attention's output): `v_head_dim`, else [`Self::head_dim`].
    pub fn v_head_dim(&self) -> usize {
        if self.v_head_dim == 0 {
            self.head_dim()
        } else {
            self.v_head_dim
        }
    }

    /// The window layer `layer` attends through: `None` for a global layer or a model without one.
    pub fn attention_window(&self, layer: usize) -> Option<usize> {
        self.window().filter(|_| !self.global_layers.contains(&layer))
    }

    /// The window of the windowed layers, if the model has any.
    pub fn window(&self) -> Option<usize> {
        (self.sliding_window > 0).then_some(self.sliding_window)
    }

    /// Per-head width of queries, keys and values; 0 when `num_heads` is 0, which [`Self::validate`]
    /// refuses (a width of 0 fails every consumer's own check instead of dividing by zero).
    pub fn head_dim(&self) -> usize {
        self.resolved_attn_dim().checked_div(self.num_heads).unwrap_or(0)
    }

    /// Width of the key and value projections: `num_kv_heads` heads of [`Self::head_dim`]
    /// (saturating on counts [`Self::validate`] refuses).
    pub fn kv_dim(&self) -> usize {
        self.num_kv_heads.saturating_mul(self.head_dim())
    }

    /// Width of the Hadamard MLP: `d_model` padded to the next power of two (the Walsh transform's
    /// size); 0 for a `d_model` past any power of two, which [`Self::validate`] refuses.
    pub fn hadamard_width(&self) -> usize {
        self.d_model.checked_next_power_of_two().unwrap_or(0)
    }

    /// Checks every count against the range a real model could have, so that nothing sized from the
    /// config can overflow or ask for an absurd allocation. Relations between fields (heads dividing
    /// the width, engram sites within the layers) are checked by the model and the export, which
    /// know which of them they need.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let counts: [(&'static str, usize, RangeInclusive<usize>); 21] = [
            ("vocab_size", self.vocab_size, 1..=MAX_VOCAB),
            ("d_model", self.d_model, 1..=MAX_WIDTH),
            ("attn_dim", self.attn_dim, 0..=MAX_WIDTH),
            ("num_heads", self.num_heads, 1..=MAX_HEADS),
            ("num_kv_heads", self.num_kv_heads, 1..=MAX_HEADS),
            ("num_layers", self.num_layers, 1..=MAX_LAYERS),
            ("max_seq_len", self.max_seq_len, 1..=MAX_POSITIONS),
            ("contrastive_dim", self.contrastive_dim, 1..=MAX_WIDTH),
            ("engram_heads", self.engram_heads, 0..=MAX_HEADS),
            ("engram_slots", self.engram_slots, 1..=MAX_SLOTS),
            ("mhc_lanes", self.mhc_lanes, 1..=MAX_LANES),
            ("kv_window", self.kv_window, 0..=MAX_POSITIONS),
            ("qk_head_dim", self.qk_head_dim, 0..=MAX_WIDTH),
            ("v_head_dim", self.v_head_dim, 0..=MAX_WIDTH),
            ("sliding_window", self.sliding_window, 0..=MAX_POSITIONS),
            ("qkv_conv_taps", self.qkv_conv_taps, 0..=MAX_CONV_TAPS),
            ("out_vocab", self.out_vocab, 0..=self.vocab_size),
            ("engram_seed_heads", self.engram_seed_heads, 0..=MAX_HEADS),
            ("scan_unroll", self.scan_unroll, 1..=MAX_LAYERS),
            ("confidence_probes", self.confidence_probes, 1..=MAX_PROBES),
            ("confidence_queries", self.confidence_queries, 1..=MAX_PROBES),
        ];
        for (field, value, range) in counts {
            if !range.contains(&value) {
                let problem = format!("is {value}; it must be in {}..={}", range.start(), range.end());
                return Err(ConfigError { field, problem });
            }
        }
        let lists: [(&'static str, &[usize], usize, RangeInclusive<usize>); 5] = [
            ("engram_orders", &self.engram_orders, MAX_ORDERS, 1..=MAX_ORDER),
            ("engram_layers", &self.engram_layers, MAX_LAYERS, 0..=MAX_LAYERS - 1),
            ("global_layers", &self.global_layers, MAX_LAYERS, 0..=MAX_LAYERS - 1),
            ("ladder_widths", &self.ladder_widths, MAX_LAYERS, 1..=MAX_WIDTH),
            ("ladder_order", &self.ladder_order, MAX_LAYERS, 0..=MAX_LAYERS - 1),
        ];
        for (field, list, most, range) in lists {
            if list.len() > most {
                let problem = format!("lists {} entries; it may list at most {most}", list.len());
                return Err(ConfigError { field, problem });
            }
            if let Some((index, value)) = list.iter().enumerate().find(|(_, v)| !range.contains(v)) {
                let problem =
                    format!("has {value} at index {index}; each entry must be in {}..={}", range.start(), range.end());
                return Err(ConfigError { field, problem });
            }
        }
        self.validate_numerics()
    }

    /// The fields that are not counts: the quantization widths, the rotary base, the dtype and the
    /// padding id.
    fn validate_numerics(&self) -> Result<(), ConfigError> {
        let bits: [(&'static str, u32, RangeInclusive<u32>, &str); 2] = [
            ("act_bits", self.act_bits, ACT_BITS, "the activation width quantization-aware training rounds to"),
            ("kv_bits", self.kv_bits, KV_BITS, "0: unquantized, 1 to 7: codebook widths, 8: int8"),
        ];
        for (field, value, range, meaning) in bits {
            if !range.contains(&value) {
                let problem = format!("is {value}; it must be in {}..={} ({meaning})", range.start(), range.end());
                return Err(ConfigError { field, problem });
            }
        }
        // The `.cact` header keeps it as a float32.
        if !(self.rope_theta > 0.0 && self.rope_theta <= f64::from(f32::MAX)) {
            let problem = format!("is {}; the rotary base must be a positive float32", self.rope_theta);
            return Err(ConfigError { field: "rope_theta", problem });
        }
        if !DTYPES.contains(&self.dtype.as_str()) {
            let problem = format!("is {:?}; it must be one of {DTYPES:?}", self.dtype);
            return Err(ConfigError { field: "dtype", problem });
        }
        if self.pad_token_id as usize >= self.vocab_size {
            let problem =
                format!("is {}; it must be a token of the vocabulary (0..{})", self.pad_token_id, self.vocab_size);
            return Err(ConfigError { field: "pad_token_id", problem });
        }
        Ok(())
    }

    /// The engram tables' layout, as the reference's `engram_geometry` derives it: `engram_heads` hash
    /// heads per n-gram order (0 means as many 128-wide heads as fit `d_model`), the width left to one
    /// table entry, and the value convolution's dilation (the longest order). Errors instead of
    /// dividing by zero or wrapping.
    pub fn engram_dims(&self) -> Result<EngramDims, ConfigError> {
        let orders = self.engram_orders.len();
        let Some(&dilation) = self.engram_orders.iter().max() else {
            return Err(ConfigError {
                field: "engram_orders",
                problem: "is empty; engram memory needs at least one n-gram order".into(),
            });
        };
        let heads = match self.engram_heads {
            0 => orders.checked_mul(ENGRAM_SUB_DIM).and_then(|w| self.d_model.checked_div(w)).unwrap_or(0).max(1),
            heads => heads,
        };
        let tables = orders.checked_mul(heads);
        let sub_dim = tables.and_then(|t| self.d_model.checked_div(t)).filter(|&w| w > 0);
        match (tables, sub_dim) {
            (Some(tables), Some(sub_dim)) => Ok(EngramDims { heads, tables, sub_dim, dilation }),
            _ => Err(ConfigError {
                field: "engram_heads",
                problem: format!(
                    "is {}: {heads} heads × {orders} orders leave no width of d_model {} to a table entry",
                    self.engram_heads, self.d_model
                ),
            }),
        }
    }

    /// The width of the attention projections: `attn_dim`, where 0 means `d_model`.
    pub fn resolved_attn_dim(&self) -> usize {
        if self.attn_dim == 0 {
            self.d_model
        } else {
            self.attn_dim
        }
    }
}

/// How the engram tables are cut (see [`ModelConfig::engram_dims`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngramDims {
    /// Hash heads per n-gram order.
    pub heads: usize,
    /// Tables per engram site: one per (order, head).
    pub tables: usize,
    /// Width of one table entry.
    pub sub_dim: usize,
    /// Spacing of the value convolution's taps: the longest n-gram order.
    pub dilation: usize,
}

impl EngramDims {
    /// Width of a position's concatenated table entries, which the key and value projections read:
    /// `tables × sub_dim`, at most `d_model` (so it cannot overflow).
    pub fn width(&self) -> usize {
        self.tables * self.sub_dim
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_keys_take_reference_defaults_and_attn_dim_zero_means_d_model() {
        let cfg: ModelConfig = serde_json::from_str(r#"{"d_model": 96, "unknown_key": 1}"#).unwrap();
        let cfg = cfg.resolved();
        assert_eq!(cfg.d_model, 96);
        assert_eq!(cfg.attn_dim, 96);
        assert_eq!(cfg.num_heads, 8);
        assert_eq!(cfg.engram_layers, vec![2, 15]);
        assert_eq!(cfg.rope_theta, 100000.0);
    }

    #[test]
    fn the_released_geometry_and_the_defaults_are_valid() {
        ModelConfig::needle2().validate().unwrap();
        ModelConfig::default().validate().unwrap();
        ModelConfig::needle3().validate().unwrap();
    }

    #[test]
    fn a_huge_lane_count_is_refused_by_name() {
        let cfg = ModelConfig { mhc_lanes: 1 << 40, ..ModelConfig::default() };
        let err = cfg.validate().unwrap_err();
        assert_eq!(err.to_string(), "`mhc_lanes` is 1099511627776; it must be in 1..=64");
    }

    #[test]
    fn zero_counts_and_bad_list_entries_are_refused() {
        for (cfg, field) in [
            (ModelConfig { num_heads: 0, ..ModelConfig::default() }, "num_heads"),
            (ModelConfig { num_layers: 0, ..ModelConfig::default() }, "num_layers"),
            (ModelConfig { vocab_size: usize::MAX, ..ModelConfig::default() }, "vocab_size"),
            (ModelConfig { engram_orders: vec![2, 0], ..ModelConfig::default() }, "engram_orders"),
            (ModelConfig { engram_layers: vec![1 << 20], ..ModelConfig::default() }, "engram_layers"),
        ] {
            assert_eq!(cfg.validate().unwrap_err().field, field);
        }
        assert_eq!(ModelConfig { num_heads: 0, ..ModelConfig::default() }.head_dim(), 0);
    }

    #[test]
    fn every_field_3_2_8_reads_is_bounded() {
        let base = ModelConfig::needle3();
        for (cfg, field) in [
            (ModelConfig { act_bits: 65, ..base.clone() }, "act_bits"),
            (ModelConfig { act_bits: 1, ..base.clone() }, "act_bits"),
            (ModelConfig { kv_bits: 9, ..base.clone() }, "kv_bits"),
            (ModelConfig { rope_theta: f64::NAN, ..base.clone() }, "rope_theta"),
            (ModelConfig { rope_theta: 0.0, ..base.clone() }, "rope_theta"),
            (ModelConfig { rope_theta: 1e300, ..base.clone() }, "rope_theta"),
            (ModelConfig { dtype: "int8".into(), ..base.clone() }, "dtype"),
            (ModelConfig { pad_token_id: 16384, ..base.clone() }, "pad_token_id"),
            (ModelConfig { scan_unroll: 0, ..base.clone() }, "scan_unroll"),
            (ModelConfig { ladder_order: vec![0; MAX_LAYERS + 1], ..base.clone() }, "ladder_order"),
            (ModelConfig { max_seq_len: MAX_POSITIONS + 1, ..base.clone() }, "max_seq_len"),
        ] {
            assert_eq!(cfg.validate().unwrap_err().field, field);
        }
        let err = ModelConfig { act_bits: 65, ..base.clone() }.validate().unwrap_err();
        assert_eq!(
            err.to_string(),
            "`act_bits` is 65; it must be in 2..=32 (the activation width quantization-aware training rounds to)"
        );
        for (act_bits, kv_bits) in [(2, 0), (32, 8), (8, 3)] {
            ModelConfig { act_bits, kv_bits, ..base.clone() }.validate().unwrap();
        }
    }

    #[test]
    fn engram_heads_that_would_wrap_are_an_error_not_a_division_by_zero() {
        // 4 orders × 2^62 heads is 2^64, which wraps to 0 in unchecked arithmetic.
        let cfg = ModelConfig { engram_orders: vec![2, 3, 4, 5], engram_heads: 1 << 62, ..ModelConfig::default() };
        let err = cfg.engram_dims().unwrap_err();
        assert_eq!(err.field, "engram_heads");
        assert!(err.problem.contains("4611686018427387904 heads × 4 orders"), "{err}");
        assert_eq!(cfg.validate().unwrap_err().field, "engram_heads");
        let too_many = ModelConfig { engram_heads: 300, ..ModelConfig::default() };
        assert!(too_many.engram_dims().unwrap_err().problem.contains("leave no width of d_model 512"));
    }

    #[test]
    fn automatic_engram_heads_follow_the_reference() {
        let dims = ModelConfig::needle2().engram_dims().unwrap();
        assert_eq!(dims, EngramDims { heads: 3, tables: 6, sub_dim: 128, dilation: 3 });
        assert_eq!(dims.width(), 768);
        let narrow = ModelConfig { d_model: 64, ..ModelConfig::default() }.engram_dims().unwrap();
        assert_eq!(narrow, EngramDims { heads: 1, tables: 2, sub_dim: 32, dilation: 3 });
    }
}
