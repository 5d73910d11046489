//! The buffers of the CPU path's layers: what one layer's forward keeps for its backward, and what
//! every layer's passes write and read within the layer.

use super::pass::{resize_zeroed, Dims};

/// What one layer's forward keeps for its backward (see the module comment), token-major unless
/// said otherwise.
#[derive(Debug, Default)]
pub(super) struct Kept {
    /// `[N, 2n + n² + 1]`: `Z = x̂·Φ` (pre, post, res), then the lanes' inverse RMS.
    pub(super) mix: Vec<f32>,
    /// `[N, proj_width]`: q, k, v and gate projections (LoRA included).
    pub(super) proj: Vec<f32>,
    /// `[N, 4r]`: `h·A` of the q, k, v and gate factors.
    pub(super) lora_in: Vec<f32>,
    /// `[heads, N, v]`: the attention output, and `[heads, N]` its log-sum-exp.
    pub(super) out: Vec<f32>,
    pub(super) lse: Vec<f32>,
    /// `[N, d]`: the attention branch after the output projection.
    pub(super) attn: Vec<f32>,
    /// `[N, r]`: `gated·A` of the out factor.
    pub(super) lora_out: Vec<f32>,
    /// `[N, mlp_kept]`: what the MLP keeps ([`super::block::Mlp::kept_width`]).
    pub(super) mlp: Vec<f32>,
}

impl Kept {
    /// Every buffer with its width per token.
    fn buffers(&mut self, dims: &Dims) -> [(&mut Vec<f32>, usize); 8] {
        [
            (&mut self.mix, dims.mix_width()),
            (&mut self.proj, dims.proj_width()),
            (&mut self.lora_in, 4 * dims.rank),
            (&mut self.out, dims.o_width()),
            (&mut self.lse, dims.heads),
            (&mut self.attn, dims.d),
            (&mut self.lora_out, dims.rank),
            (&mut self.mlp, dims.mlp_kept),
        ]
    }

    pub(super) fn resize(&mut self, dims: &Dims) {
        self.buffers(dims).into_iter().for_each(|(buf, width)| resize_zeroed(buf, dims.tokens * width));
    }

    /// Bytes per token.
    pub(super) fn bytes_per_token(dims: &Dims) -> usize {
        4 * Self::default().buffers(dims).iter().map(|(_, width)| width).sum::<usize>()
    }
}

/// Buffers a layer's passes write and read within the layer, reused by every layer.
#[derive(Debug, Default)]
pub(super) struct Work {
    /// `[N, n·d]`: the normalised lanes `x̂`, then (backward) their gradient.
    pub(super) unit: Vec<f32>,
    /// `[N, q + k + v]` under Needle 3's Q/K/V convolution: its input, then (backward) its input's
    /// gradient.
    pub(super) raw: Vec<f32>,
    pub(super) u: Vec<f32>,
    pub(super) x1: Vec<f32>,
    pub(super) h1: Vec<f32>,
    /// Head-major rotated queries and keys, and values.
    pub(super) qh: Vec<f32>,
    pub(super) kh: Vec<f32>,
    pub(super) vh: Vec<f32>,
    pub(super) gated: Vec<f32>,
    // Backward only.
    pub(super) da: Vec<f32>,
    pub(super) dx1: Vec<f32>,
    pub(super) dupd: Vec<f32>,
    /// `[N, 2n + n²]`: the lane logits' gradient, then `Z`'s.
    pub(super) dl: Vec<f32>,
    pub(super) dgated: Vec<f32>,
    pub(super) dout: Vec<f32>,
    pub(super) dqh: Vec<f32>,
    pub(super) dkh: Vec<f32>,
    pub(super) dvh: Vec<f32>,
    pub(super) dproj: Vec<f32>,
    pub(super) dh1: Vec<f32>,
    /// `[N, r]`: a factor's `dY·Bᵀ`.
    pub(super) low: Vec<f32>,
}

impl Work {
    /// The pass's rotated keys and values, head-major (`[kv_heads, N, qk]` and `[kv_heads, N, v]`),
    /// and (under the Q/K/V convolution) its inputs, as the last forward left them: what a
    /// decoding step adds to its cache.
    pub(super) fn keys_and_values(&self) -> (&[f32], &[f32], &[f32]) {
        (&self.kh, &self.vh, &self.raw)
    }

    /// Every buffer a pass uses with its width per token: the forward's, then (with `backward`)
    /// the backward's.
    fn buffers(&mut self, dims: &Dims, backward: bool) -> Vec<(&mut Vec<f32>, usize)> {
        let (d, q, k, v, o) = (dims.d, dims.q_width(), dims.k_width(), dims.v_width(), dims.o_width());
        let mut buffers = vec![
            (&mut self.unit, dims.lanes * d),
            (&mut self.raw, if dims.conv { dims.qkv_width() } else { 0 }),
            (&mut self.u, d),
            (&mut self.x1, d),
            (&mut self.h1, d),
            (&mut self.qh, q),
            (&mut self.kh, k),
            (&mut self.vh, v),
            (&mut self.gated, o),
        ];
        if backward {
            buffers.extend([
                (&mut self.da, d),
                (&mut self.dx1, d),
                (&mut self.dupd, d),
                (&mut self.dl, dims.mix_width() - 1),
                (&mut self.dgated, o),
                (&mut self.dout, o),
                (&mut self.dqh, q),
                (&mut self.dkh, k),
                (&mut self.dvh, v),
                (&mut self.dproj, dims.proj_width()),
                (&mut self.dh1, d),
                (&mut self.low, dims.rank),
            ]);
        }
        buffers
    }

    pub(super) fn resize(&mut self, dims: &Dims, backward: bool) {
        self.buffers(dims, backward).into_iter().for_each(|(buf, width)| resize_zeroed(buf, dims.tokens * width));
    }

    /// Bytes per token of the buffers of a pass with (or without) a backward.
    pub(super) fn bytes_per_token(dims: &Dims, backward: bool) -> usize {
        4 * Self::default().buffers(dims, backward).iter().map(|(_, width)| width).sum::<usize>()
    }
}
