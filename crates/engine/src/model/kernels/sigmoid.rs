//! The logistic function.

use candle_core::{CpuStorage, CustomOp1, CustomOp2, Layout, Result, Shape, Tensor};

use super::rows::{f32s, fused, map_row_pairs, map_rows};
use crate::simd::logistic;

/// `1 / (1 + e^{−x})`. The backward pass is `dy·y·(1 − y)` from the output, so an overflowed
/// `e^{−x}` never meets a zero gradient. The composite form is `½ + ½·tanh(x/2)` for the same
/// reason.
pub fn sigmoid(x: &Tensor) -> Result<Tensor> {
    if fused(x) {
        return x.contiguous()?.apply_op1(Sigmoid);
    }
    sigmoid_composite(x)
}

fn sigmoid_composite(x: &Tensor) -> Result<Tensor> {
    (x * 0.5)?.tanh()?.affine(0.5, 0.5)
}

struct Sigmoid;

impl CustomOp1 for Sigmoid {
    fn name(&self) -> &'static str {
        "sigmoid"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let width = layout.dims().last().copied().unwrap_or(1).max(1);
        let out =
            map_rows(f32s(storage, layout)?, width, |_, x, y| y.iter_mut().zip(x).for_each(|(y, x)| *y = logistic(*x)));
        Ok((CpuStorage::F32(out), layout.shape().clone()))
    }

    fn bwd(&self, _x: &Tensor, y: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(y.apply_op2_no_bwd(&grad.contiguous()?, &SigmoidBackward)?))
    }
}

struct SigmoidBackward;

impl CustomOp2 for SigmoidBackward {
    fn name(&self) -> &'static str {
        "sigmoid-backward"
    }

    fn cpu_fwd(&self, ys: &CpuStorage, yl: &Layout, gs: &CpuStorage, gl: &Layout) -> Result<(CpuStorage, Shape)> {
        let width = yl.dims().last().copied().unwrap_or(1).max(1);
        let out = map_row_pairs(f32s(ys, yl)?, f32s(gs, gl)?, width, |_, y, dy, dx| {
            dx.iter_mut().zip(y.iter().zip(dy)).for_each(|(dx, (y, dy))| *dx = dy * y * (1.0 - y));
        });
        Ok((CpuStorage::F32(out), yl.shape().clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;

    #[test]
    fn fused_sigmoid_matches_the_composite_ops_far_into_both_tails() {
        let (x, probe) = (random(&[3, 7], 17), random(&[3, 7], 18));
        let x = (x * 30.0).unwrap();
        let fused = value_and_grad(&x, &probe, |x| sigmoid(x).unwrap());
        let composite = value_and_grad(&x, &probe, |x| sigmoid_composite(x).unwrap());
        assert_same("sigmoid", fused, composite);
    }
}
