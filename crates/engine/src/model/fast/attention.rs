//! Attention of one layer ([`crate::model::san::attention`]) over every token of a pass, forward
//! and backward by hand: the q, k, v and gate projections of `h1` with their low-rank updates,
//! per-head q/k norms and RoPE, the flash attention ([`super::flash`]), the sigmoid output gate and
//! the output projection. Queries and keys may be narrower than values (Needle 3), a windowed
//! layer sees only its window, and under QAT the queries, keys and values are read at 8 bits and
//! the gated output as the runtime's int8 activations, straight-through for the gradient.

use candle_core::Result;
use rayon::prelude::*;

pub(super) use super::conv::Conv;
use super::flash::{self, Heads};
use super::kept::{Kept, Work};
use super::mat::{matmul, Mat, MatMut, Threads};
use super::pass::{Dims, Pass, ProjectionLora};
use crate::model::host::host;
use crate::model::kernels::{fake_quant_row, rms_norm_backward_row, rms_norm_row};
use crate::model::linear::Linear;
use crate::model::qat::Qat;
use crate::model::weights::attention::Attention as CandleAttention;
use crate::simd::{logistic, widest};
use crate::w4a8::{Activations, CqMatrix, LayerCodes};

/// Tokens per rayon task in the per-token passes: enough to amortise the hand-off.
const TOKENS_PER_TASK: usize = 8;

/// The out projection's index among the projections: q, k, v and gate come first, in the order
/// their outputs sit in [`Kept`]'s projection rows.
pub(super) const O: usize = 4;

/// A LoRA factor's gradients, `dA` `[in, r]` and `dB` `[r, out]`, summed over passes.
pub(super) type FactorGrads = (Vec<f32>, Vec<f32>);

/// What a decoding step's attention reads of the positions before it: their keys and values, and
/// the last Q/K/V inputs the convolution's taps reach.
#[derive(Debug, Clone, Copy)]
pub(super) struct Past<'a> {
    pub(super) kv: flash::Cached<'a>,
    pub(super) recent: &'a [f32],
}

/// One layer's attention parameters: the kernels read in place, the norms' gains on the host.
#[derive(Debug, Clone)]
pub(super) struct Attention {
    q_gain: Vec<f32>,
    k_gain: Vec<f32>,
    /// q, k, v, gate and out projections.
    pub(super) proj: [Linear; 5],
    /// Needle 3's causal taps on Q, K and V.
    conv: Option<Conv>,
    window: Option<usize>,
    qat: Option<Qat>,
    /// Under W4A8, the projections' CQ codes: multiplied in place of `proj` by the integer
    /// kernels, each product quantizing its own input ([`Attention::run_from_codes`]).
    codes: Option<LayerCodes>,
}

impl Attention {
    pub(super) fn new(attn: &CandleAttention, window: Option<usize>) -> crate::model::Result<Self> {
        Ok(Self {
            q_gain: attn.q_norm.gain()?,
            k_gain: attn.k_norm.gain()?,
            proj: [
                attn.q_proj.clone(),
                attn.k_proj.clone(),
                attn.v_proj.clone(),
                attn.gate_proj.clone(),
                attn.out_proj.clone(),
            ],
            conv: attn.conv_taps.as_ref().map(Conv::new).transpose()?,
            window,
            qat: attn.qat,
            codes: None,
        })
    }

    /// The projections multiplied from `codes` (W4A8) when no adapter factor changes them. Their
    /// inputs are then quantized once, per rotated group, by the product itself, so the row-wise
    /// fake quantization the simulated path applies before them is not applied too.
    pub(super) fn run_from_codes(&mut self, codes: LayerCodes) {
        self.codes = Some(codes);
    }

    /// The positions a query sees back to, itself included, in a windowed layer.
    pub(super) fn window(&self) -> Option<usize> {
        self.window
    }

    /// Needle 3's Q/K/V convolution, if the layer has one.
    pub(super) fn conv(&self) -> Option<&Conv> {
        self.conv.as_ref()
    }

    /// Under QAT, the bits the projections read their inputs at, fake-quantized row by row; none
    /// under W4A8, whose products quantize their inputs themselves.
    pub(super) fn act_bits(&self) -> Option<u32> {
        self.qat.filter(|_| self.codes.is_none()).map(|q| q.act_bits)
    }

