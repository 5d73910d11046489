//! Needle 3's MLP (3.x's `HadamardMLP`): Needle 2's fixed Walsh rotations become learned Monarch
//! transforms — each the Kronecker product of two small factors — with fixed permutations between
//! them and a rank-8 conditioning of the middle gain:
//!
//! `z = M₁(d₁ ⊙ x)[p₁]`, `z = M₂(silu(d₂ ⊙ cond ⊙ z + b₂))[p₂]`, `out = d₄ ⊙ M₃(d₃ ⊙ z)`, with
//! `cond = 1 + softmax(x·V)·U` and `x` zero-padded to the transforms' power-of-two width.

use candle_core::{Tensor, D};

use crate::model::kernels::frozen_matmul;
use crate::model::weights::monarch::MonarchMlp;
use crate::model::Result;

impl MonarchMlp {
    /// `x` `[N, d_model]` → `[N, d_model]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (rows, n) = (x.dim(0)?, self.d1.dim(0)?);
        let cond = (softmax(&frozen_matmul(x, &self.cond_v)?)?.matmul(&self.cond_u)? + 1.0)?;
        let z = match n - self.d_model {
            0 => x.clone(),
            pad => Tensor::cat(&[x, &Tensor::zeros((rows, pad), x.dtype(), x.device())?], 1)?,
        };
        let z = kronecker(&z.broadcast_mul(&self.d1)?, &self.factors[0])?.index_select(&self.perms[0], 1)?;
        let gated = z.broadcast_mul(&self.d2)?.mul(&cond)?.broadcast_add(&self.b2)?.silu()?;
        let z = kronecker(&gated, &self.factors[1])?.index_select(&self.perms[1], 1)?;
        let z = kronecker(&z.broadcast_mul(&self.d3)?, &self.factors[2])?;
        Ok(z.broadcast_mul(&self.d4)?.narrow(1, 0, self.d_model)?)
    }
}

/// `z` `[N, a·b]` through `A ⊗ B`: each row as an `a × b` matrix `Z` becomes `Aᵀ·Z·B`.
fn kronecker(z: &Tensor, (a, b): &(Tensor, Tensor)) -> Result<Tensor> {
    let (rows, n) = z.dims2()?;
    let (ka, kb) = (a.dim(0)?, b.dim(0)?);
    let zb = frozen_matmul(&z.reshape((rows * ka, kb))?, b)?;
    let zt = zb.reshape((rows, ka, kb))?.transpose(1, 2)?.contiguous()?.reshape((rows * kb, ka))?;
    let out = frozen_matmul(&zt, a)?.reshape((rows, kb, ka))?.transpose(1, 2)?;
    Ok(out.contiguous()?.reshape((rows, n))?)
}

fn softmax(x: &Tensor) -> Result<Tensor> {
    let shifted = x.broadcast_sub(&x.max_keepdim(D::Minus1)?)?.exp()?;
    Ok(shifted.broadcast_div(&shifted.sum_keepdim(D::Minus1)?)?)
}

#[cfg(test)]
mod tests {
    use candle_core::Device;

    use super::*;

    #[test]
    fn the_kronecker_product_acts_as_its_dense_matrix() {
        let device = Device::Cpu;
        let a = Tensor::new(&[[1f32, 2.0], [3.0, 4.0]], &device).unwrap();
        let b = Tensor::new(&[[0f32, 1.0, 2.0], [1.0, 0.0, -1.0], [2.0, 1.0, 0.5]], &device).unwrap();
        let z = Tensor::new(&[[1f32, -2.0, 0.5, 3.0, 1.0, -1.0]], &device).unwrap();
        // (A ⊗ B)[i·3 + j, k·3 + l] = A[i, k]·B[j, l], applied as z·(A ⊗ B).
        let (av, bv) = (a.to_vec2::<f32>().unwrap(), b.to_vec2::<f32>().unwrap());
        let dense: Vec<f32> = (0..6)
            .flat_map(|r| {
                let (av, bv) = (&av, &bv);
                (0..6).map(move |c| av[r / 3][c / 3] * bv[r % 3][c % 3])
            })
            .collect();
        let want = z.matmul(&Tensor::from_vec(dense, (6, 6), &device).unwrap()).unwrap();
        let got = kronecker(&z, &(a, b)).unwrap();
        assert_eq!(got.to_vec2::<f32>().unwrap(), want.to_vec2::<f32>().unwrap());
    }
}
