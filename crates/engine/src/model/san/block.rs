//! One transformer block (the reference's `Block`): optional engram injection, then
//! `x + σ(attn_gate) · norm(attn(norm(x)))` and `x + mlp(norm(x))`.

use candle_core::Tensor;

use super::attention::{Attention, AttentionLayout, LayerKv};
use super::engram::{injection, EngramKv};
use super::mlp::HadamardMlp;
use super::monarch::MonarchMlp;
use crate::config::ModelConfig;
use crate::generation::Generation;
use crate::model::kernels::sigmoid;
use crate::model::linear::LowRank;
use crate::model::norm::ZcRmsNorm;
use crate::model::params::ParamPath;
use crate::model::Result;

#[derive(Debug, Clone)]
pub struct Block {
    /// The pre-attention norm (flax's auto-named `ZCRMSNorm_0`).
    pub(in crate::model) input_norm: ZcRmsNorm,
    pub(in crate::model) self_attn: Attention,
    pub(in crate::model) post_attn_norm: ZcRmsNorm,
    /// σ(attn_gate), the weight of the attention branch.
    pub(in crate::model) attn_gate: Tensor,
    pub(in crate::model) pre_hada_norm: ZcRmsNorm,
    pub(in crate::model) mlp: Mlp,
}

/// The MLP after attention: Needle 2's fixed Walsh rotations, or Needle 3's learned Monarch transforms
/// (both stored under `hadamard_mlp`).
#[derive(Debug, Clone)]
pub enum Mlp {
    Hadamard(HadamardMlp),
    Monarch(MonarchMlp),
}

impl Mlp {
    fn new(cfg: &ModelConfig, vb: ParamPath) -> Result<Self> {
        Ok(match cfg.generation {
            Generation::Needle2 => Mlp::Hadamard(HadamardMlp::new(cfg, vb)?),
            Generation::Needle3 => Mlp::Monarch(MonarchMlp::new(cfg, vb)?),
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Mlp::Hadamard(mlp) => mlp.forward(x),
            Mlp::Monarch(mlp) => mlp.forward(x),
        }
    }
}

impl Block {
    /// Layer `layer`'s block.
    pub fn new(cfg: &ModelConfig, layer: usize, vb: ParamPath) -> Result<Self> {
        let d = cfg.d_model;
        Ok(Self {
            input_norm: ZcRmsNorm::new(d, vb.pp("ZCRMSNorm_0"))?,
            self_attn: Attention::new(cfg, layer, vb.pp("self_attn"))?,
            post_attn_norm: ZcRmsNorm::new(d, vb.pp("post_attn_norm"))?,
            attn_gate: sigmoid(&vb.get(&[], "attn_gate")?)?,
            pre_hada_norm: ZcRmsNorm::new(d, vb.pp("pre_hada_norm"))?,
            mlp: Mlp::new(cfg, vb.pp("hadamard_mlp"))?,
        })
    }

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
