//! Needle 3's MLP ([`crate::model::san::monarch`]) on one token's row, forward and backward by
//! hand: `z = M₁(d₁ ⊙ x)[p₁]`, `z = M₂(silu(d₂ ⊙ cond ⊙ z + b₂))[p₂]`, `out = d₄ ⊙ M₃(d₃ ⊙ z)`,
//! with `cond = 1 + softmax(x·V)·U` and each `M` a Kronecker product `A ⊗ B` applied to the row
//! seen as an `a × b` matrix `Z` as `Aᵀ·Z·B` (its transpose, for the backward, as `A·Z·Bᵀ`). Every
//! weight is frozen: the backward forms the input's gradient only.

use super::mat::{matmul, Mat, MatMut, Threads};
use crate::config::ModelConfig;
use crate::model::weights::monarch::{MonarchMlp, COND_RANK};
use crate::simd::{dot, exp, logistic};

/// One transform's factors, `A` `[a, a]` and `B` `[b, b]`, and `Bᵀ`: the backward multiplies by
/// it, and gemm took 1.1–1.3 µs for a 32 × 32 product through a transposed view against 0.8–0.9 µs
/// with the transpose laid out (a Zen 4 core).
#[derive(Debug, Clone)]
struct Kronecker {
    a: Vec<f32>,
    b: Vec<f32>,
    b_t: Vec<f32>,
    sizes: (usize, usize),
}

impl Kronecker {
    fn new((a, b): &(candle_core::Tensor, candle_core::Tensor)) -> crate::model::Result<Self> {
        let sizes = (a.dim(0)?, b.dim(0)?);
        let flat = |t: &candle_core::Tensor| t.flatten_all()?.to_vec1::<f32>();
        Ok(Self { a: flat(a)?, b: flat(b)?, b_t: flat(&b.t()?)?, sizes })
    }

    /// `y = M(z)` for the row `z` seen as an `a × b` matrix `Z`: `y = Aᵀ·Z·B`, or the transpose
    /// `y = A·Z·Bᵀ` when `transposed`. `tmp` is a scratch row. Two small products through gemm's
    /// register-blocked kernels: a loop of row updates here waits on its own stores.
    #[inline(always)]
    fn apply(&self, transposed: bool, z: &[f32], tmp: &mut [f32], y: &mut [f32]) {
        let (ka, kb) = self.sizes;
        let a = Mat::new(&self.a, ka, ka);
        let (left, right) =
            if transposed { (a, Mat::new(&self.b_t, kb, kb)) } else { (a.t(), Mat::new(&self.b, kb, kb)) };
        matmul(MatMut::new(tmp, ka, kb), Mat::new(z, ka, kb), right, 1.0, false, Threads::One);
        matmul(MatMut::new(y, ka, kb), left, Mat::new(tmp, ka, kb), 1.0, false, Threads::One);
    }
}

/// The Monarch MLP's weights on the host.
#[derive(Debug, Clone)]
pub(super) struct Monarch {
    transforms: [Kronecker; 3],
    d1: Vec<f32>,
    d2: Vec<f32>,
    b2: Vec<f32>,
    d3: Vec<f32>,
    d4: Vec<f32>,
    /// `Vᵀ` `[r, d]` and `U` `[r, n]` of the conditioning: `V` is held transposed so that both
    /// `x·V` (r dot products) and its backward (r scaled rows added) run along contiguous rows.
    cond_vt: Vec<f32>,
    cond_u: Vec<f32>,
    perms: [Vec<u32>; 2],
}

/// The rows of a scratch, the width `n` each: the conditioning and the pre-activation (left by the
/// forward for the backward), and three work rows.
const ROWS: usize = 5;

impl Monarch {
    pub(super) fn new(mlp: &MonarchMlp) -> crate::model::Result<Self> {
        let [t1, t2, t3] = &mlp.factors;
        let flat = |t: &candle_core::Tensor| t.flatten_all()?.to_vec1::<f32>();
        let [p1, p2] = &mlp.perms;
        Ok(Self {
            transforms: [Kronecker::new(t1)?, Kronecker::new(t2)?, Kronecker::new(t3)?],
            d1: flat(&mlp.d1)?,
            d2: flat(&mlp.d2)?,
            b2: flat(&mlp.b2)?,
            d3: flat(&mlp.d3)?,
            d4: flat(&mlp.d4)?,
            cond_vt: mlp.cond_v.t()?.flatten_all()?.to_vec1()?,
            cond_u: flat(&mlp.cond_u)?,
            perms: [p1.to_vec1()?, p2.to_vec1()?],
        })
    }

