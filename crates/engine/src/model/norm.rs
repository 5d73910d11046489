//! Zero-centred RMSNorm: `(1 + scale) · x / rms(x)`, so a zero scale is the identity gain.

use candle_core::{Tensor, D};

use super::params::ParamPath;
use super::Result;

const EPSILON: f64 = 1e-6;

/// `x / sqrt(mean(x²) + ε)` over the last axis.
pub fn rms_unit(x: &Tensor) -> candle_core::Result<Tensor> {
    let rms = (x.sqr()?.mean_keepdim(D::Minus1)? + EPSILON)?.sqrt()?;
    x.broadcast_div(&rms)
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
        Ok(rms_unit(x)?.broadcast_mul(&self.gain)?)
    }
}