    /// The geometry of the layer's attention call over the pass.
    pub(super) fn geometry(&self, dims: &Dims) -> Heads {
        Heads {
            heads: dims.heads,
            kv_heads: dims.kv_heads,
            qk: dims.qk,
            v: dims.v,
            tokens: dims.tokens,
            window: self.window,
        }
    }

    /// The forward from `work.h1`: the projections (kept), the attention output and its
    /// log-sum-exp (kept), and the branch's output `kept.attn`; a decoding step's segment `s` also
    /// reads the positions `past[s]` holds (`past` is empty outside decoding).
    pub(super) fn forward(
        &self,
        pass: &Pass,
        lora: &[Option<ProjectionLora>; 5],
        kept: &mut Kept,
        work: &mut Work,
        past: &[Past],
    ) -> Result<()> {
        let dims = &pass.dims;
        let (t, d, r, pw, qkv) = (dims.tokens, dims.d, dims.rank, dims.proj_width(), dims.qkv_width());
        // Under W4A8, `h1` rotated and quantized once for the four projections that read it.
        let h1_codes = self.codes.as_ref().map(|_| Activations::quantize(&work.h1[..t * d], t, d)).transpose();
        let h1_codes = h1_codes.map_err(candle_core::Error::wrap)?;
        for (p, (col, width)) in dims.proj_columns().into_iter().enumerate() {
            // Under the Q/K/V convolution, its input.
            let (dst, stride) = match (&self.conv, p < 3) {
                (Some(_), true) => (&mut work.raw[col..], qkv),
                _ => (&mut kept.proj[col..], pw),
            };
            if let (Some(codes), Some(x), None) = (&self.codes, &h1_codes, &lora[p]) {
                integer_project(&codes[p], x, width, dst, stride)?;
                continue;
            }
            let low = MatMut::strided(&mut kept.lora_in[p * r..], t, r, 4 * r);
            let y = MatMut::strided(dst, t, width, stride);
            let x = Mat::new(&work.h1, t, d);
            with_kernel(&self.proj[p], lora[p].as_ref(), d, width, |w| {
                project(x, w, lora[p].as_ref(), pass.lora_scale, low, y)
            })?;
        }
        match (&self.conv, &pass.conv) {
            (None, _) => {}
            (Some(conv), Some(reads)) => conv.forward(reads, &work.raw, &mut kept.proj, pw),
            (Some(_), None) if past.len() != pass.segments.len() => {
                candle_core::bail!("the Q/K/V taps need the tokens they read")
            }
            (Some(conv), None) => {
                for (segment, past) in pass.segments.iter().zip(past) {
                    let (rows, proj) = (segment.range(), &mut kept.proj[segment.start * pw..]);
                    conv.forward_after(past.recent, &work.raw[rows.start * qkv..rows.end * qkv], proj, pw);
                }
            }
        }
        self.heads(pass, &kept.proj, work);
        let Work { qh, kh, vh, .. } = &*work;
        let cached: Vec<flash::Cached> = past.iter().map(|p| p.kv).collect();
        flash::forward(self.geometry(dims), &pass.segments, qh, kh, vh, &cached, &mut kept.out, &mut kept.lse);
        self.gated(dims, kept, &mut work.gated);
        let o = dims.o_width();
        if let (Some(codes), None) = (&self.codes, &lora[O]) {
            let x = Activations::quantize(&work.gated[..t * o], t, o).map_err(candle_core::Error::wrap)?;
            return integer_project(&codes[O], &x, d, &mut kept.attn, d);
        }
        let (low, y) = (MatMut::new(&mut kept.lora_out, t, r), MatMut::new(&mut kept.attn, t, d));
        let x = Mat::new(&work.gated, t, o);
        with_kernel(&self.proj[O], lora[O].as_ref(), o, d, |w| project(x, w, lora[O].as_ref(), pass.lora_scale, low, y))
    }

