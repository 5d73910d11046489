//! One transformer block (the reference's `Block`): optional engram injection, then
//! `x + σ(attn_gate) · norm(attn(norm(x)))` and `x + mlp(norm(x))`.

use candle_core::Tensor;

use super::attention::{AttentionLayout, LayerKv};
use super::engram::{injection, EngramKv};
use crate::model::linear::LowRank;
use crate::model::weights::block::{Block, Mlp};
use crate::model::Result;

impl Mlp {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Mlp::Hadamard(mlp) => mlp.forward(x),
            Mlp::Monarch(mlp) => mlp.forward(x),
        }
    }
}

impl Block {
    /// Packed tokens `x` `[N, d]`; `engrams` are the memories injected at this layer (usually
    /// none); `low_rank` adapts the attention projections; `cache` holds the keys of earlier
    /// positions when decoding.
    pub fn forward(
        &self,
        x: &Tensor,
        layout: &AttentionLayout,
        engrams: &[&EngramKv],
        low_rank: Option<&LowRank>,
        cache: Option<&mut LayerKv>,
    ) -> Result<Tensor> {
        let x = match injection(x, engrams)? {
            Some(added) => (x + added)?,
            None => x.clone(),
        };
        let attn = self.self_attn.forward(&self.input_norm.forward(&x)?, layout, low_rank, cache)?;
        let x = (&x + self.post_attn_norm.forward(&attn)?.broadcast_mul(&self.attn_gate)?)?;
        let mlp = self.mlp.forward(&self.pre_hada_norm.forward(&x)?)?;
        Ok((x + mlp)?)
    }
}
