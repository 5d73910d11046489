//! Needle 3's MLP (3.x's `HadamardMLP`): Needle 2's fixed Walsh rotations become learned Monarch
//! transforms — each the Kronecker product of two small factors — with fixed permutations between
//! them and a rank-8 conditioning of the middle gain:
//!
//! `z = M₁(d₁ ⊙ x)[p₁]`, `z = M₂(silu(d₂ ⊙ cond ⊙ z + b₂))[p₂]`, `out = d₄ ⊙ M₃(d₃ ⊙ z)`, with
//! `cond = 1 + softmax(x·V)·U` and `x` zero-padded to the transforms' power-of-two width.

use candle_core::{Tensor, D};
use rand_mt::Mt;

use crate::config::ModelConfig;
use crate::model::kernels::frozen_matmul;
use crate::model::params::ParamPath;
use crate::model::Result;

/// Rank of the conditioning (the reference's `HADA_COND_RANK`).
pub(in crate::model) const COND_RANK: usize = 8;
/// Seeds of the two permutations (the reference's `_HADA_PERM_SEEDS`); a split permutation seeds
/// its second half with `seed + SPLIT_SEED_OFFSET`.
const PERM_SEEDS: [u32; 2] = [11, 13];
const SPLIT_SEED_OFFSET: u32 = 977;

#[derive(Debug, Clone)]
pub struct MonarchMlp {
    d_model: usize,
    /// Each transform's two Kronecker factors, `[a, a]` and `[b, b]` with `a·b` the width.
    pub(in crate::model) factors: [(Tensor, Tensor); 3],
    pub(in crate::model) d1: Tensor,
    pub(in crate::model) d2: Tensor,
    pub(in crate::model) b2: Tensor,
    pub(in crate::model) d3: Tensor,
    pub(in crate::model) d4: Tensor,
    pub(in crate::model) cond_v: Tensor,
    pub(in crate::model) cond_u: Tensor,
    pub(in crate::model) perms: [Tensor; 2],
}

impl MonarchMlp {
    pub fn new(cfg: &ModelConfig, vb: ParamPath) -> Result<Self> {
        let (d, n) = (cfg.d_model, cfg.hadamard_width());
        let (a, b) = kronecker_blocks(n);
        let factor = |s: usize| -> Result<(Tensor, Tensor)> {
            Ok((vb.get(&[a, a], &format!("w{s}a"))?, vb.get(&[b, b], &format!("w{s}b"))?))
        };
        let [p1, p2] = permutations(cfg).map(|perm| Tensor::from_vec(perm, n, vb.device()));
        Ok(Self {
            d_model: d,
            factors: [factor(1)?, factor(2)?, factor(3)?],
            d1: vb.get(&[n], "d1")?,
            d2: vb.get(&[n], "d2")?,
            b2: vb.get(&[n], "b2")?,
            d3: vb.get(&[n], "d3")?,
            d4: vb.get(&[n], "d4")?,
            cond_v: vb.get(&[d, COND_RANK], "cond_v")?,
            cond_u: vb.get(&[COND_RANK, n], "cond_u")?,
            perms: [p1?, p2?],
        })
    }

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

/// The factor sizes of a width-`n` transform (the reference's `_hada_blocks`): `a` the power of two
/// of half `n`'s bits, `b = n / a`.
fn kronecker_blocks(n: usize) -> (usize, usize) {
    let bits = usize::BITS - n.saturating_sub(1).leading_zeros();
    let a = 1 << (bits / 2);
    (a, n / a)
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

/// The two permutations a model of `cfg` applies, over the transforms' width (the `.cact` v3
/// stores them as `hada_p1`, `hada_p2`).
pub fn permutations(cfg: &ModelConfig) -> [Vec<u32>; 2] {
    let split = !cfg.ladder_widths.is_empty();
    PERM_SEEDS.map(|seed| permutation(cfg.hadamard_width(), seed, split))
}

/// NumPy's `RandomState(seed).permutation(n)` (a Mersenne Twister and its legacy Fisher–Yates
/// shuffle), or with `split` two halves permuted apart, the second with its own seed, as the
/// reference's `_hada_perms` makes them.
fn permutation(n: usize, seed: u32, split: bool) -> Vec<u32> {
    if split {
        let half = n / 2;
        let mut both = shuffled(half, seed);
        both.extend(shuffled(half, seed + SPLIT_SEED_OFFSET).into_iter().map(|i| i + half as u32));
        return both;
    }
    shuffled(n, seed)
}

/// `RandomState(seed).permutation(n)`: `arange(n)` shuffled from the last position down, each
/// swapped with a uniform index at or before it drawn by rejection under a bit mask.
fn shuffled(n: usize, seed: u32) -> Vec<u32> {
    let mut mt = Mt::new(seed);
    let mut items: Vec<u32> = (0..n as u32).collect();
    for i in (1..n).rev() {
        let bound = i as u32;
        let mask = u32::MAX >> bound.leading_zeros();
        let j = loop {
            let draw = mt.next_u32() & mask;
            if draw <= bound {
                break draw;
            }
        };
        items.swap(i, j as usize);
    }
    items
}

#[cfg(test)]
mod tests {
    use candle_core::Device;

    use super::*;

    #[test]
    fn permutations_are_numpys() {
        // Printed by the reference: `_hada_perms(64)` and `_hada_perms(64, split=True)`, and the tail of
        // `np.random.RandomState(11).permutation(1000)`.
        assert_eq!(permutation(64, 11, false)[..12], [9, 46, 26, 40, 51, 54, 43, 58, 50, 2, 19, 22]);
        assert_eq!(permutation(64, 13, false)[..12], [60, 36, 4, 15, 27, 0, 50, 31, 54, 30, 23, 6]);
        let split = permutation(64, 11, true);
        assert_eq!(
            (split[..6].to_vec(), split[32..38].to_vec()),
            (vec![8, 6, 15, 9, 14, 19], vec![43, 47, 50, 45, 34, 54])
        );
        assert_eq!(permutation(64, 13, true)[32..38], [42, 57, 35, 43, 41, 49]);
        assert_eq!(permutation(1000, 11, false)[995..], [337, 91, 80, 703, 921]);
    }

    #[test]
    fn kronecker_blocks_are_the_references() {
        for (n, blocks) in [(64, (8, 8)), (128, (8, 16)), (1024, (32, 32)), (32, (4, 8)), (1, (1, 1))] {
            assert_eq!(kronecker_blocks(n), blocks, "{n}");
        }
    }

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
