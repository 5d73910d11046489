//! Zero-centred RMSNorm: `(1 + scale) · x / rms(x)`, so a zero scale is the identity gain.

use candle_core::Tensor;

use super::kernels::rms_norm;
use super::params::ParamPath;
use super::Result;

/// `x / sqrt(mean(x²) + ε)` over the last axis.
pub fn rms_unit(x: &Tensor) -> candle_core::Result<Tensor> {
    rms_norm(x, None)
}

/// The reference's `ZCRMSNorm` (parameter `scale`, one per feature).
#[derive(Debug, Clone)]
pub struct ZcRmsNorm {
    /// `1 + scale`, precomputed.
    gain: Tensor,
}

impl ZcRmsNorm {
    pub fn new(width: usize, vb: ParamPath) -> Result<Self> {
        Ok(Self { gain: (vb.get(&[width], "scale")? + 1.0)? })
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(rms_norm(x, Some(&self.gain))?)
    }
}
