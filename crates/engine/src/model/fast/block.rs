//! One transformer block ([`crate::model::san::block`]) around attention, token by token: the
//! engram injection and the input norm before attention, then
//! `x2 = x1 + σ(attn_gate)·norm(attn)` and `y = x2 + mlp(norm(x2))` — each generation's MLP —
//! forward and backward.

use super::attention::Attention;
use super::engram;
use super::mlp::Hadamard;
use super::monarch::Monarch;
use super::pass::Pass;
use crate::config::ModelConfig;
use crate::generation::Generation;
use crate::model::kernels::{fake_quant_row, rms_norm_backward_row, rms_norm_row};
use crate::model::weights::block::{Block as CandleBlock, Mlp as CandleMlp};
use crate::model::weights::stack::Layer;
use crate::w4a8::LayerCodes;

/// The MLP after attention: Needle 2's fixed Walsh rotations or Needle 3's Monarch transforms.
#[derive(Debug, Clone)]
pub(super) enum Mlp {
    Hadamard(Hadamard),
    Monarch(Box<Monarch>),
}

impl Mlp {
    fn new(mlp: &CandleMlp) -> crate::model::Result<Self> {
        Ok(match mlp {
            CandleMlp::Hadamard(mlp) => Mlp::Hadamard(Hadamard::new(mlp)?),
            CandleMlp::Monarch(mlp) => Mlp::Monarch(Box::new(Monarch::new(mlp)?)),
        })
    }

    fn scratch_len(&self) -> usize {
        match self {
            Mlp::Hadamard(mlp) => mlp.scratch_len(),
            Mlp::Monarch(mlp) => mlp.scratch_len(),
        }
    }

    /// Floats per token the MLP of a `cfg` model keeps from its forward for its backward: none for
    /// Needle 2's (recomputing its Walsh rotations is a few vector passes), Monarch's `z1` and
    /// output for Needle 3's.
    pub(super) fn kept_width(cfg: &ModelConfig) -> usize {
        match cfg.generation {
            Generation::Needle2 => 0,
            Generation::Needle3 => Monarch::kept_width(cfg),
        }
    }

    #[inline(always)]
    fn forward(&self, x: &[f32], scratch: &mut [f32], kept: &mut [f32], y: &mut [f32]) {
        match self {
            Mlp::Hadamard(mlp) => mlp.forward(x, scratch, y),
            Mlp::Monarch(mlp) => mlp.forward(x, scratch, kept, y),
        }
    }

    /// The forward's `scratch` and `y` again, for the backward, from what it kept.
    #[inline(always)]
    fn recall(&self, x: &[f32], kept: &[f32], scratch: &mut [f32], y: &mut [f32]) {
        match self {
            Mlp::Hadamard(mlp) => mlp.forward(x, scratch, y),
            Mlp::Monarch(mlp) => mlp.recall(x, kept, scratch, y),
        }
    }

    #[inline(always)]
    fn backward(&self, scratch: &mut [f32], kept: &[f32], dy: &[f32], dx: &mut [f32]) {
        match self {
            Mlp::Hadamard(mlp) => mlp.backward(scratch, dy, dx),
            Mlp::Monarch(mlp) => mlp.backward(scratch, kept, dy, dx),
        }
    }
}

/// A block's parameters on the host (attention's kernels read in place).
#[derive(Debug, Clone)]
pub(super) struct Block {
    gain_in: Vec<f32>,
    gain_post: Vec<f32>,
    gain_hada: Vec<f32>,
    /// σ(attn_gate).
    attn_gate: f32,
    pub(super) attention: Attention,
    mlp: Mlp,
    /// The engram sites injected here.
    sites: Vec<usize>,
    /// Under QAT, the activation bits the projections read `h1` at.
    act_bits: Option<u32>,
}

/// Per-token scratch rows of the block.
pub(super) struct BlockScratch {
    x2: Vec<f32>,
    h2: Vec<f32>,
    /// The normed attention branch, then (backward) its gradient.
    tmp: Vec<f32>,
    mlp: Vec<f32>,
    /// The block's output minus its input, `y − u`.
    pub(super) upd: Vec<f32>,
}

impl BlockScratch {
    /// `upd = mlp + x2 − u`, the MLP's output in `upd`.
    #[inline(always)]
    fn add_residual(&mut self, u: &[f32]) {
        self.upd.iter_mut().zip(self.x2.iter().zip(u)).for_each(|(m, (x2, u))| *m += x2 - u);
    }
}

impl Block {
    pub(super) fn new(layer: &Layer, window: Option<usize>) -> crate::model::Result<Self> {
        let block: &CandleBlock = &layer.block;
        let attention = Attention::new(&block.self_attn, window)?;
        Ok(Self {
            gain_in: block.input_norm.gain()?,
            gain_post: block.post_attn_norm.gain()?,
            gain_hada: block.pre_hada_norm.gain()?,
            attn_gate: block.attn_gate.to_scalar::<f32>()?,
            act_bits: attention.act_bits(),
            attention,
            mlp: Mlp::new(&block.mlp)?,
            sites: layer.engram_sites.clone(),
        })
    }

