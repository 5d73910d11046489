//! Builds a `.cact` from a checkpoint: its generation's tensors ([`super::tensors`], in the order
//! [`super::layout`] gives) framed by the header, the directory and aligned blobs
//! ([`super::format`](mod@super::format)), written atomically.

use std::path::{Path, PathBuf};

use half::f16;
use thiserror::Error;

use super::bits::BitsChoice;
use super::format::{align_up, Record, TensorKind, MAX_NDIM, RECORD_LEN};
use super::geometry::{Geometry, GeometryError};
use super::layout::TOKENIZER;
use super::quant::{self, Bits};
use super::reader::FormatError;
use super::tensors;
use crate::checkpoint::{Checkpoint, DType, NdArray};
use crate::generation::Generation;
use crate::generation::VocabFit;
use crate::model::ModelError;
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
            match .generation.profile().vocab { VocabFit::Exact => String::new(), VocabFit::AtMost => format!(" (a {} tokenizer may have fewer, never more)", .generation) })]
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

/// The `.cact` could not be written.
#[derive(Debug, Error)]
#[error("cannot write {}: {source}; check that the directory exists and is writable", path.display())]
pub struct WriteError {
    pub path: PathBuf,
    pub source: std::io::Error,
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
    kind: TensorKind,
    shape: Vec<usize>,
    blob: Vec<u8>,
}

