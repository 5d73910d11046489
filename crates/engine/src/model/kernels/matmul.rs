//! `x·W` with `W` frozen: the backward forms `dY·Wᵀ` and no weight gradient (candle's own matmul
//! forms both operands' gradients, even for a tensor no gradient is asked of).

use candle_core::backend::BackendStorage;
use candle_core::{bail, CpuStorage, CudaStorage, CustomOp1, Layout, MetalStorage, Result, Shape, Storage, Tensor};

/// `x·W` for a frozen `W` (any strides the backend's matmul takes, e.g. a transposed view): `[k, n]`
/// for every row of `x […, k]`, or batched, `[…, k, n]` for `x […, m, k]` with the same leading
/// axes (the confidence head's probes over each row's own hidden cells). The backward returns
/// `dY·Wᵀ` for `x` and nothing else.
pub fn frozen_matmul(x: &Tensor, weight: &Tensor) -> Result<Tensor> {
    x.contiguous()?.apply_op1(FrozenMatmul { weight: weight.clone() })
}

struct FrozenMatmul {
    weight: Tensor,
}

impl FrozenMatmul {
    fn forward<S: BackendStorage>(&self, x: &S, x_layout: &Layout, w: &S, w_layout: &Layout) -> Result<(S, Shape)> {
        let (dims, w_dims) = (x_layout.dims(), w_layout.dims());
        let (rank, w_rank) = (dims.len(), w_dims.len());
        let k = *dims.last().unwrap_or(&0);
        let (w_k, n) = match w_dims {
            [.., w_k, n] => (*w_k, *n),
            _ => bail!("frozen matmul: the weight {w_dims:?} is not a matrix"),
        };
        if k != w_k {
            bail!("frozen matmul: input width {k} but the weight is {w_dims:?}");
        }
        let out = if w_rank == 2 {
            let m = x_layout.shape().elem_count() / k.max(1);
            let rows = Layout::contiguous_with_offset((m, k), x_layout.start_offset());
            x.matmul(w, (1, m, n, k), &rows, w_layout)?
        } else if w_rank == rank && dims[..rank - 2] == w_dims[..rank - 2] {
            let batch = dims[..rank - 2].iter().product();
            x.matmul(w, (batch, dims[rank - 2], n, k), x_layout, w_layout)?
        } else {
            bail!("frozen matmul: the input {dims:?} does not batch with the weight {w_dims:?}");
        };
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
        // Batched: a weight per leading index, straight or a transposed view.
        let (x, w, probe) = (random(&[2, 3, 4, 8], 5), random(&[2, 3, 8, 5], 6), random(&[2, 3, 4, 5], 7));
        let fused = value_and_grad(&x, &probe, |x| frozen_matmul(x, &w).unwrap());
        let composite = value_and_grad(&x, &probe, |x| x.matmul(&w).unwrap());
        assert_same("batched frozen matmul", fused, composite);
        let wt = random(&[2, 3, 5, 8], 8);
        let fused = value_and_grad(&x, &probe, |x| frozen_matmul(x, &wt.transpose(2, 3).unwrap()).unwrap());
        let composite = value_and_grad(&x, &probe, |x| x.matmul(&wt.transpose(2, 3).unwrap()).unwrap());
        assert_same("batched frozen matmul by a transposed view", fused, composite);
        assert!(frozen_matmul(&x, &random(&[3, 2, 8, 5], 9)).is_err(), "leading axes that differ");
    }
}
