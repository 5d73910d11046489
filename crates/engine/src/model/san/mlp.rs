//! The Hadamard MLP: diagonal scalings around two orthonormal Walsh–Hadamard mixings, in a width
//! padded to the next power of two: `(d3 · (silu(d2 · ((d1 · z) H)) H))[:d_model]`.

use candle_core::{Device, Tensor};

use crate::config::ModelConfig;
use crate::model::kernels::{self, hadamard_mlp};
use crate::model::params::ParamPath;
use crate::model::Result;

/// The reference's `hadamard_mlp` module.
#[derive(Debug, Clone)]
pub struct HadamardMlp {
    d1: Tensor,
    d2: Tensor,
    d3: Tensor,
    /// The dense transform, for devices without the fused MLP (see [`hadamard_mlp`]).
    walsh_matrix: Option<Tensor>,
}

impl HadamardMlp {
    pub fn new(cfg: &ModelConfig, vb: ParamPath) -> Result<Self> {
        let n = cfg.hadamard_width();
        Ok(Self {
            d1: vb.get(&[n], "d1")?,
            d2: vb.get(&[n], "d2")?,
            d3: vb.get(&[n], "d3")?,
            walsh_matrix: if vb.device().is_cpu() { None } else { Some(walsh_matrix(n, vb.device())?) },
        })
    }

    /// `x` `[…, d_model]` → `[…, d_model]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(hadamard_mlp(x, [&self.d1, &self.d2, &self.d3], self.walsh_matrix.as_ref())?)
    }

    /// The diagonals on the host, as the row kernels take them.
    pub(in crate::model) fn rows(&self) -> Result<kernels::HadamardMlp> {
        let [d1, d2, d3] = [&self.d1, &self.d2, &self.d3].map(|d| d.to_vec1::<f32>());
        Ok(kernels::HadamardMlp::new(d1?, d2?, d3?))
    }
}

/// Sylvester's Hadamard matrix of order `n` (a power of two) scaled by 1/√n:
/// entry (i, j) is `(-1)^popcount(i & j) / √n`.
pub fn walsh_matrix(n: usize, device: &Device) -> Result<Tensor> {
    let unit = (1.0 / (n as f64).sqrt()) as f32;
    let entries: Vec<f32> =
        (0..n).flat_map(|i| (0..n).map(move |j| if (i & j).count_ones() % 2 == 0 { unit } else { -unit })).collect();
    Ok(Tensor::from_vec(entries, (n, n), device)?)
}

#[cfg(test)]
mod tests {
    use super::*;

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
