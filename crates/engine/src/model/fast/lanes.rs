//! The mHC lane mix of one layer ([`crate::model::san::stack`]'s `LaneMix`), forward and
//! backward by hand: each token's lanes, RMS-normalised into `x̂` (and under QAT fake-quantized as
//! the runtime's int8 activations), give the gate logits `a·(x̂·Φ) + b`; the `pre` gates read the
//! block's input `u = Σᵢ h_pre[i]·Xᵢ`, the `post` gates spread its update over the lanes, and the
//! Sinkhorn-normalised `res` logits mix the lanes.
//!
//! The products `x̂·Φ` (and their backward `dZ·Φᵀ`) run over every token at once; the gates, the
//! Sinkhorn iterations and the mixing run per token inside the layer's token loops.

use std::sync::Arc;

use candle_core::Result;
use rayon::prelude::*;

use super::mat::{matmul, Mat, MatMut, Threads};
use super::pass::Dims;
use crate::model::kernels::{fake_quant_row, inverse_rms, sinkhorn_backward_row, sinkhorn_row};
use crate::model::qat::Qat;
use crate::model::weights::stack::{LaneMix, SINKHORN_ITERS};
use crate::simd::{dot, logistic, widest};
use crate::w4a8::{Activations, LaneCodes};

/// The gate projections `Φ`, as the layer multiplies them.
#[derive(Debug, Clone)]
enum Phi {
    /// `[Φ_pre | Φ_post | Φ_res]` `[n·d, 2n + n²]`: the three families side by side, copied once
    /// (a few hundred kB a layer), so that one product reads `x̂` for all of them, and one writes
    /// its gradient.
    Float(Vec<f32>),
    /// Under W4A8, the three families' CQ codes, multiplied on the integer kernels with `x̂`
    /// quantized once for the three (forward only).
    Codes(LaneCodes),
}

/// One layer's lane gates on the host.
#[derive(Debug, Clone)]
pub(super) struct Lanes {
    phi: Phi,
    /// `a_pre`, `a_post`, `a_res`.
    a: [f32; 3],
    bias_pre: Vec<f32>,
    bias_post: Vec<f32>,
    b_res: Vec<f32>,
    qat: Option<Qat>,
}

/// Per-token scratch rows of the gates.
pub(super) struct LaneScratch {
    /// The gates of one token: pre, post, then the res logits (before Sinkhorn).
    pub(super) gates: Vec<f32>,
    hres: Vec<f32>,
    dres: Vec<f32>,
    /// The Sinkhorn iterations' matrices.
    sinkhorn: Vec<f32>,
}

impl LaneScratch {
    pub(super) fn new(lanes: usize) -> Self {
        let n = lanes;
        Self { gates: vec![0.0; 2 * n + n * n], hres: vec![0.0; n * n], dres: vec![0.0; n * n], sinkhorn: Vec::new() }
    }
}

impl Lanes {
    /// The lane gates of `mix`, their projections multiplied from `codes` (W4A8) when given: the
    /// float `Φ` is then never read (it may be a placeholder).
    pub(super) fn new(mix: &LaneMix, codes: Option<&LaneCodes>) -> crate::model::Result<Self> {
        let scalar = |t: &candle_core::Tensor| t.to_scalar::<f32>();
        let phi = match codes {
            Some(codes) => Phi::Codes(Arc::clone(codes)),
            None => Phi::Float(
                candle_core::Tensor::cat(&[&mix.phi_pre, &mix.phi_post, &mix.phi_res], 1)?.flatten_all()?.to_vec1()?,
            ),
        };
        Ok(Self {
            phi,
            a: [scalar(&mix.a_pre)?, scalar(&mix.a_post)?, scalar(&mix.a_res)?],
            bias_pre: mix.bias_pre.to_vec1()?,
            bias_post: mix.bias_post.to_vec1()?,
            b_res: mix.b_res.flatten_all()?.to_vec1()?,
            qat: mix.qat,
        })
    }

