//! The weights of Needle 3's MLP (3.x's `HadamardMLP`): each Monarch transform's two Kronecker
//! factors, the diagonals, the rank-8 conditioning and the two fixed permutations between the
//! transforms, which the reference draws from NumPy's generator and the `.cact` v3 stores (computed
//! in `san/monarch.rs` and `fast/monarch.rs`).

use candle_core::Tensor;
use rand_mt::Mt;

use crate::config::ModelConfig;
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
    pub(in crate::model) d_model: usize,
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
}

/// The factor sizes of a width-`n` transform (the reference's `_hada_blocks`): `a` the power of two
/// of half `n`'s bits, `b = n / a`.
fn kronecker_blocks(n: usize) -> (usize, usize) {
    let bits = usize::BITS - n.saturating_sub(1).leading_zeros();
    let a = 1 << (bits / 2);
    (a, n / a)
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
}