    /// The backward from the branch output's gradient `work.da` to `h1`'s (`work.dh1`, unless
    /// `input_gradient` is false: nothing reads it below the first layer), adding the factors'
    /// gradients to `grads`; `work.h1` holds the forward's `h1`.
    pub(super) fn backward(
        &self,
        pass: &Pass,
        lora: &[Option<ProjectionLora>; 5],
        kept: &Kept,
        work: &mut Work,
        grads: &mut [Option<FactorGrads>; 5],
        input_gradient: bool,
    ) -> Result<()> {
        let dims = &pass.dims;
        let (t, d, o, r) = (dims.tokens, dims.d, dims.o_width(), dims.rank);
        // The output projection: dgated = da·Woᵀ, and its factor's gradients.
        self.gated(dims, kept, &mut work.gated);
        let (x, low) = (Mat::new(&work.gated, t, o), Mat::new(&kept.lora_out, t, r));
        let (dy, dx) = (Mat::new(&work.da, t, d), MatMut::new(&mut work.dgated, t, o));
        let factor = lora[O].as_ref().zip(grads[O].as_mut());
        with_kernel(&self.proj[O], lora[O].as_ref(), o, d, |w| {
            project_backward(x, w, low, factor, pass.lora_scale, dy, Some(dx), false, &mut work.low)
        })?;

        self.output_gradient(dims, kept, work);
        self.heads(pass, &kept.proj, work);
        let Work { qh, kh, vh, dout, dqh, dkh, dvh, .. } = &mut *work;
        let saved = flash::Saved { q: qh, k: kh, v: vh, out: &kept.out, lse: &kept.lse };
        let flash_grads = flash::Grads { q: dqh, k: dkh, v: dvh };
        flash::backward(self.geometry(dims), &pass.segments, &pass.families, &saved, dout, flash_grads);
        self.projection_gradients(pass, kept, work);
        let (pw, qkv) = (dims.proj_width(), dims.qkv_width());
        if let (Some(conv), Some(reads)) = (&self.conv, &pass.conv) {
            conv.backward(reads, &work.dproj, pw, &mut work.raw);
        }

        // dh1 = Σ dP·Wᵀ over q, k, v and gate, and their factors' gradients.
        for (p, (col, width)) in dims.proj_columns().into_iter().enumerate() {
            let (x, low) = (Mat::new(&work.h1, t, d), Mat::strided(&kept.lora_in[p * r..], t, r, 4 * r));
            let dy = match (&self.conv, p < 3) {
                (Some(_), true) => Mat::strided(&work.raw[col..], t, width, qkv),
                _ => Mat::strided(&work.dproj[col..], t, width, pw),
            };
            let factor = lora[p].as_ref().zip(grads[p].as_mut());
            let dx = input_gradient.then(|| MatMut::new(&mut work.dh1, t, d));
            with_kernel(&self.proj[p], lora[p].as_ref(), d, width, |w| {
                project_backward(x, w, low, factor, pass.lora_scale, dy, dx, p > 0, &mut work.low)
            })?;
        }
        Ok(())
    }

    /// Head-major queries and keys (normed and rotated) and values, from the projections, as
    /// attention reads them (under QAT at 8 bits).
    fn heads(&self, pass: &Pass, proj: &[f32], work: &mut Work) {
        let dims = &pass.dims;
        let (qk, vd, pw, t) = (dims.qk, dims.v, dims.proj_width(), dims.tokens);
        let [(_, _), (k_col, _), (v_col, _), _] = dims.proj_columns();
        let kv_bits = self.qat.filter(|q| q.kv_bits == 8).map(|_| 8);
        let rows = |buf: &mut Vec<f32>, col: usize, width: usize, gain: Option<&Vec<f32>>, bits: Option<u32>| {
            buf.par_chunks_mut(t * width).enumerate().for_each_init(
                || vec![0f32; width],
                |tmp, (h, slab)| {
                    widest(
                        #[inline(always)]
                        || {
                            for (i, out) in slab.chunks_mut(width).enumerate() {
                                let x = &proj[i * pw + col + h * width..][..width];
                                match gain {
                                    Some(gain) => {
                                        rms_norm_row(x, gain, tmp);
                                        pass.rope.rotate(pass.positions[i] as usize, tmp, out, false);
                                    }
                                    None => out.copy_from_slice(x),
                                }
                                if let Some(bits) = bits {
                                    fake_quant_row(out, bits);
                                }
                            }
                        },
                    )
                },
            )
        };
        rows(&mut work.qh, 0, qk, Some(&self.q_gain), self.qat.map(|_| 8));
        rows(&mut work.kh, k_col, qk, Some(&self.k_gain), kv_bits);
        rows(&mut work.vh, v_col, vd, None, kv_bits);
    }

