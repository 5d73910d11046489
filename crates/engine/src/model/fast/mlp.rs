//! Needle 2's MLP ([`crate::model::san::mlp`]) on one token's row: diagonal scalings around two
//! Walsh–Hadamard butterflies, `(d3 ⊙ H(silu(d2 ⊙ H(d1 ⊙ pad(x)))))[..d]`, forward and backward
//! by the fused kernel's row functions.

use crate::model::kernels::HadamardMlp;

/// The Hadamard MLP's diagonals on the host.
#[derive(Debug, Clone)]
pub(super) struct Hadamard(HadamardMlp);

impl Hadamard {
    pub(super) fn new(mlp: &crate::model::weights::mlp::HadamardMlp) -> crate::model::Result<Self> {
        Ok(Self(mlp.rows()?))
    }

    /// Scratch a row needs: the pre-activation `c` the backward reads, and a work row.
    pub(super) fn scratch_len(&self) -> usize {
        2 * self.0.width()
    }

    /// `y = mlp(x)`, leaving the pre-activation in `scratch` for [`Hadamard::backward`].
    #[inline(always)]
    pub(super) fn forward(&self, x: &[f32], scratch: &mut [f32], y: &mut [f32]) {
        let (c, z) = scratch.split_at_mut(self.0.width());
        self.0.pre_activation(x, c);
        self.0.output(c, z, y);
    }

    /// `dx` from `dy`, after [`Hadamard::forward`] of the same row left its scratch.
    #[inline(always)]
    pub(super) fn backward(&self, scratch: &mut [f32], dy: &[f32], dx: &mut [f32]) {
        let (c, g) = scratch.split_at_mut(self.0.width());
        self.0.backward(c, dy, g, dx);
    }
}
