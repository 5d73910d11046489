//! The layer stack with manifold-constrained hyper-connections (mHC): the residual stream is
//! carried on `mhc_lanes` parallel lanes. Each layer reads one mixture of the lanes (`pre` gates),
//! adds its block's update back to every lane (`post` gates) and mixes the lanes with a
//! doubly-stochastic matrix (Sinkhorn-normalised `res` logits). The lanes are averaged at the end.

use candle_core::Tensor;

use super::attention::{AttentionLayout, LayerKv};
use super::engram::EngramKv;
use crate::model::kernels::{fake_quant_rows, frozen_matmul, lane_mix, lane_read, lane_spread, sigmoid, sinkhorn};
use crate::model::linear::LowRank;
use crate::model::norm::rms_unit;
use crate::model::weights::stack::{LaneMix, Stack, SINKHORN_ITERS};
use crate::model::Result;

impl LaneMix {
    /// `a · (x̂ φ) + b`: the dynamic-plus-static logits of one gate family.
    fn logits(nx: &Tensor, phi: &Tensor, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        Ok(frozen_matmul(nx, phi)?.broadcast_mul(a)?.broadcast_add(b)?)
    }

    /// One layer over lanes `x` `[N, n, d]`.
    fn forward(&self, x: &Tensor, block: impl FnOnce(&Tensor) -> Result<Tensor>) -> Result<Tensor> {
        let (tokens, n, c) = x.dims3()?;
        let nx = rms_unit(&x.reshape((tokens, n * c))?)?;
        let nx = match self.qat {
            Some(qat) => fake_quant_rows(&nx, qat.act_bits)?,
            None => nx,
        };
        let h_pre = sigmoid(&Self::logits(&nx, &self.phi_pre, &self.a_pre, &self.bias_pre)?)?;
        let u = lane_read(x, &h_pre)?;
        let update = (block(&u)? - &u)?;
        let h_post = (sigmoid(&Self::logits(&nx, &self.phi_post, &self.a_post, &self.bias_post)?)? * 2.0)?;
        let res = frozen_matmul(&nx, &self.phi_res)?.reshape((tokens, self.lanes, self.lanes))?;
        let h_res = sinkhorn(&res.broadcast_mul(&self.a_res)?.broadcast_add(&self.b_res)?, SINKHORN_ITERS)?;
        Ok((lane_mix(&h_res, x)? + lane_spread(&h_post, &update)?)?)
    }
}

impl Stack {
    /// Embedded packed tokens `[N, d]` → final hidden states `[N, d]`; `engrams[s]` is site s's
    /// memory; `low_rank` adapts the blocks' projections.
    pub fn forward(
        &self,
        x: &Tensor,
        layout: &AttentionLayout,
        engrams: &[EngramKv],
        low_rank: Option<&LowRank>,
    ) -> Result<Tensor> {
        let lanes = self.through_layers(x, layout, engrams, low_rank, |_| Ok(()))?;
        self.finish(&lanes)
    }

    /// Embedded packed tokens `[N, d]` → the hidden cells the confidence head reads, `[N, R, d]`
    /// with `R = layers + 1`: the scaled embedding, then the lane mean after each layer (before
    /// the final norm, which only the output head reads).
    pub fn cells(
        &self,
        x: &Tensor,
        layout: &AttentionLayout,
        engrams: &[EngramKv],
        low_rank: Option<&LowRank>,
    ) -> Result<Tensor> {
        let mut cells = vec![x.clone()];
        self.through_layers(x, layout, engrams, low_rank, |lanes| {
            cells.push(lanes.mean(1)?);
            Ok(())
        })?;
        Ok(Tensor::stack(&cells, 1)?)
    }

    /// The lanes after the last layer, each layer's output lanes handed to `each` as they are
    /// made (the plain forward hands them to nothing, at no cost).
    fn through_layers(
        &self,
        x: &Tensor,
        layout: &AttentionLayout,
        engrams: &[EngramKv],
        low_rank: Option<&LowRank>,
        mut each: impl FnMut(&Tensor) -> Result<()>,
    ) -> Result<Tensor> {
        let mut lanes = self.spread(x)?;
        for index in 0..self.layers.len() {
            lanes = self.layer(index, &lanes, layout, engrams, low_rank, None)?;
            each(&lanes)?;
        }
        Ok(lanes)
    }

    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    /// The embedded tokens `[N, d]` copied onto every lane: `[N, lanes, d]`.
    pub fn spread(&self, x: &Tensor) -> Result<Tensor> {
        let (tokens, d) = x.dims2()?;
        Ok(x.unsqueeze(1)?.broadcast_as((tokens, self.lanes, d))?.contiguous()?)
    }

    /// Layer `index` over lanes `[N, lanes, d]`; `cache` holds the layer's keys of earlier
    /// positions when decoding.
    pub fn layer(
        &self,
        index: usize,
        lanes: &Tensor,
        layout: &AttentionLayout,
        engrams: &[EngramKv],
        low_rank: Option<&LowRank>,
        cache: Option<&mut LayerKv>,
    ) -> Result<Tensor> {
        let layer = &self.layers[index];
        let sites: Vec<&EngramKv> = layer.engram_sites.iter().filter_map(|&s| engrams.get(s)).collect();
        layer.mix.forward(lanes, |u| layer.block.forward(u, layout, &sites, low_rank, cache))
    }

    /// The lanes after the last layer → final hidden states `[N, d]`.
    pub fn finish(&self, lanes: &Tensor) -> Result<Tensor> {
        self.final_norm.forward(&lanes.mean(1)?)
    }
}
