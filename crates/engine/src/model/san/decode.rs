//! The candle path's decoding state: every layer's cached keys and values and the rotary tables
//! grown as it goes (the CPU path's is `fast/decode.rs`), and the greedy pick of a next token.

use candle_core::Device;

use super::attention::{LayerKv, Rope};
use crate::config::ModelConfig;
use crate::model::kernels::RopeTables;
use crate::model::Result;

/// What a decoding run on candle's path carries from step to step.
#[derive(Debug, Clone)]
pub struct DecodeState {
    /// Every token so far, prompt included.
    pub(in crate::model) history: Vec<u32>,
    /// Each layer's keys and values.
    pub(in crate::model) layers: Vec<LayerKv>,
    /// Rotary tables of the positions decoded so far, and room for more ([`DecodeState::rope_through`]).
    pub(in crate::model) rope: Rope,
    /// How many positions `rope` holds.
    pub(in crate::model) rope_positions: usize,
}

impl DecodeState {
    /// Rotary tables that reach position `needed − 1`, grown as decoding goes
    /// ([`RopeTables::decode_capacity`]).
    pub(in crate::model) fn rope_through(
        &mut self,
        needed: usize,
        cfg: &ModelConfig,
        device: &Device,
    ) -> Result<&Rope> {
        let positions = RopeTables::decode_capacity(self.rope_positions, needed, cfg.max_seq_len);
        if positions > self.rope_positions {
            self.rope = Rope::new(cfg.qk_head_dim(), positions, cfg.rope_theta, device)?;
            self.rope_positions = positions;
        }
        Ok(&self.rope)
    }
}

/// The most likely token of logits `[vocab]` (the first of equals, as `argmax` picks) and its
/// probability, `1 / Σ exp(logit − max)`.
pub(in crate::model) fn pick(logits: &[f32]) -> (u32, f32) {
    let (best, max) = logits.iter().enumerate().fold((0, f32::NEG_INFINITY), |best, (i, &v)| match v > best.1 {
        true => (i, v),
        false => best,
    });
    let total: f64 = logits.iter().map(|&v| f64::from(v - max).exp()).sum();
    (best as u32, (1.0 / total) as f32)
}
