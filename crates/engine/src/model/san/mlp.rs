//! The Hadamard MLP: diagonal scalings around two orthonormal Walsh–Hadamard mixings, in a width
//! padded to the next power of two: `(d3 · (silu(d2 · ((d1 · z) H)) H))[:d_model]`.

use candle_core::Tensor;

use crate::model::kernels::hadamard_mlp;
use crate::model::weights::mlp::HadamardMlp;
use crate::model::Result;

impl HadamardMlp {
    /// `x` `[…, d_model]` → `[…, d_model]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(hadamard_mlp(x, [&self.d1, &self.d2, &self.d3], self.walsh_matrix.as_ref())?)
    }
}