    /// `gated = out ⊙ σ(gate projection)`, token-major, from the head-major output (under QAT as
    /// the output projection reads it).
    fn gated(&self, dims: &Dims, kept: &Kept, gated: &mut [f32]) {
        let (vd, o, pw, t) = (dims.v, dims.o_width(), dims.proj_width(), dims.tokens);
        let g_col = dims.proj_columns()[3].0;
        let bits = self.act_bits();
        gated.par_chunks_mut(o).enumerate().with_min_len(TOKENS_PER_TASK).for_each(|(i, row)| {
            widest(
                #[inline(always)]
                || {
                    let gate = &kept.proj[i * pw + g_col..][..o];
                    for (h, part) in row.chunks_mut(vd).enumerate() {
                        let out = &kept.out[(h * t + i) * vd..][..vd];
                        part.iter_mut()
                            .zip(out.iter().zip(&gate[h * vd..]))
                            .for_each(|(g, (o, z))| *g = o * logistic(*z));
                    }
                    if let Some(bits) = bits {
                        fake_quant_row(row, bits);
                    }
                },
            )
        });
    }

    /// The attention output's gradient, head-major (`work.dout`), from the gated output's.
    fn output_gradient(&self, dims: &Dims, kept: &Kept, work: &mut Work) {
        let (vd, o, pw, t) = (dims.v, dims.o_width(), dims.proj_width(), dims.tokens);
        let g_col = dims.proj_columns()[3].0;
        let (dgated, proj) = (&work.dgated, &kept.proj);
        work.dout.par_chunks_mut(t * vd).enumerate().for_each(|(h, slab)| {
            widest(
                #[inline(always)]
                || {
                    for (i, out) in slab.chunks_mut(vd).enumerate() {
                        let (g, z) = (&dgated[i * o + h * vd..][..vd], &proj[i * pw + g_col + h * vd..][..vd]);
                        out.iter_mut().zip(g.iter().zip(z)).for_each(|(o, (g, z))| *o = g * logistic(*z));
                    }
                },
            )
        });
    }

    /// The projections' gradients `work.dproj`, token by token: the queries' and keys' back
    /// through the rotation and the head norms, the values' as they are, the gate's through its
    /// sigmoid.
    fn projection_gradients(&self, pass: &Pass, kept: &Kept, work: &mut Work) {
        let dims = &pass.dims;
        let (qk, vd, o, pw, t) = (dims.qk, dims.v, dims.o_width(), dims.proj_width(), dims.tokens);
        let [_, (k_col, _), (v_col, _), (g_col, _)] = dims.proj_columns();
        let Work { dgated, dqh, dkh, dvh, dproj, .. } = &mut *work;
        let (dgated, dqh, dkh, dvh) = (&*dgated, &*dqh, &*dkh, &*dvh);
        let (kv_heads, heads) = (dims.kv_heads, dims.heads);
        dproj.par_chunks_mut(pw).enumerate().with_min_len(TOKENS_PER_TASK).for_each_init(
            || vec![0f32; qk],
            |tmp, (i, row)| {
                widest(
                    #[inline(always)]
                    || {
                        let position = pass.positions[i] as usize;
                        let p = &kept.proj[i * pw..][..pw];
                        for (col, count, grads, gain) in
                            [(0, heads, dqh, &self.q_gain), (k_col, kv_heads, dkh, &self.k_gain)]
                        {
                            for h in 0..count {
                                pass.rope.rotate(position, &grads[(h * t + i) * qk..][..qk], tmp, true);
                                let at = col + h * qk;
                                rms_norm_backward_row(&p[at..at + qk], gain, tmp, &mut row[at..at + qk]);
                            }
                        }
                        for h in 0..kv_heads {
                            let at = v_col + h * vd;
                            row[at..at + vd].copy_from_slice(&dvh[(h * t + i) * vd..][..vd]);
                        }
                        let (g, z) = (&dgated[i * o..][..o], &p[g_col..g_col + o]);
                        let heads = row[g_col..g_col + o].chunks_mut(vd).zip(g.chunks(vd).zip(z.chunks(vd)));
                        for (h, (dz, (g, z))) in heads.enumerate() {
                            let out = &kept.out[(h * t + i) * vd..][..vd];
                            for (dz, (g, (z, out))) in dz.iter_mut().zip(g.iter().zip(z.iter().zip(out))) {
                                let s = logistic(*z);
                                *dz = g * out * s * (1.0 - s);
                            }
                        }
                    },
                )
            },
        );
    }
}