    /// `Z = x̂·Φ` of every token for the three gate families into `mix` (rows of
    /// [`Dims::mix_width`], the last column each token's inverse RMS), with `unit` `[N, n·d]` a
    /// scratch buffer for `x̂`.
    pub(super) fn logits(&self, dims: &Dims, x: &[f32], unit: &mut [f32], mix: &mut [f32]) -> Result<()> {
        let (t, nd, mw) = (dims.tokens, dims.lanes * dims.d, dims.mix_width());
        // Under W4A8 the products quantize `x̂` themselves, per rotated group.
        let bits = self.qat.filter(|_| matches!(self.phi, Phi::Float(_))).map(|q| q.act_bits);
        (unit.par_chunks_mut(nd), mix.par_chunks_mut(mw), x.par_chunks(nd)).into_par_iter().for_each(|(unit, m, x)| {
            widest(
                #[inline(always)]
                || {
                    let r = inverse_rms(x);
                    m[mw - 1] = r;
                    unit.iter_mut().zip(x).for_each(|(u, x)| *u = x * r);
                    if let Some(bits) = bits {
                        fake_quant_row(unit, bits);
                    }
                },
            )
        });
        match &self.phi {
            Phi::Float(phi) => {
                let dst = MatMut::strided(mix, t, mw - 1, mw);
                matmul(dst, Mat::new(unit, t, nd), Mat::new(phi, nd, mw - 1), 1.0, false, Threads::All);
            }
            Phi::Codes(codes) => {
                let x = Activations::quantize(&unit[..t * nd], t, nd).map_err(candle_core::Error::wrap)?;
                let mut column = 0;
                for family in codes.iter() {
                    let z = family.product(&x).map_err(candle_core::Error::wrap)?;
                    let width = family.out();
                    for (m, z) in mix.chunks_mut(mw).zip(z.chunks_exact(width)) {
                        m[column..column + width].copy_from_slice(z);
                    }
                    column += width;
                }
            }
        }
        Ok(())
    }

    /// The gates of one token from its row of `mix`: `h_pre = σ(a·Z + b)`, `h_post = 2σ(…)`, and
    /// the res logits (before Sinkhorn), into `gates` (pre, post, res).
    #[inline(always)]
    pub(super) fn gates(&self, n: usize, z: &[f32], gates: &mut [f32]) {
        let [a_pre, a_post, a_res] = self.a;
        for i in 0..n {
            gates[i] = logistic(a_pre * z[i] + self.bias_pre[i]);
            gates[n + i] = 2.0 * logistic(a_post * z[n + i] + self.bias_post[i]);
        }
        for k in 0..n * n {
            gates[2 * n + k] = a_res * z[2 * n + k] + self.b_res[k];
        }
    }

    /// The block's input `u = Σᵢ h_pre[i]·Xᵢ` of one token.
    #[inline(always)]
    pub(super) fn read(x: &[f32], h_pre: &[f32], u: &mut [f32]) {
        let d = u.len();
        u.fill(0.0);
        for (lane, &w) in x.chunks(d).zip(h_pre) {
            u.iter_mut().zip(lane).for_each(|(u, x)| *u += w * x);
        }
    }

    /// One token's next lanes `next = h_post ⊗ upd + h_res·x`, from its row of `mix`, its lanes
    /// `x` and its block's update `upd`.
    #[inline(always)]
    pub(super) fn write(&self, m: &[f32], x: &[f32], upd: &[f32], s: &mut LaneScratch, next: &mut [f32]) {
        let (d, n) = (upd.len(), self.bias_pre.len());
        self.gates(n, m, &mut s.gates);
        sinkhorn_row(&s.gates[2 * n..], n, SINKHORN_ITERS, &mut s.hres, &mut s.sinkhorn);
        for (lane, out) in next.chunks_mut(d).enumerate() {
            let h_post = s.gates[n + lane];
            out.iter_mut().zip(upd).for_each(|(o, u)| *o = h_post * u);
            for (j, x_j) in x.chunks(d).enumerate() {
                let w = s.hres[lane * n + j];
                out.iter_mut().zip(x_j).for_each(|(o, x)| *o += w * x);
            }
        }
    }