    fn width(&self) -> usize {
        self.d1.len()
    }

    /// Scratch a row needs: [`ROWS`] rows of the width, then the conditioning's softmax.
    pub(super) fn scratch_len(&self) -> usize {
        ROWS * self.width() + COND_RANK
    }

    /// `cond = 1 + softmax(x·V)·U` into `cond`, the softmax into `p`.
    #[inline(always)]
    fn condition(&self, x: &[f32], p: &mut [f32], cond: &mut [f32]) {
        for (p, v_column) in p.iter_mut().zip(self.cond_vt.chunks(x.len())) {
            *p = dot(x, v_column);
        }
        let max = p.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        p.iter_mut().for_each(|p| *p = exp(*p - max));
        let sum: f32 = p.iter().sum();
        p.iter_mut().for_each(|p| *p /= sum);
        cond.fill(1.0);
        for (&p, u_row) in p.iter().zip(self.cond_u.chunks(cond.len())) {
            cond.iter_mut().zip(u_row).for_each(|(c, u)| *c += p * u);
        }
    }

    /// Floats a row keeps from its forward for its backward: `z1`, then the output. Recomputing them
    /// costs three Kronecker transforms a token, which the backward would otherwise run again.
    pub(super) fn kept_width(cfg: &ModelConfig) -> usize {
        cfg.hadamard_width() + cfg.d_model
    }

    /// `y = mlp(x)`, keeping `z1` and `y` in `kept` and leaving in `scratch` what
    /// [`Monarch::backward`] reads.
    #[inline(always)]
    pub(super) fn forward(&self, x: &[f32], scratch: &mut [f32], kept: &mut [f32], y: &mut [f32]) {
        let n = self.width();
        let (rows, p) = scratch.split_at_mut(ROWS * n);
        let [cond, pre, a, b, c] = rows_of(rows, n);
        let (z1, kept_y) = kept.split_at_mut(n);
        self.condition(x, p, cond);
        // z1 = M₁(d₁ ⊙ pad(x))[p₁].
        a.fill(0.0);
        a.iter_mut().zip(x.iter().zip(&self.d1)).for_each(|(a, (x, d))| *a = x * d);
        self.transforms[0].apply(false, a, c, b);
        permute(&self.perms[0], b, z1);
        // g = silu(d₂ ⊙ cond ⊙ z1 + b₂), z2 = M₂(g)[p₂].
        self.pre_activation(z1, cond, pre);
        a.iter_mut().zip(pre.iter()).for_each(|(g, z)| *g = z * logistic(*z));
        self.transforms[1].apply(false, a, c, b);
        permute(&self.perms[1], b, a);
        // out = (d₄ ⊙ M₃(d₃ ⊙ z2))[..d].
        a.iter_mut().zip(&self.d3).for_each(|(a, d)| *a *= d);
        self.transforms[2].apply(false, a, c, b);
        y.iter_mut().zip(b.iter().zip(&self.d4)).for_each(|(y, (b, d))| *y = b * d);
        kept_y.copy_from_slice(y);
    }

    /// What [`Monarch::forward`] of this row left in `scratch` and `y`, from its input `x` and what
    /// it kept: the conditioning and the pre-activation, a few vector passes.
    #[inline(always)]
    pub(super) fn recall(&self, x: &[f32], kept: &[f32], scratch: &mut [f32], y: &mut [f32]) {
        let n = self.width();
        let (rows, p) = scratch.split_at_mut(ROWS * n);
        let [cond, pre, ..] = rows_of(rows, n);
        let (z1, kept_y) = kept.split_at(n);
        self.condition(x, p, cond);
        self.pre_activation(z1, cond, pre);
        y.copy_from_slice(kept_y);
    }