impl Tensor {
    /// The directory record that places this tensor at `offset`.
    fn record(&self, offset: usize) -> Result<[u8; RECORD_LEN], BuildProblem> {
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

/// The RAW tokenizer tensor, whose pieces must fit the vocabulary ([`Generation::tokenizer_fits`]).
fn tokenizer_tensor(blob: &[u8], vocab_size: usize, generation: Generation) -> Result<Tensor, BuildProblem> {
    let pieces = tokenizer::cact_blob_stated_pieces(blob).map_err(BuildProblem::TokenizerBlob)? as usize;
    if !generation.tokenizer_fits(pieces, vocab_size) {
        return Err(BuildProblem::TokenizerVocab { tokenizer: pieces, config: vocab_size, generation });
    }
    Ok(Tensor { name: TOKENIZER.into(), kind: TensorKind::Raw, shape: vec![], blob: blob.to_vec() })
}

fn u32_field(what: &str, value: usize) -> Result<u32, BuildProblem> {
    u32::try_from(value).map_err(|_| BuildProblem::TooLarge { what: what.into(), value })
}

/// A finished `.cact` image.
#[derive(Debug, Clone)]
pub struct BuiltCact {
    pub bytes: Vec<u8>,
    /// Directory entries, tokenizer included.
    pub num_tensors: usize,
    /// Each tensor's name in file order (the file itself is nameless).
    pub names: Vec<String>,
}

/// Lays the checkpoint out as a `.cact` of its generation exactly as the reference's `_pack_cact`
/// does. `tokenizer_blob` is the RAW tokenizer dump (`Tokenizer::to_cact_blob`); its piece count
/// must fit the config's `vocab_size`.
pub fn build_cact(ckpt: &Checkpoint, bits: &BitsChoice, tokenizer_blob: &[u8]) -> Result<BuiltCact, BuildError> {
    pack(ckpt, bits, tokenizer_blob).map_err(|problem| BuildError { checkpoint: ckpt.source.clone(), problem })
}

fn pack(ckpt: &Checkpoint, bits: &BitsChoice, tokenizer_blob: &[u8]) -> Result<BuiltCact, BuildProblem> {
    let geo = Geometry::of(&ckpt.config)?;
    tensors::check_shapes(ckpt)?;
    let mut tensors = tensors::tensors(ckpt, &geo, bits)?;
    tensors.push(tokenizer_tensor(tokenizer_blob, ckpt.config.vocab_size, ckpt.config.generation)?);
    let codebooks = quant::header_codebooks();
    let header = geo.header(&ckpt.config, tensors.len(), codebooks.len())?;
    let mut bytes = header.to_bytes().map_err(BuildProblem::Header)?;
    codebooks.iter().for_each(|c| bytes.extend_from_slice(&c.to_le_bytes()));

    let mut offsets = Vec::with_capacity(tensors.len());
    let mut pos = bytes.len() + tensors.len() * RECORD_LEN;
    for t in &tensors {
        pos = align_up(pos);
        offsets.push(pos);
        pos += t.blob.len();
    }
    for (t, &offset) in tensors.iter().zip(&offsets) {
        bytes.extend_from_slice(&t.record(offset)?);
    }
    bytes.reserve(pos - bytes.len());
    for (t, &offset) in tensors.iter().zip(&offsets) {
        bytes.resize(offset, 0);
        bytes.extend_from_slice(&t.blob);
    }
    Ok(BuiltCact { bytes, num_tensors: tensors.len(), names: tensors.into_iter().map(|t| t.name).collect() })
}

/// Writes `bytes` to `path` atomically, so an interrupted build never leaves a half-written `.cact` for a
/// runtime to mmap.
pub fn write_cact(path: &Path, bytes: &[u8]) -> Result<(), WriteError> {
    crate::atomic::write_atomically(path, bytes).map_err(|source| WriteError { path: path.to_path_buf(), source })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cact::synthetic::{placeholder_tokenizer_blob, random_checkpoint};
    use crate::cact::tensors::check_params;
    use crate::cact::{BitsMap, CactFile};
    use crate::config::ModelConfig;

    fn small_config() -> ModelConfig {
        ModelConfig {
            vocab_size: 32,
            d_model: 32,
            num_heads: 2,
            num_kv_heads: 1,
            num_layers: 2,
            engram_slots: 4,
            engram_layers: vec![1],
            mhc_lanes: 2,
            ..ModelConfig::default()
        }
    }

    #[test]
    fn a_weight_bits_map_sets_each_tensors_width_including_ternary() {
        let mut ckpt = random_checkpoint(&small_config(), true, 1).unwrap();
        ckpt.config.weight_bits = "default=4,attn.q_proj=2,embedding=3,engram=1.58".into();
        let bits = BitsChoice::resolve(None, &ckpt.config).unwrap();
        let built = build_cact(&ckpt, &bits, &placeholder_tokenizer_blob(32)).unwrap();
        let file = CactFile::parse(built.bytes).unwrap();
        // The reader recovers every position's name from the header alone.
        let read_names: Vec<&String> = file.records.iter().map(|r| &r.name).collect();
        assert_eq!(read_names, built.names.iter().collect::<Vec<_>>());
        let width = |name: &str| file.records.iter().find(|r| r.name == name).and_then(|r| r.bits());
        assert_eq!(width("embedding"), Some(Bits::Three));
        assert_eq!(width("layer01.q_proj"), Some(Bits::Two));
        assert_eq!(width("layer01.k_proj"), Some(Bits::Four));
        assert_eq!(width("engram0.tables"), Some(Bits::Ternary));
        assert_eq!(width("mhc_phi_res"), Some(Bits::Four));
        assert_eq!(width("layer00.norm_in"), None);
        file.verify().unwrap();
        assert_eq!(
            bits,
            BitsChoice::Map {
                spec: ckpt.config.weight_bits.clone(),
                map: BitsMap::parse(&ckpt.config.weight_bits).unwrap()
            }
        );
    }

    #[test]
    fn a_missing_parameter_names_the_checkpoint_and_the_path() {
        let mut ckpt = random_checkpoint(&small_config(), false, 1).unwrap();
        ckpt.params.remove("stack/mhc_b_res");
        let err = build_cact(&ckpt, &BitsChoice::Uniform(Bits::Four), &placeholder_tokenizer_blob(32)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "<random seed 1>: no parameter `stack/mhc_b_res`; `needle build` needs a complete Needle 2 or Needle 3 checkpoint"
        );
    }

    #[test]
    fn a_tokenizer_of_another_vocabulary_is_refused() {
        let ckpt = random_checkpoint(&small_config(), false, 1).unwrap();
        let err = build_cact(&ckpt, &BitsChoice::Uniform(Bits::Four), &placeholder_tokenizer_blob(31)).unwrap_err();
        assert!(matches!(err.problem, BuildProblem::TokenizerVocab { tokenizer: 31, config: 32, .. }), "{err}");
    }

    #[test]
    fn a_kernel_of_the_wrong_rank_is_a_shape_error() {
        let mut ckpt = random_checkpoint(&small_config(), false, 1).unwrap();
        let k = ckpt.params.get_mut("engrams_0/key_proj/kernel").unwrap();
        k.shape = vec![k.shape.iter().product()];
        let err = build_cact(&ckpt, &BitsChoice::Uniform(Bits::Four), &placeholder_tokenizer_blob(32)).unwrap_err();
        assert!(matches!(err.problem, BuildProblem::BadShape { .. }), "{err}");
    }

    #[test]
    fn a_param_that_disagrees_with_the_config_is_refused_before_the_header_is_written() {
        let mut ckpt = random_checkpoint(&small_config(), false, 1).unwrap();
        let norm = ckpt.params.get_mut("stack/layers/block/post_attn_norm/scale").unwrap();
        norm.shape = vec![4, 16];
        let err = build_cact(&ckpt, &BitsChoice::Uniform(Bits::Four), &placeholder_tokenizer_blob(32)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "<random seed 1>: parameter `stack/layers/block/post_attn_norm/scale` has shape [4, 16] but the export \
             needs [2, 32]; the params do not match the config"
        );
    }

    #[test]
    fn an_empty_head_kernel_with_huge_dims_is_a_shape_error_not_a_4_tib_bias() {
        // A checkpoint made in code skips the reader's refusal of empty arrays; the export's own check
        // still stops the `[2^40, 0]` transposed kernel from sizing a zero bias of 2^40 floats.
        let mut ckpt = random_checkpoint(&small_config(), false, 1).unwrap();
        let zeros = |shape: Vec<usize>| {
            let data = vec![0; shape.iter().product::<usize>() * 4];
            NdArray { dtype: DType::F32, shape, data }
        };
        ckpt.params.insert("confidence_head/probes".into(), zeros(vec![8, 32]));
        ckpt.params.insert("confidence_head/proj/kernel".into(), zeros(vec![0, 1 << 40]));
        let err = check_params(&ckpt).unwrap_err();
        assert!(
            err.to_string().contains(
                "parameter `confidence_head/proj/kernel` has shape [0, 1099511627776] but the export needs [256, out ≥ 1]"
            ),
            "{err}"
        );
        ckpt.params.insert("confidence_head/proj/kernel".into(), zeros(vec![256, 1]));
        ckpt.params.insert("confidence_head/proj/bias".into(), zeros(vec![2]));
        let err = check_params(&ckpt).unwrap_err();
        assert!(
            err.to_string().contains("`confidence_head/proj/bias` has shape [2] but the export needs [1]"),
            "{err}"
        );
    }

    #[test]
    fn a_config_the_header_cannot_hold_is_refused_before_any_tensor() {
        let mut ckpt = random_checkpoint(&small_config(), false, 1).unwrap();
        ckpt.config.mhc_lanes = 1 << 40;
        let err = build_cact(&ckpt, &BitsChoice::Uniform(Bits::Four), &placeholder_tokenizer_blob(32)).unwrap_err();
        assert!(err.to_string().contains("`mhc_lanes` is 1099511627776; it must be in 1..=64"), "{err}");
    }

    #[test]
    fn writing_replaces_the_target_atomically_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.cact");
        std::fs::write(&path, b"old").unwrap();
        write_cact(&path, b"new contents").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"new contents");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        // A folder that cannot be made (a file stands in its place) is an error naming the path.
        let err = write_cact(&path.join("x.cact"), b"x").unwrap_err();
        assert!(err.to_string().contains("model.cact/x.cact"), "{err}");
    }
}
