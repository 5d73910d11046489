//! One transformer block (the reference's `Block`): optional engram injection, then
//! `x + σ(attn_gate) · norm(attn(norm(x)))` and `x + mlp(norm(x))`.

use candle_core::Tensor;

use super::attention::{Attention, LayerKv, Rope};
use super::engram::EngramKv;
use super::kernels::sigmoid;
use super::linear::LowRank;
use super::mlp::HadamardMlp;
use super::norm::ZcRmsNorm;
use super::params::ParamPath;
use super::Result;
use crate::config::ModelConfig;

#[derive(Debug, Clone)]
pub struct Block {
    /// The pre-attention norm (flax's auto-named `ZCRMSNorm_0`).
    input_norm: ZcRmsNorm,
    self_attn: Attention,
    post_attn_norm: ZcRmsNorm,
    attn_gate: Tensor,
    pre_hada_norm: ZcRmsNorm,
    hadamard_mlp: HadamardMlp,
}

impl Block {
    pub fn new(cfg: &ModelConfig, vb: ParamPath) -> Result<Self> {
        let d = cfg.d_model;
        Ok(Self {
            input_norm: ZcRmsNorm::new(d, vb.pp("ZCRMSNorm_0"))?,
            self_attn: Attention::new(cfg, vb.pp("self_attn"))?,
            post_attn_norm: ZcRmsNorm::new(d, vb.pp("post_attn_norm"))?,
            attn_gate: sigmoid(&vb.get(&[], "attn_gate")?)?,
            pre_hada_norm: ZcRmsNorm::new(d, vb.pp("pre_hada_norm"))?,
            hadamard_mlp: HadamardMlp::new(cfg, vb.pp("hadamard_mlp"))?,
        })
    }

    /// `x` `[B, T, d]`; `engrams` are the memories injected at this layer (usually none);
    /// `low_rank` adapts the attention projections; `cache` holds the keys of earlier positions
    /// when decoding.
    pub fn forward(
        &self,
        x: &Tensor,
        rope: &Rope,
        causal: &Tensor,
        engrams: &[&EngramKv],
        low_rank: Option<&LowRank>,
        cache: Option<&mut LayerKv>,
    ) -> Result<Tensor> {
        let mut x = x.clone();
        for memory in engrams {
            x = (&x + memory.injection(&x)?)?;
        }
        let attn = self.self_attn.forward(&self.input_norm.forward(&x)?, rope, causal, low_rank, cache)?;
        let x = (&x + self.post_attn_norm.forward(&attn)?.broadcast_mul(&self.attn_gate)?)?;
        let mlp = self.hadamard_mlp.forward(&self.pre_hada_norm.forward(&x)?)?;
        Ok((x + mlp)?)
    }
}
