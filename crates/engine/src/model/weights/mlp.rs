//! The weights of Needle 2's Hadamard MLP: the three diagonal scalings around its two Walsh–Hadamard
//! mixings (computed in `san/mlp.rs` and `fast/mlp.rs`).

use candle_core::Tensor;

use crate::config::ModelConfig;
use crate::model::kernels::{self, walsh_matrix};
use crate::model::params::ParamPath;
use crate::model::Result;

/// The reference's `hadamard_mlp` module.
#[derive(Debug, Clone)]
pub struct HadamardMlp {
    pub(in crate::model) d1: Tensor,
    pub(in crate::model) d2: Tensor,
    pub(in crate::model) d3: Tensor,
    /// The dense transform, for devices without the fused MLP (see [`kernels::hadamard_mlp`]).
    pub(in crate::model) walsh_matrix: Option<Tensor>,
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

    /// The diagonals on the host, as the row kernels take them.
    pub(in crate::model) fn rows(&self) -> Result<kernels::HadamardMlp> {
        let [d1, d2, d3] = [&self.d1, &self.d2, &self.d3].map(|d| d.to_vec1::<f32>());
        Ok(kernels::HadamardMlp::new(d1?, d2?, d3?))
    }
}