    /// The attention's projections multiplied from `codes` (W4A8): `h1` is then quantized by the
    /// products themselves, not row by row here.
    pub(super) fn run_from_codes(&mut self, codes: LayerCodes) {
        self.attention.run_from_codes(codes);
        self.act_bits = self.attention.act_bits();
    }

    pub(super) fn scratch(&self, d: usize) -> BlockScratch {
        BlockScratch {
            x2: vec![0.0; d],
            h2: vec![0.0; d],
            tmp: vec![0.0; d],
            mlp: vec![0.0; self.mlp.scratch_len()],
            upd: vec![0.0; d],
        }
    }

    /// Token `t`'s `x1 = u + injection(u)` and `h1 = norm(x1)` (as the projections read it) from
    /// its block input `u`.
    #[inline(always)]
    pub(super) fn inputs(&self, pass: &Pass, t: usize, u: &[f32], x1: &mut [f32], h1: &mut [f32]) {
        engram::inject(&pass.sites, &self.sites, t, u, x1);
        rms_norm_row(x1, &self.gain_in, h1);
        if let Some(bits) = self.act_bits {
            fake_quant_row(h1, bits);
        }
    }

    /// Token `t`'s update `upd = x2 + mlp(norm(x2)) − u` with `x2 = x1 + σ(gate)·norm(attn)`,
    /// into `s.upd`, keeping in `kept` what the MLP keeps ([`Mlp::kept_width`]) and leaving in `s`
    /// what [`Block::update_backward`] reads.
    #[inline(always)]
    pub(super) fn update(&self, u: &[f32], x1: &[f32], attn: &[f32], s: &mut BlockScratch, kept: &mut [f32]) {
        self.mlp_input(x1, attn, s);
        self.mlp.forward(&s.h2, &mut s.mlp, kept, &mut s.upd);
        s.add_residual(u);
    }

    /// [`Block::update`] of this token again, for its backward, from what the MLP kept.
    #[inline(always)]
    pub(super) fn recall(&self, u: &[f32], x1: &[f32], attn: &[f32], s: &mut BlockScratch, kept: &[f32]) {
        self.mlp_input(x1, attn, s);
        self.mlp.recall(&s.h2, kept, &mut s.mlp, &mut s.upd);
        s.add_residual(u);
    }

    /// `x2 = x1 + σ(gate)·norm(attn)` and the MLP's input `h2 = norm(x2)`.
    #[inline(always)]
    fn mlp_input(&self, x1: &[f32], attn: &[f32], s: &mut BlockScratch) {
        rms_norm_row(attn, &self.gain_post, &mut s.tmp);
        s.x2.iter_mut().zip(x1.iter().zip(&s.tmp)).for_each(|(x2, (x1, a))| *x2 = x1 + self.attn_gate * a);
        rms_norm_row(&s.x2, &self.gain_hada, &mut s.h2);
    }

    /// The backward of [`Block::update`] (just recalled for this token, with what its MLP `kept`)
    /// from `dupd`: `x1`'s gradient through the MLP branch (`dx1`) and the attention branch's
    /// (`da`); `u`'s direct `−dupd` is left to the caller.
    #[inline(always)]
    pub(super) fn update_backward(
        &self,
        attn: &[f32],
        s: &mut BlockScratch,
        kept: &[f32],
        dupd: &[f32],
        dx1: &mut [f32],
        da: &mut [f32],
    ) {
        // y = x2 + mlp(norm(x2)): dx2 = dy + norm'(mlp'(dy)).
        let dh2 = &mut s.tmp;
        self.mlp.backward(&mut s.mlp, kept, dupd, dh2);
        rms_norm_backward_row(&s.x2, &self.gain_hada, dh2, dx1);
        dx1.iter_mut().zip(dupd).for_each(|(dx1, dy)| *dx1 += dy);
        // x2 = x1 + σ(gate)·norm(attn).
        dh2.iter_mut().zip(dx1.iter()).for_each(|(t, g)| *t = self.attn_gate * g);
        rms_norm_backward_row(attn, &self.gain_post, dh2, da);
    }

    /// The backward of [`Block::inputs`] for token `t`: `u`'s gradient `du` from `h1`'s (`dh1`,
    /// straight through the activations' quantizer) and `x1`'s from the rest of the block (`dx1`).
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub(super) fn inputs_backward(
        &self,
        pass: &Pass,
        t: usize,
        u: &[f32],
        x1: &[f32],
        dh1: &[f32],
        dx1: &[f32],
        rows: &mut [Vec<f32>; 3],
        du: &mut [f32],
    ) {
        let [g_x1, tmp, part] = rows;
        rms_norm_backward_row(x1, &self.gain_in, dh1, g_x1);
        g_x1.iter_mut().zip(dx1).for_each(|(g, d)| *g += d);
        du.copy_from_slice(g_x1);
        engram::inject_backward(&pass.sites, &pass.ones, &self.sites, t, u, g_x1, du, tmp, part);
    }
}
