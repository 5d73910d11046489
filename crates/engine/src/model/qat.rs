//! Quantization-aware training's arithmetic: which widths it computes with, and a weight through CQ
//! and back as the `.cact` will ship it. Shared by the parameters (quantized once at start-up) and
//! the linear layers (an adapted kernel, every step).

use candle_core::{Device, Tensor};
use rayon::prelude::*;

use super::host::host;
use super::{ModelError, Result};
use crate::quant::{cq_round_trip, cq_round_trip_columns, Bits};

/// Quantization-aware training (Needle 3's recipe, the reference's `quant=True`): the weights a
/// `.cact` ships (CQ at [`QAT_WEIGHT_BITS`], straight-through), activations at `act_bits` and
/// queries, keys and values at 8 bits (keys and values only when `kv_bits` is 8).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Qat {
    pub act_bits: u32,
    pub kv_bits: u32,
}

/// The CQ width quantization-aware training computes with (the reference's `WEIGHT_BITS`).
pub const QAT_WEIGHT_BITS: Bits = Bits::Four;

/// `weight` through CQ at [`QAT_WEIGHT_BITS`] and back, its groups running along the last axis, or
/// down the second-last when `second_last`. The round trip reads a CPU tensor's values where they
/// lie (down the columns, it rounds a copy of them in place): at start-up this runs on every weight
/// of the model.
pub(in crate::model) fn cq_along(weight: &Tensor, second_last: bool) -> Result<Tensor> {
    let dims = weight.dims().to_vec();
    let [.., rows, cols] = dims[..] else {
        return Err(ModelError::Unsupported { what: format!("CQ of a weight of shape {dims:?}") });
    };
    let on_host = weight.to_device(&Device::Cpu)?.contiguous()?;
    let values = host(&on_host)?;
    let quantized = if second_last {
        let mut columns: Vec<f32> = values.par_iter().copied().collect();
        cq_round_trip_columns(&mut columns, rows, cols, QAT_WEIGHT_BITS);
        columns
    } else {
        cq_round_trip(&values, cols, QAT_WEIGHT_BITS)
    };
    Ok(Tensor::from_vec(quantized, dims, weight.device())?)
}
