//! The Hadamard MLP: diagonal scalings around two orthonormal Walsh–Hadamard mixings, in a width
//! padded to the next power of two: `(d3 · (silu(d2 · ((d1 · z) H)) H))[:d_model]`.

use candle_core::Tensor;

use crate::config::ModelConfig;
use crate::model::kernels::{self, hadamard_mlp, walsh_matrix};
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