/// `f` of the kernel `[in, out]` a projection multiplies by: under QAT with a LoRA factor, the
/// merged kernel through CQ; else the (frozen) kernel itself, read only then ([`Linear::weight`]).
fn with_kernel<R>(
    linear: &Linear,
    factor: Option<&ProjectionLora>,
    d_in: usize,
    d_out: usize,
    f: impl FnOnce(Mat) -> R,
) -> Result<R> {
    if let Some(merged) = factor.and_then(|f| f.merged.as_deref()) {
        return Ok(f(Mat::new(merged, d_in, d_out)));
    }
    let weight = linear.weight().map_err(candle_core::Error::wrap)?;
    let values = host(&weight)?;
    Ok(f(Mat::new(&values, d_in, d_out)))
}

/// `y = x·Mᵀ` of a projection's CQ codes `m` `[width, in]` with quantized rows `x`, from the
/// integer kernels (W4A8), into the `width` columns of `y` whose rows are `stride` apart.
fn integer_project(m: &CqMatrix, x: &Activations, width: usize, y: &mut [f32], stride: usize) -> Result<()> {
    if m.out() != width {
        candle_core::bail!("a W4A8 projection has {} outputs where the layer reads {width}", m.out());
    }
    let product = m.product(x).map_err(candle_core::Error::wrap)?;
    for (y, row) in y.chunks_mut(stride).zip(product.chunks_exact(width)) {
        y[..width].copy_from_slice(row);
    }
    Ok(())
}

/// `y = x·W + s·(x·A)·B` for a projection with a LoRA `factor` (`x·W` without), keeping `low = x·A`.
/// Under QAT `W` is the factor's merged kernel, which holds the update already.
fn project(x: Mat, w: Mat, factor: Option<&ProjectionLora>, scale: f32, mut low: MatMut, mut y: MatMut) {
    matmul(y.reborrow(), x, w, 1.0, false, Threads::All);
    let Some(factor) = factor else { return };
    let (d_in, d_out, r) = (w.rows(), w.cols(), low.cols());
    matmul(low.reborrow(), x, Mat::new(&factor.a, d_in, r), 1.0, false, Threads::All);
    if factor.merged.is_none() {
        matmul(y, low.as_mat(), Mat::new(&factor.b, r, d_out), scale, true, Threads::All);
    }
}

/// The backward of [`project`] from `dy`: `dx = dy·Wᵀ + s·(dy·Bᵀ)·Aᵀ` (added to `dx` when
/// `accumulate`, not formed without a `dx`; under QAT `dy·Wᵀ` of the merged kernel alone, the
/// update's gradient passing straight through its quantizer to the factors), and the factor's gradients
/// `dA += s·xᵀ·(dy·Bᵀ)`, `dB += s·lowᵀ·dy`; `scratch` holds `dy·Bᵀ`.
#[allow(clippy::too_many_arguments)]
fn project_backward(
    x: Mat,
    w: Mat,
    low: Mat,
    factor: Option<(&ProjectionLora, &mut FactorGrads)>,
    scale: f32,
    dy: Mat,
    mut dx: Option<MatMut>,
    accumulate: bool,
    scratch: &mut [f32],
) {
    let (t, d_in, d_out, r) = (x.rows(), w.rows(), w.cols(), low.cols());
    if let Some(dx) = dx.as_mut() {
        matmul(dx.reborrow(), dy, w.t(), 1.0, accumulate, Threads::All);
    }
    let Some((factor, (grad_a, grad_b))) = factor else { return };
    matmul(MatMut::new(scratch, t, r), dy, Mat::new(&factor.b, r, d_out).t(), 1.0, false, Threads::All);
    let dlow = Mat::new(scratch, t, r);
    if let (Some(dx), None) = (dx, &factor.merged) {
        matmul(dx, dlow, Mat::new(&factor.a, d_in, r).t(), scale, true, Threads::All);
    }
    matmul(MatMut::new(grad_b, r, d_out), low.t(), dy, scale, true, Threads::All);
    matmul(MatMut::new(grad_a, d_in, r), x.t(), dlow, scale, true, Threads::All);
}