    /// `pre = d₂ ⊙ cond ⊙ z1 + b₂`.
    #[inline(always)]
    fn pre_activation(&self, z1: &[f32], cond: &[f32], pre: &mut [f32]) {
        for (pre, (z, (d, (c, b)))) in pre.iter_mut().zip(z1.iter().zip(self.d2.iter().zip(cond.iter().zip(&self.b2))))
        {
            *pre = z * d * c + b;
        }
    }

    /// `dx` from `dy`, after [`Monarch::forward`] (or [`Monarch::recall`]) of the same row left its
    /// scratch, with what the forward kept.
    #[inline(always)]
    pub(super) fn backward(&self, scratch: &mut [f32], kept: &[f32], dy: &[f32], dx: &mut [f32]) {
        let n = self.width();
        let (rows, p) = scratch.split_at_mut(ROWS * n);
        let [cond, pre, a, b, c] = rows_of(rows, n);
        let z1 = &kept[..n];
        // Back through M₃, d₃ and p₂, then M₂.
        a.fill(0.0);
        a.iter_mut().zip(dy.iter().zip(&self.d4)).for_each(|(a, (g, d))| *a = g * d);
        self.transforms[2].apply(true, a, c, b);
        b.iter_mut().zip(&self.d3).for_each(|(b, d)| *b *= d);
        unpermute(&self.perms[1], b, a);
        self.transforms[1].apply(true, a, c, b);
        // Through the SiLU: the gradients of z1 (into a) and of cond (into pre).
        let factors = b.iter().zip(self.d2.iter().zip(cond.iter().zip(z1.iter())));
        for ((a, pre), (g, (d, (c, z)))) in a.iter_mut().zip(pre.iter_mut()).zip(factors) {
            let s = logistic(*pre);
            let dpre = g * (s + *pre * s * (1.0 - s)) * d;
            *a = dpre * c;
            *pre = dpre * z;
        }
        unpermute(&self.perms[0], a, b);
        self.transforms[0].apply(true, b, c, a);
        dx.iter_mut().zip(a.iter().zip(&self.d1)).for_each(|(dx, (a, d))| *dx = a * d);
        // cond = 1 + p·U with p = softmax(x·V): dp = U·dcond, then the softmax's backward.
        let mut dp = [0f32; COND_RANK];
        for (dp, u_row) in dp.iter_mut().zip(self.cond_u.chunks(n)) {
            *dp = dot(u_row, pre);
        }
        let through: f32 = p.iter().zip(&dp).map(|(p, g)| p * g).sum();
        dp.iter_mut().zip(p.iter()).for_each(|(g, p)| *g = p * (*g - through));
        for (&g, v_column) in dp.iter().zip(self.cond_vt.chunks(dx.len())) {
            dx.iter_mut().zip(v_column).for_each(|(dx, v)| *dx += v * g);
        }
    }
}

/// The scratch's first [`ROWS`] rows of width `n`.
#[inline(always)]
fn rows_of(rows: &mut [f32], n: usize) -> [&mut [f32]; ROWS] {
    let (cond, rest) = rows.split_at_mut(n);
    let (pre, rest) = rest.split_at_mut(n);
    let (a, rest) = rest.split_at_mut(n);
    let (b, c) = rest.split_at_mut(n);
    [cond, pre, a, b, c]
}

/// `out[i] = x[perm[i]]`.
#[inline(always)]
fn permute(perm: &[u32], x: &[f32], out: &mut [f32]) {
    out.iter_mut().zip(perm).for_each(|(o, &p)| *o = x[p as usize]);
}

/// `out[perm[i]] = x[i]`: the transpose of [`permute`].
#[inline(always)]
fn unpermute(perm: &[u32], x: &[f32], out: &mut [f32]) {
    x.iter().zip(perm).for_each(|(x, &p)| out[p as usize] = *x);
}

#[cfg(test)]
mod tests {
    use candle_core::{Device, Tensor, Var};

    use super::*;
    use crate::fixtures::seeded_normal;
    use crate::model::params::Params;

