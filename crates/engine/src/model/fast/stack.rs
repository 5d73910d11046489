//! One layer of the stack — the mHC lane mix ([`super::lanes`]) around a block ([`super::block`])
//! — forward and backward, over every token of a pass.
//!
//! The forward keeps, per token: the lane-gate logits before their scale (`Z = x̂·Φ`) and the
//! lanes' inverse RMS, the four attention projections, the LoRA down-projections, the attention
//! output and its log-sum-exp, the attention branch's output, and what the MLP keeps (Needle 3's
//! Monarch: its middle row and its output, which would cost three transforms to recompute).
//! Everything else a backward needs — the block's input `u`, the engram injection, the norms, the
//! rest of the MLP's activations, the rotated queries and keys — is recomputed from those per
//! token, which costs a few vector passes and saves storing them. The layer's input lanes are the
//! previous layer's output, kept by the caller.

use std::sync::Arc;

use candle_core::Result;
use rayon::iter::Either;
use rayon::prelude::*;

use super::attention::{FactorGrads, Past};
use super::block::{Block, BlockScratch};
use super::kept::{Kept, Work};
use super::lanes::{LaneScratch, Lanes};
use super::pass::{Dims, Pass, ProjectionLora};
use crate::model::weights::stack::Layer;
use crate::simd::widest;
use crate::w4a8::{LaneCodes, LayerCodes};

/// Tokens per rayon task in the per-token passes: enough to amortise the hand-off.
const TOKENS_PER_TASK: usize = 8;

/// A layer's parameters.
#[derive(Debug, Clone)]
pub(super) struct HostLayer {
    lanes: Lanes,
    pub(super) block: Block,
}

impl HostLayer {
    /// Layer `layer` seen through `window` (a windowed layer's, or `None`), its attention
    /// projections and lane gates multiplied from `codes` (W4A8) when given.
    pub(super) fn new(
        layer: &Layer,
        window: Option<usize>,
        codes: Option<(&LayerCodes, &LaneCodes)>,
    ) -> crate::model::Result<Self> {
        let mut block = Block::new(layer, window)?;
        if let Some((attention, _)) = codes {
            block.run_from_codes(Arc::clone(attention));
        }
        Ok(Self { lanes: Lanes::new(&layer.mix, codes.map(|(_, lanes)| lanes))?, block })
    }
}

/// Per-token scratch of the passes that run the block's update and the lane mix.
struct Scratch {
    block: BlockScratch,
    lanes: LaneScratch,
}

impl HostLayer {
    fn scratch(&self, dims: &Dims) -> Scratch {
        Scratch { block: self.block.scratch(dims.d), lanes: LaneScratch::new(dims.lanes) }
    }

    /// `u`, `x1` and `h1` of every token into `work` (the forward's first pass, and the
    /// backward's recomputation), from the lanes `x` and their gate logits `mix`.
    fn block_inputs(&self, pass: &Pass, x: &[f32], mix: &[f32], work: &mut Work) {
        let dims = &pass.dims;
        let (nd, d, n, mw) = (dims.lanes * dims.d, dims.d, dims.lanes, dims.mix_width());
        (work.u.par_chunks_mut(d), work.x1.par_chunks_mut(d), work.h1.par_chunks_mut(d))
            .into_par_iter()
            .enumerate()
            .with_min_len(TOKENS_PER_TASK)
            .for_each_init(
                || LaneScratch::new(n),
                |s, (t, (u, x1, h1))| {
                    widest(
                        #[inline(always)]
                        || {
                            self.lanes.gates(n, &mix[t * mw..][..mw], &mut s.gates);
                            Lanes::read(&x[t * nd..][..nd], &s.gates[..n], u);
                            self.block.inputs(pass, t, u, x1, h1);
                        },
                    )
                },
            );
    }

