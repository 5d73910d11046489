//! `x·W` with `W` frozen: the backward forms `dY·Wᵀ` and no weight gradient.

use candle_core::backend::BackendStorage;
use candle_core::{bail, CpuStorage, CudaStorage, CustomOp1, Layout, MetalStorage, Result, Shape, Storage, Tensor};

/// `x·W` for a frozen `W` `[k, n]` (any strides, e.g. a transposed view): the backward returns
/// `dY·Wᵀ` for `x` and nothing else. `x` is `[…, k]`.
pub fn frozen_matmul(x: &Tensor, weight: &Tensor) -> Result<Tensor> {
    x.contiguous()?.apply_op1(FrozenMatmul { weight: weight.clone() })
}

struct FrozenMatmul {
    weight: Tensor,
}

impl FrozenMatmul {
    fn forward<S: BackendStorage>(&self, x: &S, x_layout: &Layout, w: &S, w_layout: &Layout) -> Result<(S, Shape)> {
        let dims = x_layout.dims();
        let k = *dims.last().unwrap_or(&0);
        let (w_k, n) = w_layout.shape().dims2()?;
        if k != w_k {
            bail!("frozen matmul: input width {k} but the weight is {w_k}×{n}");
        }
        let m = x_layout.shape().elem_count() / k.max(1);
        let rows = Layout::contiguous_with_offset((m, k), x_layout.start_offset());
        let out = x.matmul(w, (1, m, n, k), &rows, w_layout)?;
        let mut shape = dims.to_vec();
        *shape.last_mut().expect("x has a last axis") = n;
        Ok((out, Shape::from(shape)))
    }
}

impl CustomOp1 for FrozenMatmul {
    fn name(&self) -> &'static str {
        "frozen-matmul"
    }

    fn cpu_fwd(&self, x: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let (storage, w_layout) = self.weight.storage_and_layout();
        let Storage::Cpu(w) = &*storage else { bail!("frozen matmul: the weight is on another device") };
        self.forward(x, layout, w, w_layout)
    }

    fn cuda_fwd(&self, x: &CudaStorage, layout: &Layout) -> Result<(CudaStorage, Shape)> {
        let (storage, w_layout) = self.weight.storage_and_layout();
        let Storage::Cuda(w) = &*storage else { bail!("frozen matmul: the weight is on another device") };
        self.forward(x, layout, w, w_layout)
    }

    fn metal_fwd(&self, x: &MetalStorage, layout: &Layout) -> Result<(MetalStorage, Shape)> {
        let (storage, w_layout) = self.weight.storage_and_layout();
        let Storage::Metal(w) = &*storage else { bail!("frozen matmul: the weight is on another device") };
        self.forward(x, layout, w, w_layout)
    }

    fn bwd(&self, _x: &Tensor, _y: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(frozen_matmul(grad, &self.weight.t()?)?))
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;

    #[test]
    fn frozen_matmul_matches_matmul_and_passes_only_the_input_gradient() {
        let (x, w, probe) = (random(&[2, 3, 8], 1), random(&[8, 5], 2), random(&[2, 3, 5], 3));
        let fused = value_and_grad(&x, &probe, |x| frozen_matmul(x, &w).unwrap());
        let composite = value_and_grad(&x, &probe, |x| x.broadcast_matmul(&w).unwrap());
        assert_same("frozen matmul", fused, composite);
        let wt = random(&[5, 8], 4);
        let fused = value_and_grad(&x, &probe, |x| frozen_matmul(x, &wt.t().unwrap()).unwrap());
        let composite = value_and_grad(&x, &probe, |x| x.broadcast_matmul(&wt.t().unwrap()).unwrap());
        assert_same("frozen matmul by a transposed view", fused, composite);
    }
}
