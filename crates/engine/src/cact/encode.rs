//! One tensor of a `.cact` as bytes: a checkpoint parameter widened to f32, and its FP16, FP32, CQ
//! or RAW encoding; and what can stop a build, which the writer and the tensors it lays out share.

use std::path::PathBuf;

use half::f16;
use thiserror::Error;

use super::bits::BitsChoice;
use super::format::{FormatError, Record, TensorKind, MAX_NDIM, RECORD_LEN};
use super::geometry::GeometryError;
use super::layout::TOKENIZER;
use crate::checkpoint::{Checkpoint, DType, NdArray};
use crate::generation::Generation;
use crate::model::ModelError;
use crate::quant::{self, Bits};
use crate::tokenizer::{self, TokenizerError};

/// Why a checkpoint could not be turned into a `.cact`; names the checkpoint file.
#[derive(Debug, Error)]
#[error("{}: {problem}", checkpoint.display())]
pub struct BuildError {
    pub checkpoint: PathBuf,
    pub problem: BuildProblem,
}

#[derive(Debug, Error)]
pub enum BuildProblem {
    #[error("no parameter `{path}`; `needle build` needs a complete Needle 2 or Needle 3 checkpoint")]
    MissingParam { path: String },
    #[error(
        "parameter `{path}` has shape {found:?} but the export needs {expected}; the params do not match the config"
    )]
    BadShape { path: String, expected: String, found: Vec<usize> },
    #[error("parameter `{path}` is {dtype:?}; the export reads float16 or float32 weights (re-save the checkpoint as float32)")]
    UnsupportedDtype { path: String, dtype: DType },
    #[error("config: {0}")]
    Geometry(#[from] GeometryError),
    /// A config the network cannot have, so its parameter tree is unknown (boxed: it is large).
    #[error("{0}")]
    Model(Box<ModelError>),
    #[error("the tokenizer has {tokenizer} pieces but the config's vocab_size is {config}{}; pass the tokenizer the model was trained with (--tokenizer)",
            match tokenizer::VocabFit::of(*.generation) { tokenizer::VocabFit::Exact => String::new(), tokenizer::VocabFit::AtMost => format!(" (a {} tokenizer may have fewer, never more)", .generation) })]
    TokenizerVocab { tokenizer: usize, config: usize, generation: Generation },
    #[error("{0}; the tokenizer did not serialise")]
    TokenizerBlob(TokenizerError),
    #[error("tensor `{name}` has {ndim} dimensions; a .cact directory record holds at most {MAX_NDIM}")]
    TooManyDims { name: String, ndim: usize },
    #[error("{what} = {value} does not fit the .cact header's u32 field")]
    TooLarge { what: String, value: usize },
    #[error("{0}")]
    Header(FormatError),
}

/// A checkpoint parameter (or a slice of one) widened to f32, row-major.
#[derive(Debug, Clone)]
pub(super) struct Param {
    pub path: String,
    pub shape: Vec<usize>,
    pub values: Vec<f32>,
}

impl Param {
    pub fn load(ckpt: &Checkpoint, path: &str) -> Result<Self, BuildProblem> {
        let arr = ckpt.params.get(path).ok_or_else(|| BuildProblem::MissingParam { path: path.into() })?;
        Self::from_array(path, arr)
    }

    fn from_array(path: &str, arr: &NdArray) -> Result<Self, BuildProblem> {
        if !matches!(arr.dtype, DType::F16 | DType::BF16 | DType::F32) {
            return Err(BuildProblem::UnsupportedDtype { path: path.into(), dtype: arr.dtype });
        }
        let param = Self { path: path.into(), shape: arr.shape.clone(), values: arr.to_f32() };
        if param.values.len() != param.shape.iter().product::<usize>() {
            return Err(param.bad_shape(format!("{} elements for its shape", param.values.len())));
        }
        Ok(param)
    }

    pub fn bad_shape(&self, expected: impl Into<String>) -> BuildProblem {
        bad_shape(&self.path, &self.shape, expected.into())
    }

    /// Element `index` along the leading (stacked-layers) axis.
    pub fn layer(&self, index: usize) -> Result<Param, BuildProblem> {
        let (&layers, inner) = self.shape.split_first().ok_or_else(|| self.bad_shape("a leading layer axis"))?;
        if index >= layers {
            return Err(self.bad_shape(format!("at least {} entries on the layer axis", index + 1)));
        }
        let size: usize = inner.iter().product();
        Ok(Param {
            path: format!("{}[{index}]", self.path),
            shape: inner.to_vec(),
            values: self.values[index * size..(index + 1) * size].to_vec(),
        })
    }

