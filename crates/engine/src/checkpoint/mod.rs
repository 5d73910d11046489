//! Format-v2 Needle checkpoints (`.pkl`) and the reference's LoRA adapter pickles.
//!
//! CONTRACT (placeholder until the reader lands): the public API below is what the rest of the
//! engine programs against.

pub mod pickle;

use std::collections::BTreeMap;
use std::path::Path;

use crate::config::ModelConfig;

/// Element type of an array read from a checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DType {
    F16,
    F32,
    F64,
    I32,
    I64,
    U8,
    U32,
    Bool,
}

/// A numpy array as read from a pickle: C-order, little-endian elements.
#[derive(Debug, Clone, PartialEq)]
pub struct NdArray {
    pub dtype: DType,
    pub shape: Vec<usize>,
    /// Raw little-endian element bytes in C order.
    pub data: Vec<u8>,
}

impl NdArray {
    /// The elements converted to f32 (float16 widened exactly).
    pub fn to_f32(&self) -> Vec<f32> {
        todo!()
    }
}

/// A format-v2 checkpoint: params flattened to `/`-joined paths (`stack/layers/block/self_attn/q_proj/kernel`).
#[derive(Debug, Clone)]
pub struct Checkpoint {
    pub params: BTreeMap<String, NdArray>,
    pub config: ModelConfig,
    pub step: Option<i64>,
}

impl Checkpoint {
    pub fn load(_path: &Path) -> Result<Self, pickle::PickleError> {
        todo!()
    }
}
