//! Rotary position embedding and the scaled causal softmax of attention.

use std::sync::Arc;

use candle_core::{bail, CpuStorage, CustomOp1, CustomOp2, Device, Layout, Result, Shape, Tensor, D};

use super::rows::{f32s, fused, map_row_pairs, map_rows};
use crate::simd::{dot, exp};

/// Rotates `x` `[B, H, T, head_dim]` by the angles whose `cos`/`sin` are `[T, head_dim/2]`: halves
/// `(x1, x2)` become `(x1·cos − x2·sin, x2·cos + x1·sin)`. The backward rotates the gradient back.
/// `tables` are the same tables on the host, for the CPU kernel.
pub fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor, tables: Option<&Arc<RopeTables>>) -> Result<Tensor> {
    match tables {
        Some(tables) if fused(x) => x.contiguous()?.apply_op1(Rope { tables: Arc::clone(tables), inverse: false }),
        _ => rope_composite(x, cos, sin),
    }
}

fn rope_composite(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let half = x.dim(3)? / 2;
    let (x1, x2) = (x.narrow(3, 0, half)?, x.narrow(3, half, half)?);
    let first = (x1.broadcast_mul(cos)? - x2.broadcast_mul(sin)?)?;
    let second = (x2.broadcast_mul(cos)? + x1.broadcast_mul(sin)?)?;
    Tensor::cat(&[first, second], 3)
}

/// The positions a decoding run's rotary tables start with: a typical prompt and its answer.
pub const DECODE_ROPE_START: usize = 512;

/// `cos` and `sin` of every (position, frequency), row-major `[T, head_dim/2]`.
#[derive(Debug)]
pub struct RopeTables {
    pub cos: Vec<f32>,
    pub sin: Vec<f32>,
}

impl RopeTables {
    /// Angles `t · θ^(-2i/head_dim)` for positions `0..seq_len`, computed as the reference does:
    /// frequencies and products in f32 (the f32 rounding of a large angle changes its cosine
    /// visibly), trig of that f32 angle.
    pub fn new(head_dim: usize, seq_len: usize, theta: f64) -> Self {
        let freqs: Vec<f32> =
            (0..head_dim).step_by(2).map(|i| (1.0 / theta.powf(i as f64 / head_dim as f64)) as f32).collect();
        let angles: Vec<f32> = (0..seq_len).flat_map(|t| freqs.iter().map(move |f| t as f32 * f)).collect();
        let table = |trig: fn(f64) -> f64| -> Vec<f32> { angles.iter().map(|&a| trig(a as f64) as f32).collect() };
        Self { cos: table(f64::cos), sin: table(f64::sin) }
    }

    /// How many positions a decoding run's tables hold once they must reach `needed`, when they
    /// hold `held`: twice as many each time they grow (so a run rebuilds them a few times, not at
    /// every step), at least [`DECODE_ROPE_START`], and no more than the model's `max_seq_len`
    /// unless `needed` is more. Sized by what is decoded, never by `max_seq_len` alone, which a
    /// config may set to millions.
    pub fn decode_capacity(held: usize, needed: usize, max_seq_len: usize) -> usize {
        if needed <= held {
            return held;
        }
        needed.max(held.saturating_mul(2)).max(DECODE_ROPE_START).min(max_seq_len.max(needed))
    }

    /// One head's row `x` at `position` rotated into `y` (by the negated angles when `inverse`,
    /// which is the backward pass): halves `(x1, x2)` become `(x1·cos − x2·sin, x2·cos + x1·sin)`.
    #[inline(always)]
    pub(crate) fn rotate(&self, position: usize, x: &[f32], y: &mut [f32], inverse: bool) {
        let half = x.len() / 2;
        let at = position * half;
        let (cos, sin) = (&self.cos[at..at + half], &self.sin[at..at + half]);
        let sign = if inverse { -1.0 } else { 1.0 };
        let (x1, x2) = x.split_at(half);
        let (y1, y2) = y.split_at_mut(half);
        for i in 0..half {
            let (c, s) = (cos[i], sign * sin[i]);
            y1[i] = x1[i] * c - x2[i] * s;
            y2[i] = x2[i] * c + x1[i] * s;
        }
    }
}

struct Rope {
    tables: Arc<RopeTables>,
    /// Rotate by the negated angles (the backward pass).
    inverse: bool,
}

impl CustomOp1 for Rope {
    fn name(&self) -> &'static str {
        "rope"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let (_, _, t, head_dim) = layout.shape().dims4()?;
        let half = head_dim / 2;
        if self.tables.cos.len() != t * half {
            bail!("rope: tables for {} angles, rows of {t} × {half}", self.tables.cos.len());
        }
        let out =
            map_rows(f32s(storage, layout)?, head_dim, |row, x, y| self.tables.rotate(row % t, x, y, self.inverse));
        Ok((CpuStorage::F32(out), layout.shape().clone()))
    }

    fn bwd(&self, _x: &Tensor, _y: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        let inverse = Rope { tables: Arc::clone(&self.tables), inverse: !self.inverse };
        Ok(Some(grad.contiguous()?.apply_op1_no_bwd(&inverse)?))
    }
}

// Causal softmax

