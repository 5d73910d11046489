//! The weights of the layer stack: each layer's mHC lane gates (the `stack/mhc_*` parameters at its
//! index), its block and the engram sites it injects, and the final norm (computed in
//! `san/stack.rs`, and by the CPU path in `fast/stack.rs` and `fast/lanes.rs`).

use candle_core::Tensor;

use crate::config::ModelConfig;
use crate::model::norm::ZcRmsNorm;
use crate::model::params::ParamPath;
use crate::model::qat::Qat;
use crate::model::weights::block::Block;
use crate::model::Result;

/// Sinkhorn iterations of the reference (fixed, not configurable there).
pub(in crate::model) const SINKHORN_ITERS: usize = 20;

/// One layer's lane gates (the `stack/mhc_*` parameters at this layer's index).
#[derive(Debug, Clone)]
pub(in crate::model) struct LaneMix {
    pub(in crate::model) phi_pre: Tensor,
    pub(in crate::model) phi_post: Tensor,
    pub(in crate::model) phi_res: Tensor,
    pub(in crate::model) a_pre: Tensor,
    pub(in crate::model) a_post: Tensor,
    pub(in crate::model) a_res: Tensor,
    /// `b_pre` plus the fixed lane offset: +4 on this layer's own lane (layer mod lanes), −4 elsewhere.
    pub(in crate::model) bias_pre: Tensor,
    /// `b_post` plus the fixed lane offset: 0 on this layer's own lane, −4 elsewhere.
    pub(in crate::model) bias_post: Tensor,
    pub(in crate::model) b_res: Tensor,
    pub(in crate::model) lanes: usize,
    pub(in crate::model) qat: Option<Qat>,
}

impl LaneMix {
    fn new(lanes: usize, d_model: usize, layer: usize, vb: ParamPath) -> Result<Self> {
        let (n, nc) = (lanes, lanes * d_model);
        let own_lane: Vec<f32> = (0..n).map(|l| if l == layer % n { 1.0 } else { 0.0 }).collect();
        let own_lane = Tensor::from_vec(own_lane, n, vb.device())?;
        let pre_offset = own_lane.affine(8.0, -4.0)?;
        let post_offset = own_lane.affine(4.0, -4.0)?;
        Ok(Self {
            phi_pre: vb.get(&[nc, n], "mhc_phi_pre")?,
            phi_post: vb.get(&[nc, n], "mhc_phi_post")?,
            phi_res: vb.get(&[nc, n * n], "mhc_phi_res")?,
            a_pre: vb.get(&[], "mhc_a_pre")?,
            a_post: vb.get(&[], "mhc_a_post")?,
            a_res: vb.get(&[], "mhc_a_res")?,
            bias_pre: (vb.get(&[n], "mhc_b_pre")? + pre_offset)?,
            bias_post: (vb.get(&[n], "mhc_b_post")? + post_offset)?,
            b_res: vb.get(&[n, n], "mhc_b_res")?,
            lanes,
            qat: vb.qat(),
        })
    }
}

#[derive(Debug, Clone)]
pub(in crate::model) struct Layer {
    pub(in crate::model) mix: LaneMix,
    pub(in crate::model) block: Block,
    /// Indices of the engram sites injected at this layer.
    pub(in crate::model) engram_sites: Vec<usize>,
}

/// The reference's `stack` module: the layers and the final norm.
#[derive(Debug, Clone)]
pub struct Stack {
    pub(in crate::model) layers: Vec<Layer>,
    pub(in crate::model) final_norm: ZcRmsNorm,
    pub(in crate::model) lanes: usize,
}

impl Stack {
    pub fn new(cfg: &ModelConfig, vb: ParamPath) -> Result<Self> {
        let count = cfg.num_layers;
        let layers = (0..count)
            .map(|i| {
                Ok(Layer {
                    mix: LaneMix::new(cfg.mhc_lanes, cfg.d_model, i, vb.layer(i, count))?,
                    block: Block::new(cfg, i, vb.pp("layers").pp("block").layer(i, count))?,
                    engram_sites: (0..cfg.engram_layers.len()).filter(|&s| cfg.engram_layers[s] == i).collect(),
                })
            })
            .collect::<Result<_>>()?;
        Ok(Self { layers, final_norm: ZcRmsNorm::new(cfg.d_model, vb.pp("final_norm"))?, lanes: cfg.mhc_lanes })
    }
}