    /// The backward of [`Lanes::write`] for one token, from the next lanes' gradient `g`: the
    /// update's gradient `dupd`, the post and res logits' gradients (`dl[n..]`), and the mix's
    /// share of the lanes' gradient `dx` (overwritten).
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub(super) fn write_backward(
        &self,
        m: &[f32],
        x: &[f32],
        upd: &[f32],
        g: &[f32],
        s: &mut LaneScratch,
        dupd: &mut [f32],
        dl: &mut [f32],
        dx: &mut [f32],
    ) {
        let (d, n) = (upd.len(), self.bias_pre.len());
        self.gates(n, m, &mut s.gates);
        let logits_res = &s.gates[2 * n..];
        sinkhorn_row(logits_res, n, SINKHORN_ITERS, &mut s.hres, &mut s.sinkhorn);
        dupd.fill(0.0);
        dx.fill(0.0);
        for (lane, g_i) in g.chunks(d).enumerate() {
            let h_post = s.gates[n + lane];
            dupd.iter_mut().zip(g_i).for_each(|(du, g)| *du += h_post * g);
            dl[n + lane] = dot(g_i, upd) * h_post * (1.0 - h_post / 2.0);
            for (j, x_j) in x.chunks(d).enumerate() {
                s.dres[lane * n + j] = dot(g_i, x_j);
                let w = s.hres[lane * n + j];
                dx[j * d..][..d].iter_mut().zip(g_i).for_each(|(dx, g)| *dx += w * g);
            }
        }
        sinkhorn_backward_row(logits_res, &s.dres, n, SINKHORN_ITERS, &mut dl[2 * n..], &mut s.sinkhorn);
    }

    /// The backward of [`Lanes::read`] for one token, from the block input's gradient `du`: the
    /// pre logits' gradients (`dl[..n]`) and `h_pre ⊗ du` added to `dx`; then every logit's
    /// gradient turned into `Z`'s (`dZ = a·dl`, in place).
    #[inline(always)]
    pub(super) fn read_backward(
        &self,
        m: &[f32],
        x: &[f32],
        du: &[f32],
        s: &mut LaneScratch,
        dl: &mut [f32],
        dx: &mut [f32],
    ) {
        let (d, n) = (du.len(), self.bias_pre.len());
        self.gates(n, m, &mut s.gates);
        for (lane, x_l) in x.chunks(d).enumerate() {
            let h_pre = s.gates[lane];
            dl[lane] = dot(du, x_l) * h_pre * (1.0 - h_pre);
            dx[lane * d..][..d].iter_mut().zip(du).for_each(|(dx, du)| *dx += h_pre * du);
        }
        let [a_pre, a_post, a_res] = self.a;
        dl[..n].iter_mut().for_each(|g| *g *= a_pre);
        dl[n..2 * n].iter_mut().for_each(|g| *g *= a_post);
        dl[2 * n..].iter_mut().for_each(|g| *g *= a_res);
    }

    /// The backward of [`Lanes::logits`]: `dZ·Φᵀ` of every token (into `unit`, a scratch buffer)
    /// through the RMS normalisation (and straight through the fake quantization) added to `dx`.
    pub(super) fn logits_backward(
        &self,
        dims: &Dims,
        x: &[f32],
        mix: &[f32],
        dz: &[f32],
        unit: &mut [f32],
        dx: &mut [f32],
    ) -> Result<()> {
        let Phi::Float(phi) = &self.phi else { candle_core::bail!("a W4A8 network's lane gates have no backward") };
        let (t, nd, mw, lw) = (dims.tokens, dims.lanes * dims.d, dims.mix_width(), dims.mix_width() - 1);
        let dz = Mat::new(dz, t, lw);
        matmul(MatMut::new(unit, t, nd), dz, Mat::new(phi, nd, lw).t(), 1.0, false, Threads::All);
        (dx.par_chunks_mut(nd), unit.par_chunks(nd), x.par_chunks(nd), mix.par_chunks(mw)).into_par_iter().for_each(
            |(dx, g, x, m)| {
                widest(
                    #[inline(always)]
                    || {
                        // x̂ = r·x: dx = r·g − r³·⟨g, x⟩/(n·d)·x.
                        let r = m[mw - 1];
                        let coef = dot(g, x) * r * r * r / nd as f32;
                        dx.iter_mut().zip(g.iter().zip(x)).for_each(|(dx, (g, x))| *dx += r * g - coef * x);
                    },
                )
            },
        );
        Ok(())
    }
}