    /// The layer's forward over lanes `x` `[N, n·d]` into `next`, keeping what the backward needs
    /// (a recomputing step's backward runs it again, writing the same `next`); a decoding step's
    /// attention also reads the `past` positions of each of its segments (none outside decoding).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn forward(
        &self,
        pass: &Pass,
        lora: &[Option<ProjectionLora>; 5],
        x: &[f32],
        kept: &mut Kept,
        work: &mut Work,
        next: &mut [f32],
        past: &[Past],
    ) -> Result<()> {
        self.lanes.logits(&pass.dims, x, &mut work.unit, &mut kept.mix)?;
        self.block_inputs(pass, x, &kept.mix, work);
        self.block.attention.forward(pass, lora, kept, work, past)?;
        self.write_update(pass, x, kept, work, next);
        Ok(())
    }

    /// The rest of the block, and the lanes mixed with its update added, into `next`.
    fn write_update(&self, pass: &Pass, x: &[f32], kept: &mut Kept, work: &Work, next: &mut [f32]) {
        let dims = &pass.dims;
        let (d, nd, mw) = (dims.d, dims.lanes * dims.d, dims.mix_width());
        let Kept { mix, attn, mlp, .. } = kept;
        let (mix, attn) = (&*mix, &*attn);
        (next.par_chunks_mut(nd), rows_mut(mlp, dims.mlp_kept, dims.tokens))
            .into_par_iter()
            .enumerate()
            .with_min_len(TOKENS_PER_TASK)
            .for_each_init(
                || self.scratch(dims),
                |s, (i, (next, mlp))| {
                    widest(
                        #[inline(always)]
                        || {
                            let (u, x1, attn) = (&work.u[i * d..][..d], &work.x1[i * d..][..d], &attn[i * d..][..d]);
                            self.block.update(u, x1, attn, &mut s.block, mlp);
                            self.lanes.write(
                                &mix[i * mw..][..mw],
                                &x[i * nd..][..nd],
                                &s.block.upd,
                                &mut s.lanes,
                                next,
                            );
                        },
                    )
                },
            );
    }

    /// The layer's backward: `dx` `[N, n·d]` (overwritten) from the output's gradient `dnext`,
    /// with the forward's `kept` (and its input `x`); the LoRA factors' gradients are added to
    /// `grads`. Without `input_gradient` (the first layer: the embedding is frozen) `dx` is left
    /// partly written, and the products and per-token passes that only it needs are skipped.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn backward(
        &self,
        pass: &Pass,
        lora: &[Option<ProjectionLora>; 5],
        x: &[f32],
        kept: &Kept,
        work: &mut Work,
        dnext: &[f32],
        dx: &mut [f32],
        grads: &mut [Option<FactorGrads>; 5],
        input_gradient: bool,
    ) -> Result<()> {
        self.block_inputs(pass, x, &kept.mix, work);
        self.update_backward(pass, x, kept, work, dnext, dx);
        self.block.attention.backward(pass, lora, kept, work, grads, input_gradient)?;
        if input_gradient {
            self.inputs_backward(pass, x, kept, work, dx);
            self.lanes.logits_backward(&pass.dims, x, &kept.mix, &work.dl, &mut work.unit, dx)?;
        }
        Ok(())
    }

    /// Through the lane mix, the MLP and the post-attention norm, token by token: the update's
    /// gradient (`work.dupd`), `x1`'s through the rest of the block (`work.dx1`), the attention
    /// branch's (`work.da`), the post and res logits' (`work.dl`) and the mix's share of `dx`.
    fn update_backward(&self, pass: &Pass, x: &[f32], kept: &Kept, work: &mut Work, dnext: &[f32], dx: &mut [f32]) {
        let dims = &pass.dims;
        let (d, nd, mw, lw, mk) = (dims.d, dims.lanes * dims.d, dims.mix_width(), dims.mix_width() - 1, dims.mlp_kept);
        let Work { u, x1, da, dx1, dupd, dl, .. } = &mut *work;
        let (u, x1) = (&*u, &*x1);
        (
            dx.par_chunks_mut(nd),
            da.par_chunks_mut(d),
            dx1.par_chunks_mut(d),
            dupd.par_chunks_mut(d),
            dl.par_chunks_mut(lw),
        )
            .into_par_iter()
            .enumerate()
            .with_min_len(TOKENS_PER_TASK)
            .for_each_init(
                || self.scratch(dims),
                |s, (i, (dx, da, dx1, dupd, dl))| {
                    widest(
                        #[inline(always)]
                        || {
                            let (u, x1, attn) = (&u[i * d..][..d], &x1[i * d..][..d], &kept.attn[i * d..][..d]);
                            let (m, x, g) = (&kept.mix[i * mw..][..mw], &x[i * nd..][..nd], &dnext[i * nd..][..nd]);
                            let mlp = &kept.mlp[i * mk..][..mk];
                            self.block.recall(u, x1, attn, &mut s.block, mlp);
                            self.lanes.write_backward(m, x, &s.block.upd, g, &mut s.lanes, dupd, dl, dx);
                            self.block.update_backward(attn, &mut s.block, mlp, dupd, dx1, da);
                        },
                    )
                },
            );
    }

    /// Back through the input norm, the engram injection, `u` and the pre gates, token by token,
    /// from `h1`'s gradient (`work.dh1`): adds to `dx` and turns `work.dl` into `Z`'s gradient.
    fn inputs_backward(&self, pass: &Pass, x: &[f32], kept: &Kept, work: &mut Work, dx: &mut [f32]) {
        let dims = &pass.dims;
        let (d, n, nd, mw, lw) = (dims.d, dims.lanes, dims.lanes * dims.d, dims.mix_width(), dims.mix_width() - 1);
        let Work { u, x1, dh1, dx1, dupd, dl, .. } = &mut *work;
        let (u, x1, dh1, dx1, dupd) = (&*u, &*x1, &*dh1, &*dx1, &*dupd);
        (dx.par_chunks_mut(nd), dl.par_chunks_mut(lw))
            .into_par_iter()
            .enumerate()
            .with_min_len(TOKENS_PER_TASK)
            .for_each_init(
                || ([vec![0f32; d], vec![0f32; d], vec![0f32; d]], vec![0f32; d], LaneScratch::new(n)),
                |(rows, du, s), (i, (dx, dl))| {
                    widest(
                        #[inline(always)]
                        || {
                            let (u, x1) = (&u[i * d..][..d], &x1[i * d..][..d]);
                            self.block.inputs_backward(
                                pass,
                                i,
                                u,
                                x1,
                                &dh1[i * d..][..d],
                                &dx1[i * d..][..d],
                                rows,
                                du,
                            );
                            // upd = … − u.
                            du.iter_mut().zip(&dupd[i * d..][..d]).for_each(|(du, g)| *du -= g);
                            self.lanes.read_backward(&kept.mix[i * mw..][..mw], &x[i * nd..][..nd], du, s, dl, dx);
                        },
                    )
                },
            );
    }
}

/// `buf` as `tokens` rows of `width`, in parallel: empty rows when `width` is 0 (an MLP that keeps
/// nothing), where `par_chunks_mut` would have none.
fn rows_mut(buf: &mut [f32], width: usize, tokens: usize) -> impl IndexedParallelIterator<Item = &mut [f32]> {
    match width {
        0 => Either::Left((0..tokens).into_par_iter().map(|_| <&mut [f32]>::default())),
        _ => Either::Right(buf.par_chunks_mut(width)),
    }
}
