//! The model's configuration, as the reference's `TransformerConfig` defines it.
//!
//! A checkpoint's `config` dict may leave keys out; every default lives in [`ModelConfig::default`]
//! and nowhere else. Unknown keys are ignored, as the reference ignores them.

use serde::{Deserialize, Serialize};

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
        }
    }
}

impl ModelConfig {
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

    /// Applies the reference constructor's normalisation: `attn_dim` 0 means `d_model`.
    pub fn resolved(mut self) -> Self {
        if self.attn_dim == 0 {
            self.attn_dim = self.d_model;
        }
        self
    }

    /// Per-head width of queries, keys and values.
    pub fn head_dim(&self) -> usize {
        self.resolved_attn_dim() / self.num_heads
    }

    fn resolved_attn_dim(&self) -> usize {
        if self.attn_dim == 0 {
            self.d_model
        } else {
            self.attn_dim
        }
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
}
