//! What one pass of the CPU path reads besides its lanes: its sizes, the positions, segments and
//! rotary tables of its tokens, the engram memories and convolution reads, each projection's LoRA
//! factors; and the buffers' resizing every pass shares.

use std::sync::Arc;

use rayon::prelude::*;

use super::conv::Reads;
use super::engram::Site;
use crate::model::kernels::RopeTables;
use crate::model::packing::{Family, Segment};

/// The sizes of one pass.
#[derive(Debug, Clone, Copy)]
pub(super) struct Dims {
    pub(super) tokens: usize,
    pub(super) lanes: usize,
    pub(super) d: usize,
    pub(super) heads: usize,
    pub(super) kv_heads: usize,
    /// The width of a query or key head, and of a value head.
    pub(super) qk: usize,
    pub(super) v: usize,
    pub(super) rank: usize,
    /// Whether the layers convolve Q, K and V (Needle 3).
    pub(super) conv: bool,
    /// Floats per token the MLP keeps for its backward ([`block::Mlp::kept_width`]).
    pub(super) mlp_kept: usize,
}

impl Dims {
    /// `Z` (pre, post, res gate logits) and the inverse RMS, per token.
    pub(super) fn mix_width(&self) -> usize {
        2 * self.lanes + self.lanes * self.lanes + 1
    }

    pub(super) fn q_width(&self) -> usize {
        self.heads * self.qk
    }

    pub(super) fn k_width(&self) -> usize {
        self.kv_heads * self.qk
    }

    pub(super) fn v_width(&self) -> usize {
        self.kv_heads * self.v
    }

    /// The width of the attention's output: its gate, and the output projection's input.
    pub(super) fn o_width(&self) -> usize {
        self.heads * self.v
    }

    /// The width of the q, k and v projections together: what the convolution reads.
    pub(super) fn qkv_width(&self) -> usize {
        self.q_width() + self.k_width() + self.v_width()
    }

    pub(super) fn proj_width(&self) -> usize {
        self.qkv_width() + self.o_width()
    }

    /// (first column, width) of the q, k, v and gate projections in a projection row.
    pub(super) fn proj_columns(&self) -> [(usize, usize); 4] {
        let (q, k, v, o) = (self.q_width(), self.k_width(), self.v_width(), self.o_width());
        [(0, q), (q, k), (q + k, v), (q + k + v, o)]
    }
}

/// What every layer of a pass reads besides its lanes.
pub(super) struct Pass {
    pub(super) dims: Dims,
    pub(super) positions: Vec<u32>,
    pub(super) segments: Vec<Segment>,
    pub(super) families: Vec<Family>,
    pub(super) rope: Arc<RopeTables>,
    pub(super) sites: Vec<Site>,
    /// The tokens Needle 3's Q/K/V convolution reads.
    pub(super) conv: Option<Reads>,
    pub(super) lora_scale: f32,
    /// A unit gain, for the RMS normalisations that have none.
    pub(super) ones: Vec<f32>,
}

/// A LoRA factor of one projection on the host: `A` `[in, r]`, `B` `[r, out]`, and under QAT the
/// kernel it adapts merged with it and through CQ, `CQ(W + s·A·B)` `[in, out]` (what the pass
/// multiplies by instead of `W`).
pub(super) struct ProjectionLora {
    pub(super) a: Vec<f32>,
    pub(super) b: Vec<f32>,
    pub(super) merged: Option<Vec<f32>>,
}

/// Layer `l`'s input lanes and the buffer its output goes to.
pub(super) fn lane_pair(lanes: &mut [Vec<f32>], l: usize) -> (&[f32], &mut [f32]) {
    let count = lanes.len();
    let (input, output) = (l % count, (l + 1) % count);
    if input < output {
        let (before, after) = lanes.split_at_mut(output);
        (&before[input], &mut after[0])
    } else {
        let (before, after) = lanes.split_at_mut(input);
        (&after[0], &mut before[output])
    }
}

/// `buf.resize(len, 0.0)`, with the new elements written on the pool. The first write to a fresh
/// page is the kernel's fault and zeroing, which a first step would otherwise wait for on one
/// thread: a 1024-token Needle 3 training pass's workspace took 0.38–0.45 s that way on a 2-core
/// Zen 4, 0.15–0.19 s on both cores.
pub(super) fn resize_zeroed(buf: &mut Vec<f32>, len: usize) {
    match len.checked_sub(buf.len()) {
        Some(0) => {}
        Some(grow) => buf.par_extend(rayon::iter::repeat_n(0.0, grow)),
        None => buf.truncate(len),
    }
}
