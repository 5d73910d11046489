//! The weights of one layer's attention (the reference's `self_attn`): the Q/K/V, gate and output
//! projections, the per-head q/k norms and Needle 3's Q/K/V convolution taps, with the head
//! geometry and window the layer was configured with. The candle path computes it in
//! `san/attention.rs`, the CPU path in `fast/attention.rs`.

use candle_core::Tensor;

use crate::config::ModelConfig;
use crate::model::linear::Linear;
use crate::model::norm::ZcRmsNorm;
use crate::model::params::ParamPath;
use crate::model::qat::Qat;
use crate::model::Result;

/// The reference's `self_attn` module.
#[derive(Debug, Clone)]
pub struct Attention {
    pub(in crate::model) q_proj: Linear,
    pub(in crate::model) k_proj: Linear,
    pub(in crate::model) v_proj: Linear,
    pub(in crate::model) gate_proj: Linear,
    pub(in crate::model) out_proj: Linear,
    pub(in crate::model) q_norm: ZcRmsNorm,
    pub(in crate::model) k_norm: ZcRmsNorm,
    /// Needle 3's convolution taps on Q, K and V, `[taps, width]` each.
    pub(in crate::model) conv_taps: Option<[Tensor; 3]>,
    /// The positions a query sees back to, itself included, in a windowed layer (Needle 3).
    pub(in crate::model) window: Option<usize>,
    pub(in crate::model) qat: Option<Qat>,
    pub(in crate::model) num_heads: usize,
    pub(in crate::model) num_kv_heads: usize,
    pub(in crate::model) qk_dim: usize,
    pub(in crate::model) v_dim: usize,
}

impl Attention {
    /// Layer `layer`'s attention.
    pub fn new(cfg: &ModelConfig, layer: usize, vb: ParamPath) -> Result<Self> {
        let (d, heads, kv_heads) = (cfg.d_model, cfg.num_heads, cfg.num_kv_heads);
        let (qk_dim, v_dim) = (cfg.qk_head_dim(), cfg.v_head_dim());
        let conv_taps = match cfg.qkv_conv_taps {
            0 => None,
            taps => Some([
                vb.get(&[taps, heads * qk_dim], "q_taps")?,
                vb.get(&[taps, kv_heads * qk_dim], "k_taps")?,
                vb.get(&[taps, kv_heads * v_dim], "v_taps")?,
            ]),
        };
        Ok(Self {
            q_proj: vb.pp("q_proj").linear(d, heads * qk_dim, "kernel")?,
            k_proj: vb.pp("k_proj").linear(d, kv_heads * qk_dim, "kernel")?,
            v_proj: vb.pp("v_proj").linear(d, kv_heads * v_dim, "kernel")?,
            gate_proj: vb.pp("gate_proj").linear(d, heads * v_dim, "kernel")?,
            out_proj: vb.pp("out_proj").linear(heads * v_dim, d, "kernel")?,
            q_norm: ZcRmsNorm::new(qk_dim, vb.pp("q_norm"))?,
            k_norm: ZcRmsNorm::new(qk_dim, vb.pp("k_norm"))?,
            conv_taps,
            window: cfg.attention_window(layer),
            qat: vb.qat(),
            num_heads: heads,
            num_kv_heads: kv_heads,
            qk_dim,
            v_dim,
        })
    }
}
