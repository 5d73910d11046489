//! The weights of one transformer block: its norms, its attention, the gate on the attention
//! branch and its MLP, Needle 2's or Needle 3's (computed in `san/block.rs` and `fast/block.rs`).

use candle_core::Tensor;

use crate::config::ModelConfig;
use crate::generation::Generation;
use crate::model::kernels::sigmoid;
use crate::model::norm::ZcRmsNorm;
use crate::model::params::ParamPath;
use crate::model::weights::attention::Attention;
use crate::model::weights::mlp::HadamardMlp;
use crate::model::weights::monarch::MonarchMlp;
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
}
