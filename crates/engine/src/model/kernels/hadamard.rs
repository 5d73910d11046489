//! The Hadamard MLP as one op: two Walsh–Hadamard butterflies around frozen diagonals and a SiLU.

use candle_core::{bail, CpuStorage, CustomOp1, CustomOp2, Device, Layout, Result, Shape, Tensor, D};

use super::matmul::frozen_matmul;
use super::rows::{f32s, fused, map_row_pairs, map_rows};
use crate::simd::{logistic, walsh_row};

/// The Hadamard MLP over the last axis: `(d3 ⊙ H(silu(d2 ⊙ H(d1 ⊙ pad(x)))))[..d]`, with `H`
/// Sylvester's Hadamard matrix scaled by `1/√n` and `pad` zero-padding to its width `n`. On the
/// CPU one op: `H` as an O(n log n) butterfly, nothing kept but the input (the backward recomputes
/// the two transforms) and no gradient for the frozen diagonals. Elsewhere the composite ops with
/// `walsh_matrix` (the dense `H`, which those devices must provide).
pub fn hadamard_mlp(x: &Tensor, diagonals: [&Tensor; 3], walsh_matrix: Option<&Tensor>) -> Result<Tensor> {
    if fused(x) {
        let [d1, d2, d3] = diagonals.map(|d| d.to_vec1::<f32>());
        return x.contiguous()?.apply_op1(HadamardMlp::new(d1?, d2?, d3?));
    }
    match walsh_matrix {
        Some(matrix) => hadamard_mlp_composite(x, diagonals, matrix),
        None => bail!("hadamard mlp: {:?} needs the dense Walsh matrix", x.device().location()),
    }
}

fn hadamard_mlp_composite(x: &Tensor, [d1, d2, d3]: [&Tensor; 3], walsh_matrix: &Tensor) -> Result<Tensor> {
    let d = x.dim(D::Minus1)?;
    let z = x.pad_with_zeros(D::Minus1, 0, walsh_matrix.dim(0)? - d)?;
    let z = frozen_matmul(&z.broadcast_mul(d1)?, walsh_matrix)?;
    let z = frozen_matmul(&z.broadcast_mul(d2)?.silu()?, walsh_matrix)?;
    z.broadcast_mul(d3)?.narrow(D::Minus1, 0, d)
}

/// The MLP's frozen diagonals, and its rows computed one at a time.
#[derive(Debug, Clone)]
pub(crate) struct HadamardMlp {
    d1: Vec<f32>,
    d2: Vec<f32>,
    d3: Vec<f32>,
}

impl HadamardMlp {
    pub(crate) fn new(d1: Vec<f32>, d2: Vec<f32>, d3: Vec<f32>) -> Self {
        Self { d1, d2, d3 }
    }

    /// The padded width `n`: the size of the scratch rows below.
    pub(crate) fn width(&self) -> usize {
        self.d1.len()
    }

    /// `c = d2 ⊙ H(d1 ⊙ pad(x))`, the pre-activation, into `c` (the padded width).
    #[inline(always)]
    pub(crate) fn pre_activation(&self, x: &[f32], c: &mut [f32]) {
        c.fill(0.0);
        c[..x.len()].iter_mut().zip(x.iter().zip(&self.d1)).for_each(|(c, (x, d))| *c = x * d);
        walsh_row(c);
        c.iter_mut().zip(&self.d2).for_each(|(c, d)| *c *= d);
    }

    /// `y = (d3 ⊙ H(silu(c)))[..d]` from the pre-activation, with `z` a scratch row.
    #[inline(always)]
    pub(crate) fn output(&self, c: &[f32], z: &mut [f32], y: &mut [f32]) {
        z.iter_mut().zip(c).for_each(|(z, c)| *z = c * logistic(*c));
        walsh_row(z);
        y.iter_mut().zip(z.iter().zip(&self.d3)).for_each(|(y, (z, d))| *y = z * d);
    }

    /// `dx = (d1 ⊙ H(d2 ⊙ silu'(c) ⊙ H(d3 ⊙ pad(dy))))[..d]`, with `g` a scratch row.
    #[inline(always)]
    pub(crate) fn backward(&self, c: &[f32], dy: &[f32], g: &mut [f32], dx: &mut [f32]) {
        g.fill(0.0);
        g[..dy.len()].iter_mut().zip(dy.iter().zip(&self.d3)).for_each(|(g, (dy, d3))| *g = dy * d3);
        walsh_row(g);
        for ((g, c), d2) in g.iter_mut().zip(c).zip(&self.d2) {
            let s = logistic(*c);
            *g *= (s + c * s * (1.0 - s)) * d2;
        }
        walsh_row(g);
        dx.iter_mut().zip(g.iter().zip(&self.d1)).for_each(|(dx, (g, d1))| *dx = g * d1);
    }

