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
    scale: Tensor,
}

impl ZcRmsNorm {
    pub fn new(width: usize, vb: ParamPath) -> Result<Self> {
        Ok(Self { scale: vb.get(&[width], "scale")? })
    }

    /// The gain `1 + scale` on the host.
    pub(super) fn gain(&self) -> Result<Vec<f32>> {
        Ok((&self.scale + 1.0)?.to_vec1()?)
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        // The gain `1 + scale` is formed per call, not when loading: a network built only to list
        // its parameters (`Network::param_shapes`) then allocates nothing per layer.
        Ok(rms_norm(x, Some(&(&self.scale + 1.0)?))?)
    }
}