/// `softmax(scale · scores + causal)` over the last axis of `[…, T, T]` scores, the mask implicit:
/// query row q sees keys 0..=q, or with a `window` only the last `window` of them. The composite
/// form adds `causal` (`[1, 1, T, T]`, 0 / −∞), which must say the same.
pub fn causal_softmax(scores: &Tensor, scale: f64, causal: &Tensor, window: Option<usize>) -> Result<Tensor> {
    // The fused kernel's implicit mask is the square one; a decoding step's queries sit at the end
    // of a longer key range, which `causal` describes.
    let square = scores.rank() >= 2 && scores.dim(D::Minus1)? == scores.dim(D::Minus2)?;
    if fused(scores) && square {
        return scores.contiguous()?.apply_op1(CausalSoftmax { scale: scale as f32, window });
    }
    causal_softmax_composite(scores, scale, causal)
}

fn causal_softmax_composite(scores: &Tensor, scale: f64, causal: &Tensor) -> Result<Tensor> {
    let masked = (scores * scale)?.broadcast_add(causal)?;
    let last = masked.rank() - 1;
    let e = masked.broadcast_sub(&masked.max_keepdim(last)?.detach())?.exp()?;
    e.broadcast_div(&e.sum_keepdim(last)?)
}

struct CausalSoftmax {
    scale: f32,
    window: Option<usize>,
}

impl CustomOp1 for CausalSoftmax {
    fn name(&self) -> &'static str {
        "causal-softmax"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let t = layout.dims().last().copied().unwrap_or(1);
        let out = map_rows(f32s(storage, layout)?, t, |row, x, o| {
            let end = row % t + 1;
            let seen = self.window.map_or(0, |w| end.saturating_sub(w))..end;
            let (x, o) = (&x[seen.clone()], &mut o[seen]);
            let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut sum = 0f32;
            for (o, x) in o.iter_mut().zip(x) {
                *o = exp((x - max) * self.scale);
                sum += *o;
            }
            o.iter_mut().for_each(|o| *o /= sum);
        });
        Ok((CpuStorage::F32(out), layout.shape().clone()))
    }

    fn bwd(&self, _x: &Tensor, y: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(y.apply_op2_no_bwd(&grad.contiguous()?, &SoftmaxBackward { scale: self.scale })?))
    }
}

/// `dx = scale · y ⊙ (dy − Σ y⊙dy)` per row.
struct SoftmaxBackward {
    scale: f32,
}

impl CustomOp2 for SoftmaxBackward {
    fn name(&self) -> &'static str {
        "softmax-backward"
    }

    fn cpu_fwd(&self, ys: &CpuStorage, yl: &Layout, gs: &CpuStorage, gl: &Layout) -> Result<(CpuStorage, Shape)> {
        let width = yl.dims().last().copied().unwrap_or(1);
        let out = map_row_pairs(f32s(ys, yl)?, f32s(gs, gl)?, width, |_, y, dy, dx| {
            let through = dot(y, dy);
            dx.iter_mut().zip(y.iter().zip(dy)).for_each(|(dx, (y, g))| *dx = self.scale * y * (g - through));
        });
        Ok((CpuStorage::F32(out), yl.shape().clone()))
    }
}

/// `[1, 1, T, past + T]`: the additive mask (0 / −∞) of `T` queries after `past` earlier
/// positions they all see; query q sees keys up to `past + q` (within `window` of it, when given),
/// so no softmax row is all −∞.
pub fn causal_bias_after(past: usize, new: usize, window: Option<usize>, device: &Device) -> Result<Tensor> {
    let keys = past + new;
    let seen = |q: usize, k: usize| k <= past + q && window.is_none_or(|w| past + q - k < w);
    let bias: Vec<f32> =
        (0..new).flat_map(|q| (0..keys).map(move |k| if seen(q, k) { 0.0 } else { f32::NEG_INFINITY })).collect();
    Tensor::from_vec(bias, (1, 1, new, keys), device)
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;
    use candle_core::Device;

    #[test]
    fn fused_rope_and_causal_softmax_match_the_composite_ops() {
        let (x, probe) = (random(&[2, 3, 5, 8], 27), random(&[2, 3, 5, 8], 28));
        let (cos, sin) = (random(&[5, 4], 29), random(&[5, 4], 30));
        let tables = Arc::new(RopeTables {
            cos: cos.flatten_all().unwrap().to_vec1().unwrap(),
            sin: sin.flatten_all().unwrap().to_vec1().unwrap(),
        });
        let fused = value_and_grad(&x, &probe, |x| rope(x, &cos, &sin, Some(&tables)).unwrap());
        let composite = value_and_grad(&x, &probe, |x| rope_composite(x, &cos, &sin).unwrap());
        assert_same("rope", fused, composite);

        let (scores, probe) = (random(&[2, 3, 5, 5], 10), random(&[2, 3, 5, 5], 11));
        for window in [None, Some(1), Some(3), Some(5)] {
            let causal = causal_bias_after(0, 5, window, &Device::Cpu).unwrap();
            let fused = value_and_grad(&scores, &probe, |s| causal_softmax(s, 0.7, &causal, window).unwrap());
            let composite = value_and_grad(&scores, &probe, |s| causal_softmax_composite(s, 0.7, &causal).unwrap());
            assert_same(&format!("causal softmax, window {window:?}"), fused, composite);
        }
    }
}