    pub fn reshaped(mut self, shape: Vec<usize>) -> Result<Param, BuildProblem> {
        if shape.iter().product::<usize>() != self.values.len() {
            return Err(self.bad_shape(format!("{} elements (shape {shape:?})", shape.iter().product::<usize>())));
        }
        self.shape = shape;
        Ok(self)
    }

    /// A `[in, out]` kernel as the `[out, in]` matrix the runtime streams. Copied in square tiles so
    /// both the reads and the writes stay within a few cache lines.
    pub fn transposed(&self) -> Result<Param, BuildProblem> {
        const TILE: usize = 32;
        let &[rows, cols] = self.shape.as_slice() else {
            return Err(self.bad_shape("a 2-D kernel"));
        };
        let mut values = vec![0.0f32; self.values.len()];
        for r0 in (0..rows).step_by(TILE) {
            for c0 in (0..cols).step_by(TILE) {
                for r in r0..(r0 + TILE).min(rows) {
                    for c in c0..(c0 + TILE).min(cols) {
                        values[c * rows + r] = self.values[r * cols + c];
                    }
                }
            }
        }
        Ok(Param { path: self.path.clone(), shape: vec![cols, rows], values })
    }
}

pub(super) fn bad_shape(path: &str, found: &[usize], expected: String) -> BuildProblem {
    BuildProblem::BadShape { path: path.into(), expected, found: found.to_vec() }
}

/// One encoded tensor, ready to be placed.
pub(super) struct Tensor {
    pub name: String,
    pub(super) kind: TensorKind,
    pub(super) shape: Vec<usize>,
    pub(super) blob: Vec<u8>,
}

impl Tensor {
    /// The directory record that places this tensor at `offset`.
    pub(super) fn record(&self, offset: usize) -> Result<[u8; RECORD_LEN], BuildProblem> {
        let shape = self
            .shape
            .iter()
            .enumerate()
            .map(|(i, &dim)| u32_field(&format!("{} dimension {i}", self.name), dim))
            .collect::<Result<_, _>>()?;
        let record = Record {
            name: String::new(),
            kind: self.kind,
            shape,
            offset: offset as u64,
            nbytes: self.blob.len() as u64,
        };
        record.to_bytes().map_err(|_| BuildProblem::TooManyDims { name: self.name.clone(), ndim: self.shape.len() })
    }
}

pub(super) fn fp16_tensor(name: impl Into<String>, p: &Param) -> Tensor {
    let blob = p.values.iter().flat_map(|&v| f16::from_f32(v).to_le_bytes()).collect();
    Tensor { name: name.into(), kind: TensorKind::Fp16, shape: p.shape.clone(), blob }
}

pub(super) fn fp32_tensor(name: impl Into<String>, p: &Param) -> Tensor {
    let blob = p.values.iter().flat_map(|v| v.to_le_bytes()).collect();
    Tensor { name: name.into(), kind: TensorKind::Fp32, shape: p.shape.clone(), blob }
}

pub(super) fn cq_tensor(name: impl Into<String>, matrix: &Param, bits: &BitsChoice) -> Result<Tensor, BuildProblem> {
    let name = name.into();
    let &[_, in_dim] = matrix.shape.as_slice() else {
        return Err(matrix.bad_shape("a 2-D matrix"));
    };
    let width: Bits = bits.bits_for(&name);
    let blob = quant::cq_encode(&matrix.values, in_dim, width);
    Ok(Tensor { name, kind: TensorKind::Cq(width), shape: matrix.shape.clone(), blob })
}

/// The RAW tokenizer tensor, whose pieces must fit the vocabulary ([`tokenizer::fits`]).
pub(super) fn tokenizer_tensor(blob: &[u8], vocab_size: usize, generation: Generation) -> Result<Tensor, BuildProblem> {
    let pieces = tokenizer::cact_blob_stated_pieces(blob).map_err(BuildProblem::TokenizerBlob)? as usize;
    if !tokenizer::fits(generation, pieces, vocab_size) {
        return Err(BuildProblem::TokenizerVocab { tokenizer: pieces, config: vocab_size, generation });
    }
    Ok(Tensor { name: TOKENIZER.into(), kind: TensorKind::Raw, shape: vec![], blob: blob.to_vec() })
}

pub(super) fn u32_field(what: &str, value: usize) -> Result<u32, BuildProblem> {
    u32::try_from(value).map_err(|_| BuildProblem::TooLarge { what: what.into(), value })
}
