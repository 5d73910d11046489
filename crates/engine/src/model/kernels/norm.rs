//! RMS normalisation with an optional frozen gain.

use candle_core::{bail, CpuStorage, CustomOp1, CustomOp2, Layout, Result, Shape, Tensor, D};

use super::rows::{f32s, fused, map_row_pairs, map_rows};
use crate::simd::dot;

/// RMSNorm's ε, as the reference's `ZCRMSNorm` and `rms_unit` use it.
const RMS_EPSILON: f32 = 1e-6;

/// `gain · x / sqrt(mean(x²) + ε)` over the last axis; `gain` (`[width]`, frozen) may be absent.
pub fn rms_norm(x: &Tensor, gain: Option<&Tensor>) -> Result<Tensor> {
    if fused(x) {
        let gain = match gain {
            Some(g) => g.to_vec1::<f32>()?,
            None => vec![1.0; x.dim(D::Minus1)?],
        };
        return x.contiguous()?.apply_op1(RmsNorm { gain });
    }
    rms_norm_composite(x, gain)
}

fn rms_norm_composite(x: &Tensor, gain: Option<&Tensor>) -> Result<Tensor> {
    let rms = (x.sqr()?.mean_keepdim(D::Minus1)? + f64::from(RMS_EPSILON))?.sqrt()?;
    let unit = x.broadcast_div(&rms)?;
    match gain {
        Some(gain) => unit.broadcast_mul(gain),
        None => Ok(unit),
    }
}

struct RmsNorm {
    /// Ones when the norm has no gain.
    gain: Vec<f32>,
}

/// `1 / sqrt(mean(x²) + ε)` of one row.
#[inline(always)]
pub(crate) fn inverse_rms(x: &[f32]) -> f32 {
    let mean_square = dot(x, x) / x.len() as f32;
    1.0 / (mean_square + RMS_EPSILON).sqrt()
}

/// `o = gain · x / rms(x)` of one row.
#[inline(always)]
pub(crate) fn rms_norm_row(x: &[f32], gain: &[f32], o: &mut [f32]) {
    let r = inverse_rms(x);
    o.iter_mut().zip(x.iter().zip(gain)).for_each(|(o, (x, g))| *o = x * r * g);
}

/// `dx = r·(g⊙dy − x̂·mean(g⊙dy⊙x̂))` with `x̂ = r·x`: the input gradient of [`rms_norm_row`].
#[inline(always)]
pub(crate) fn rms_norm_backward_row(x: &[f32], gain: &[f32], dy: &[f32], dx: &mut [f32]) {
    let r = inverse_rms(x);
    dx.iter_mut().zip(dy.iter().zip(gain)).for_each(|(dx, (dy, g))| *dx = dy * g);
    let scale = dot(dx, x) * r * r / x.len() as f32;
    dx.iter_mut().zip(x).for_each(|(dx, x)| *dx = r * (*dx - x * scale));
}

impl CustomOp1 for RmsNorm {
    fn name(&self) -> &'static str {
        "rms-norm"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let width = layout.dims().last().copied().unwrap_or(1);
        if self.gain.len() != width {
            bail!("rms norm: a gain of {} for rows of {width}", self.gain.len());
        }
        let out = map_rows(f32s(storage, layout)?, width, |_, x, o| rms_norm_row(x, &self.gain, o));
        Ok((CpuStorage::F32(out), layout.shape().clone()))
    }

    fn bwd(&self, x: &Tensor, _y: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        let backward = RmsNormBackward { gain: self.gain.clone() };
        Ok(Some(x.apply_op2_no_bwd(&grad.contiguous()?, &backward)?))
    }
}

/// The input gradient, row by row ([`rms_norm_backward_row`]).
struct RmsNormBackward {
    gain: Vec<f32>,
}

impl CustomOp2 for RmsNormBackward {
    fn name(&self) -> &'static str {
        "rms-norm-backward"
    }

    fn cpu_fwd(&self, xs: &CpuStorage, xl: &Layout, gs: &CpuStorage, gl: &Layout) -> Result<(CpuStorage, Shape)> {
        let width = xl.dims().last().copied().unwrap_or(1);
        let out = map_row_pairs(f32s(xs, xl)?, f32s(gs, gl)?, width, |_, x, dy, dx| {
            rms_norm_backward_row(x, &self.gain, dy, dx)
        });
        Ok((CpuStorage::F32(out), xl.shape().clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;

    #[test]
    fn fused_rms_norm_matches_the_composite_ops() {
        let (x, probe, gain) = (random(&[2, 4, 12], 7), random(&[2, 4, 12], 8), random(&[12], 9));
        for g in [None, Some(&gain)] {
            let fused = value_and_grad(&x, &probe, |x| rms_norm(x, g).unwrap());
            let composite = value_and_grad(&x, &probe, |x| rms_norm_composite(x, g).unwrap());
            assert_same("rms norm", fused, composite);
        }
    }
}