    /// The MLP's parameters at the scale a trained one has, so that its output and gradient are of
    /// order one (at a random init's std of 0.02 three transforms shrink them below any tolerance):
    /// factors N(0, 1/k), diagonals near one.
    fn unit_scale_mlp(cfg: &ModelConfig) -> std::collections::BTreeMap<String, Tensor> {
        let (d, n) = (cfg.d_model, cfg.hadamard_width());
        let bits = usize::BITS - n.saturating_sub(1).leading_zeros();
        let (a, b) = (1usize << (bits / 2), n >> (bits / 2));
        // Each tensor its own seed, so that every draw is replayable.
        let mut seed = 0;
        let mut normal = |mean: f32, std: f64, shape: &[usize]| {
            seed += 1;
            seeded_normal(mean, std as f32, shape, seed)
        };
        let mut tensors = std::collections::BTreeMap::new();
        for s in 1..=3 {
            tensors.insert(format!("mlp/w{s}a"), normal(0.0, (a as f64).recip().sqrt(), &[a, a]));
            tensors.insert(format!("mlp/w{s}b"), normal(0.0, (b as f64).recip().sqrt(), &[b, b]));
        }
        for name in ["d1", "d2", "d3", "d4"] {
            tensors.insert(format!("mlp/{name}"), normal(1.0, 0.2, &[n]));
        }
        tensors.insert("mlp/b2".into(), normal(0.0, 0.2, &[n]));
        tensors.insert("mlp/cond_v".into(), normal(0.0, (d as f64).recip().sqrt(), &[d, COND_RANK]));
        tensors.insert("mlp/cond_u".into(), normal(0.0, 0.2, &[COND_RANK, n]));
        tensors
    }

    /// The row functions against the candle module and its autograd, at a width padded past
    /// `d_model` (40 → 64, factors 8 × 8), with a split permutation, and at 16 × 32 factors.
    #[test]
    fn rows_match_the_candle_module_and_its_gradient() {
        for cfg in [
            ModelConfig { d_model: 40, ..ModelConfig::needle3_defaults() },
            ModelConfig { d_model: 32, ladder_widths: vec![16, 32], ..ModelConfig::needle3_defaults() },
            ModelConfig { d_model: 400, ..ModelConfig::needle3_defaults() },
        ] {
            let params = Params::from_tensors(unit_scale_mlp(&cfg), &Device::Cpu).unwrap();
            let candle = MonarchMlp::new(&cfg, params.root().pp("mlp")).unwrap();
            let rows = Monarch::new(&candle).unwrap();
            let (tokens, d) = (5, cfg.d_model);
            let (x, probe) = (seeded_normal(0.0, 1.0, &[tokens, d], 101), seeded_normal(0.0, 1.0, &[tokens, d], 102));
            let var = Var::from_tensor(&x).unwrap();
            let y = candle.forward(var.as_tensor()).unwrap();
            let grad = (&y * &probe).unwrap().sum_all().unwrap().backward().unwrap();
            let (want_y, want_dx) =
                (y.to_vec2::<f32>().unwrap(), grad.get(var.as_tensor()).unwrap().to_vec2::<f32>().unwrap());
            let (x, probe) = (x.to_vec2::<f32>().unwrap(), probe.to_vec2::<f32>().unwrap());
            let mut scratch = vec![0f32; rows.scratch_len()];
            let mut kept = vec![0f32; Monarch::kept_width(&cfg)];
            let (mut got_y, mut got_dx, mut recalled) = (vec![0f32; d], vec![0f32; d], vec![0f32; d]);
            for t in 0..tokens {
                rows.forward(&x[t], &mut scratch, &mut kept, &mut got_y);
                // The backward runs after a recall, as a step's does, on a scratch the forward did
                // not leave: whatever it reads, the recall or the backward itself wrote.
                scratch.fill(f32::NAN);
                rows.recall(&x[t], &kept, &mut scratch, &mut recalled);
                assert_eq!(recalled, got_y, "d_model {d}, token {t}: the recalled output");
                rows.backward(&mut scratch, &kept, &probe[t], &mut got_dx);
                let size = want_y[t].iter().fold(0f32, |m, v| m.max(v.abs()));
                for (got, want, what) in [(&got_y, &want_y[t], "output"), (&got_dx, &want_dx[t], "gradient")] {
                    let size = if what == "output" { size } else { want.iter().fold(0f32, |m, v| m.max(v.abs())) };
                    let diff = got.iter().zip(want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
                    assert!(diff <= 1e-5 * size.max(1e-3), "d_model {d}, token {t}: {what} off by {diff} of {size}");
                }
            }
        }
    }
}