    fn check(&self, layout: &Layout) -> Result<usize> {
        let d = layout.dims().last().copied().unwrap_or(0);
        let n = self.d1.len();
        if !n.is_power_of_two() || d > n || self.d2.len() != n || self.d3.len() != n {
            bail!("hadamard mlp: width {d} does not fit diagonals of {n}");
        }
        Ok(d)
    }
}

impl CustomOp1 for HadamardMlp {
    fn name(&self) -> &'static str {
        "hadamard-mlp"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let d = self.check(layout)?;
        let out = map_rows(f32s(storage, layout)?, d, |_, x, y| {
            let (mut c, mut z) = (vec![0f32; self.width()], vec![0f32; self.width()]);
            self.pre_activation(x, &mut c);
            self.output(&c, &mut z, y);
        });
        Ok((CpuStorage::F32(out), layout.shape().clone()))
    }

    fn bwd(&self, x: &Tensor, _y: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(x.apply_op2_no_bwd(&grad.contiguous()?, &HadamardMlpBackward(self.clone()))?))
    }
}

/// The input gradient ([`HadamardMlp::backward`]), with `c` recomputed from `x`.
struct HadamardMlpBackward(HadamardMlp);

impl CustomOp2 for HadamardMlpBackward {
    fn name(&self) -> &'static str {
        "hadamard-mlp-backward"
    }

    fn cpu_fwd(&self, xs: &CpuStorage, xl: &Layout, gs: &CpuStorage, gl: &Layout) -> Result<(CpuStorage, Shape)> {
        let mlp = &self.0;
        let d = mlp.check(xl)?;
        let out = map_row_pairs(f32s(xs, xl)?, f32s(gs, gl)?, d, |_, x, dy, dx| {
            let (mut c, mut g) = (vec![0f32; mlp.width()], vec![0f32; mlp.width()]);
            mlp.pre_activation(x, &mut c);
            mlp.backward(&c, dy, &mut g, dx);
        });
        Ok((CpuStorage::F32(out), xl.shape().clone()))
    }
}

/// Sylvester's Hadamard matrix of order `n` (a power of two) scaled by 1/√n:
/// entry (i, j) is `(-1)^popcount(i & j) / √n`.
pub fn walsh_matrix(n: usize, device: &Device) -> Result<Tensor> {
    let unit = (1.0 / (n as f64).sqrt()) as f32;
    let entries: Vec<f32> =
        (0..n).flat_map(|i| (0..n).map(move |j| if (i & j).count_ones() % 2 == 0 { unit } else { -unit })).collect();
    Tensor::from_vec(entries, (n, n), device)
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;
    use candle_core::Device;

    #[test]
    fn fused_hadamard_mlp_matches_the_dense_walsh_matrix_composite() {
        let matrix = walsh_matrix(16, &Device::Cpu).unwrap();
        let (x, probe) = (random(&[2, 3, 12], 5), random(&[2, 3, 12], 6));
        let diagonals = [random(&[16], 14), random(&[16], 15), random(&[16], 16)];
        let diagonals = [&diagonals[0], &diagonals[1], &diagonals[2]];
        let fused = value_and_grad(&x, &probe, |x| hadamard_mlp(x, diagonals, None).unwrap());
        let composite = value_and_grad(&x, &probe, |x| hadamard_mlp_composite(x, diagonals, &matrix).unwrap());
        assert_same("hadamard mlp", fused, composite);
    }

    #[test]
    fn walsh_matrix_is_orthonormal_and_follows_sylvester_blocks() {
        let h = walsh_matrix(8, &Device::Cpu).unwrap();
        let eye = h.matmul(&h.t().unwrap()).unwrap().to_vec2::<f32>().unwrap();
        for (i, row) in eye.iter().enumerate() {
            for (j, v) in row.iter().enumerate() {
                assert!((v - if i == j { 1.0 } else { 0.0 }).abs() < 1e-6);
            }
        }
        // [[H, H], [H, -H]]: the bottom-right block is the negated top-left one.
        let m = h.to_vec2::<f32>().unwrap();
        assert_eq!(m[5][6], -m[1][2]);
        assert_eq!(m[1][6], m[1][2]);
    }
}
