//! Builds a `.cact` from a checkpoint: canonical tensor order, header, directory, aligned blobs,
//! written atomically.

use std::path::{Path, PathBuf};

use half::f16;
use rayon::prelude::*;
use thiserror::Error;

use super::bits::BitsChoice;
use super::geometry::{effective_kv_window, Geometry, GeometryError, MAX_HEADER_LIST};
use super::layout::{self, HEAD_CODES, LAYER_TENSORS, MHC_FP16_TENSORS, MHC_PHI_TENSORS};
use super::quant::{self, Bits, GROUP};
use super::{align_up, TensorKind, HEADER_LEN, MAX_NDIM, RECORD_LEN, TAG};
use crate::checkpoint::{Checkpoint, DType, NdArray};
use crate::config::ENGRAM_CONV_TAPS;
use crate::model::{ModelError, Network};
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
    #[error("no parameter `{path}`; `needle build` needs a Needle 2 format-v2 checkpoint")]
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
    #[error("the tokenizer has {tokenizer} pieces but the config's vocab_size is {config}; pass the tokenizer the model was trained with (--tokenizer)")]
    TokenizerVocab { tokenizer: usize, config: usize },
    #[error("{0}; the tokenizer did not serialise")]
    TokenizerBlob(TokenizerError),
    #[error("tensor `{name}` has {ndim} dimensions; a .cact directory record holds at most {MAX_NDIM}")]
    TooManyDims { name: String, ndim: usize },
    #[error("{what} = {value} does not fit the .cact header's u32 field")]
    TooLarge { what: String, value: usize },
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
struct Param {
    path: String,
    shape: Vec<usize>,
    values: Vec<f32>,
}

impl Param {
    fn load(ckpt: &Checkpoint, path: &str) -> Result<Self, BuildProblem> {
        let arr = ckpt.params.get(path).ok_or_else(|| BuildProblem::MissingParam { path: path.into() })?;
        Self::from_array(path, arr)
    }

    fn from_array(path: &str, arr: &NdArray) -> Result<Self, BuildProblem> {
        if !matches!(arr.dtype, DType::F16 | DType::F32) {
            return Err(BuildProblem::UnsupportedDtype { path: path.into(), dtype: arr.dtype });
        }
        let param = Self { path: path.into(), shape: arr.shape.clone(), values: arr.to_f32() };
        if param.values.len() != param.shape.iter().product::<usize>() {
            return Err(param.bad_shape(format!("{} elements for its shape", param.values.len())));
        }
        Ok(param)
    }

    fn bad_shape(&self, expected: impl Into<String>) -> BuildProblem {
        bad_shape(&self.path, &self.shape, expected.into())
    }

    /// Element `index` along the leading (stacked-layers) axis.
    fn layer(&self, index: usize) -> Result<Param, BuildProblem> {
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

    fn reshaped(mut self, shape: Vec<usize>) -> Result<Param, BuildProblem> {
        if shape.iter().product::<usize>() != self.values.len() {
            return Err(self.bad_shape(format!("{} elements (shape {shape:?})", shape.iter().product::<usize>())));
        }
        self.shape = shape;
        Ok(self)
    }

    /// A `[in, out]` kernel as the `[out, in]` matrix the runtime streams. Copied in square tiles so
    /// both the reads and the writes stay within a few cache lines.
    fn transposed(&self) -> Result<Param, BuildProblem> {
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

    /// The mHC phi stack `[L, nC, lanes]` as `[L*lanes, nC]`: `phi.transpose(0, 2, 1).reshape(...)`.
    fn phi_rows(&self) -> Result<Param, BuildProblem> {
        let &[layers, n_c, lanes] = self.shape.as_slice() else {
            return Err(self.bad_shape("a 3-D [layers, nC, lanes] array"));
        };
        let mut values = Vec::with_capacity(self.values.len());
        for l in 0..layers {
            let block = &self.values[l * n_c * lanes..(l + 1) * n_c * lanes];
            for lane in 0..lanes {
                values.extend((0..n_c).map(|c| block[c * lanes + lane]));
            }
        }
        Ok(Param { path: self.path.clone(), shape: vec![layers * lanes, n_c], values })
    }
}

/// One encoded tensor, ready to be placed.
struct Tensor {
    name: String,
    kind: TensorKind,
    shape: Vec<usize>,
    blob: Vec<u8>,
}

fn fp16_tensor(name: impl Into<String>, p: &Param) -> Tensor {
    let blob = p.values.iter().flat_map(|&v| f16::from_f32(v).to_le_bytes()).collect();
    Tensor { name: name.into(), kind: TensorKind::Fp16, shape: p.shape.clone(), blob }
}

fn cq_tensor(name: impl Into<String>, matrix: &Param, bits: &BitsChoice) -> Result<Tensor, BuildProblem> {
    let name = name.into();
    let &[_, in_dim] = matrix.shape.as_slice() else {
        return Err(matrix.bad_shape("a 2-D matrix"));
    };
    let width: Bits = bits.bits_for(&name);
    let blob = quant::cq_encode(&matrix.values, in_dim, width);
    Ok(Tensor { name, kind: TensorKind::Cq(width), shape: matrix.shape.clone(), blob })
}

/// The stacked per-layer block every layer's tensors are sliced from.
const BLOCK: &str = "stack/layers/block";

fn layer_tensors(ckpt: &Checkpoint, bits: &BitsChoice, out: &mut Vec<Tensor>) -> Result<(), BuildProblem> {
    let stacked: Vec<Param> =
        LAYER_TENSORS.iter().map(|t| Param::load(ckpt, &format!("{BLOCK}/{}", t.path))).collect::<Result<_, _>>()?;
    // Layers are independent: slicing and transposing them in parallel keeps both cores busy
    // between the row-parallel quantizations.
    let layers: Vec<Vec<Tensor>> = (0..ckpt.config.num_layers)
        .into_par_iter()
        .map(|layer| one_layer(layer, &stacked, bits))
        .collect::<Result<_, _>>()?;
    out.extend(layers.into_iter().flatten());
    Ok(())
}

fn one_layer(layer: usize, stacked: &[Param], bits: &BitsChoice) -> Result<Vec<Tensor>, BuildProblem> {
    LAYER_TENSORS
        .iter()
        .zip(stacked)
        .map(|(spec, param)| {
            let name = layout::layer_name(layer, spec.name);
            let slice = param.layer(layer)?;
            if spec.kernel {
                cq_tensor(name, &slice.transposed()?, bits)
            } else if spec.name == "attn_gate" {
                // A per-layer scalar, stored as a 1-element vector.
                Ok(fp16_tensor(name, &slice.reshaped(vec![1])?))
            } else {
                Ok(fp16_tensor(name, &slice))
            }
        })
        .collect()
}

fn mhc_tensors(ckpt: &Checkpoint, bits: &BitsChoice, out: &mut Vec<Tensor>) -> Result<(), BuildProblem> {
    for name in MHC_FP16_TENSORS {
        out.push(fp16_tensor(name, &Param::load(ckpt, &format!("stack/{name}"))?));
    }
    for name in MHC_PHI_TENSORS {
        out.push(cq_tensor(name, &Param::load(ckpt, &format!("stack/{name}"))?.phi_rows()?, bits)?);
    }
    Ok(())
}

fn engram_tensors(
    ckpt: &Checkpoint,
    geo: &Geometry,
    bits: &BitsChoice,
    out: &mut Vec<Tensor>,
) -> Result<(), BuildProblem> {
    for site in 0..geo.sites.len() {
        let prefix = format!("engrams_{site}");
        let tables = Param::load(ckpt, &format!("{prefix}/embedding"))?
            .reshaped(vec![geo.engram.tables * ckpt.config.engram_slots, geo.engram.sub_dim])?;
        let key = Param::load(ckpt, &format!("{prefix}/key_proj/kernel"))?.transposed()?;
        let value = Param::load(ckpt, &format!("{prefix}/value_proj/kernel"))?.transposed()?;
        out.push(cq_tensor(layout::engram_name(site, "tables"), &tables, bits)?);
        out.push(cq_tensor(layout::engram_name(site, "key_proj"), &key, bits)?);
        out.push(cq_tensor(layout::engram_name(site, "value_proj"), &value, bits)?);
        out.push(fp16_tensor(layout::engram_name(site, "taps"), &Param::load(ckpt, &format!("{prefix}/taps"))?));
    }
    Ok(())
}

/// The optional probe heads: a manifest of head codes, then `probes, proj (transposed), bias` per head,
/// all FP16. A head without a bias gets zeros, as the reference writes.
fn head_tensors(ckpt: &Checkpoint, out: &mut Vec<Tensor>) -> Result<(), BuildProblem> {
    let present: Vec<(&str, u16)> = HEAD_CODES.iter().copied().filter(|(key, _)| has_head(ckpt, key)).collect();
    if present.is_empty() {
        return Ok(());
    }
    let codes: Vec<f32> = present.iter().map(|&(_, c)| f32::from(c)).collect();
    let manifest = Param { path: layout::HEADS_MANIFEST.into(), shape: vec![codes.len()], values: codes };
    out.push(fp16_tensor(layout::HEADS_MANIFEST, &manifest));
    for (key, _) in present {
        let probes = Param::load(ckpt, &format!("{key}/probes"))?;
        let kernel = Param::load(ckpt, &format!("{key}/proj/kernel"))?.transposed()?;
        let bias_path = format!("{key}/proj/bias");
        let bias = if ckpt.params.contains_key(&bias_path) {
            Param::load(ckpt, &bias_path)?
        } else {
            Param { path: bias_path, shape: vec![kernel.shape[0]], values: vec![0.0; kernel.shape[0]] }
        };
        out.push(fp16_tensor(format!("{key}.probes"), &probes));
        out.push(fp16_tensor(format!("{key}.proj"), &kernel));
        out.push(fp16_tensor(format!("{key}.bias"), &bias));
    }
    Ok(())
}

/// Whether the checkpoint has the probe head `key` (any parameter under `key/`).
fn has_head(ckpt: &Checkpoint, key: &str) -> bool {
    let dir = format!("{key}/");
    ckpt.params.keys().any(|p| p.starts_with(&dir))
}

/// Checks every parameter the export reads against the shape a network of the config reads
/// ([`Network::param_shapes`], the one parameter tree), and each probe head against the layout the
/// format stores (`probes [P, d_model]`, `proj/kernel [P·d_model, out]`, `proj/bias [out]`), before
/// anything is sliced, transposed, merged or allocated from a parameter's dimensions. After it, the
/// header (written from the config) and the tensors (from the params) agree, and every size the
/// export derives is backed by data in the file.
pub fn check_params(ckpt: &Checkpoint) -> Result<(), BuildError> {
    check_shapes(ckpt).map_err(|problem| BuildError { checkpoint: ckpt.source.clone(), problem })
}

fn check_shapes(ckpt: &Checkpoint) -> Result<(), BuildProblem> {
    Geometry::of(&ckpt.config)?;
    let tree = Network::param_shapes(&ckpt.config).map_err(|e| BuildProblem::Model(Box::new(e)))?;
    for (path, expected) in tree {
        expect_shape(ckpt, &path, &expected, || format!("{expected:?}"))?;
    }
    let d = ckpt.config.d_model;
    for (key, _) in HEAD_CODES.iter().filter(|(key, _)| has_head(ckpt, key)) {
        // The probe count P and the output width are the head's own; d_model is the config's.
        let probes_path = format!("{key}/probes");
        let probes = param_shape(ckpt, &probes_path)?;
        let rows = match *probes {
            [p, width] if p > 0 && width == d => p.checked_mul(d),
            _ => None,
        }
        .ok_or_else(|| bad_shape(&probes_path, probes, format!("[P ≥ 1, {d}] (d_model {d})")))?;
        let kernel_path = format!("{key}/proj/kernel");
        let kernel = param_shape(ckpt, &kernel_path)?;
        let out = match *kernel {
            [r, out] if r == rows && out > 0 => out,
            _ => return Err(bad_shape(&kernel_path, kernel, format!("[{rows}, out ≥ 1] (P × d_model rows)"))),
        };
        let bias_path = format!("{key}/proj/bias");
        if ckpt.params.contains_key(&bias_path) {
            expect_shape(ckpt, &bias_path, &[out], || format!("[{out}] (proj/kernel's output width)"))?;
        }
    }
    Ok(())
}

fn param_shape<'c>(ckpt: &'c Checkpoint, path: &str) -> Result<&'c [usize], BuildProblem> {
    ckpt.params.get(path).map(|a| a.shape.as_slice()).ok_or_else(|| BuildProblem::MissingParam { path: path.into() })
}

fn expect_shape(
    ckpt: &Checkpoint,
    path: &str,
    expected: &[usize],
    describe: impl FnOnce() -> String,
) -> Result<(), BuildProblem> {
    let found = param_shape(ckpt, path)?;
    if found == expected {
        Ok(())
    } else {
        Err(bad_shape(path, found, describe()))
    }
}

fn bad_shape(path: &str, found: &[usize], expected: String) -> BuildProblem {
    BuildProblem::BadShape { path: path.into(), expected, found: found.to_vec() }
}

/// Every tensor of the export in canonical order (the tokenizer is appended by the caller).
fn canonical_tensors(ckpt: &Checkpoint, geo: &Geometry, bits: &BitsChoice) -> Result<Vec<Tensor>, BuildProblem> {
    let embedding = Param::load(ckpt, "embedding/embedding")?;
    let mut out = vec![cq_tensor("embedding", &embedding, bits)?];
    layer_tensors(ckpt, bits, &mut out)?;
    mhc_tensors(ckpt, bits, &mut out)?;
    engram_tensors(ckpt, geo, bits, &mut out)?;
    out.push(fp16_tensor(layout::FINAL_NORM, &Param::load(ckpt, "stack/final_norm/scale")?));
    head_tensors(ckpt, &mut out)?;
    Ok(out)
}

fn tokenizer_tensor(blob: &[u8], vocab_size: usize) -> Result<Tensor, BuildProblem> {
    let pieces = tokenizer::cact_blob_stated_pieces(blob).map_err(BuildProblem::TokenizerBlob)? as usize;
    if pieces != vocab_size {
        return Err(BuildProblem::TokenizerVocab { tokenizer: pieces, config: vocab_size });
    }
    Ok(Tensor { name: layout::TOKENIZER.into(), kind: TensorKind::Raw, shape: vec![], blob: blob.to_vec() })
}

fn u32_field(what: &str, value: usize) -> Result<u32, BuildProblem> {
    u32::try_from(value).map_err(|_| BuildProblem::TooLarge { what: what.into(), value })
}

/// Pads a list to the header's four slots.
fn four_slots(what: &str, values: &[usize]) -> Result<[u32; MAX_HEADER_LIST], BuildProblem> {
    let mut slots = [0u32; MAX_HEADER_LIST];
    for (slot, &v) in slots.iter_mut().zip(values) {
        *slot = u32_field(what, v)?;
    }
    Ok(slots)
}

fn header_bytes(
    ckpt: &Checkpoint,
    geo: &Geometry,
    num_tensors: usize,
    codebooks: &[f32],
) -> Result<Vec<u8>, BuildProblem> {
    let cfg = &ckpt.config;
    let kv_bits = if cfg.kv_bits == 0 { 8 } else { cfg.kv_bits };
    let fields: Vec<u32> = [
        ("num_tensors", num_tensors),
        ("codebook_len", codebooks.len()),
        ("kv_window", effective_kv_window(cfg)?),
        ("kv_bits", kv_bits as usize),
        ("vocab_size", cfg.vocab_size),
        ("d_model", cfg.d_model),
        ("num_heads", cfg.num_heads),
        ("num_kv_heads", cfg.num_kv_heads),
        ("num_layers", cfg.num_layers),
        ("head_dim", geo.head_dim),
        ("max_seq_len", cfg.max_seq_len),
        ("hada_n", geo.hada_n),
        ("mhc_lanes", cfg.mhc_lanes),
        ("engram_slots", cfg.engram_slots),
        ("engram_sub_dim", geo.engram.sub_dim),
        ("num_engram_tables", geo.engram.tables),
        ("engram_conv_taps", ENGRAM_CONV_TAPS),
        ("engram_conv_dilation", geo.engram.dilation),
        ("num_engram_orders", geo.orders.len()),
    ]
    .iter()
    .map(|&(what, v)| u32_field(what, v))
    .chain(four_slots("engram_orders", &geo.orders)?.map(Ok))
    .chain(std::iter::once(u32_field("num_engram_sites", geo.sites.len())))
    .chain(four_slots("engram_layers", &geo.sites)?.map(Ok))
    .collect::<Result<_, _>>()?;
    let mut bytes = Vec::with_capacity(HEADER_LEN + codebooks.len() * 4);
    bytes.extend_from_slice(&TAG.to_le_bytes());
    fields.iter().for_each(|f| bytes.extend_from_slice(&f.to_le_bytes()));
    bytes.extend_from_slice(&(cfg.rope_theta as f32).to_le_bytes());
    debug_assert_eq!(bytes.len(), HEADER_LEN);
    codebooks.iter().for_each(|c| bytes.extend_from_slice(&c.to_le_bytes()));
    Ok(bytes)
}

fn directory_record(t: &Tensor, offset: usize) -> Result<[u8; RECORD_LEN], BuildProblem> {
    if t.shape.len() > MAX_NDIM {
        return Err(BuildProblem::TooManyDims { name: t.name.clone(), ndim: t.shape.len() });
    }
    let (group, bits) = match t.kind {
        TensorKind::Cq(b) => (GROUP as u32, b.record_bits()),
        _ => (0, 0),
    };
    let mut rec = [0u8; RECORD_LEN];
    rec[0] = t.kind.code();
    rec[1] = t.shape.len() as u8;
    for (i, &dim) in t.shape.iter().enumerate() {
        rec[4 + 4 * i..8 + 4 * i].copy_from_slice(&u32_field(&format!("{} dimension {i}", t.name), dim)?.to_le_bytes());
    }
    rec[20..28].copy_from_slice(&(offset as u64).to_le_bytes());
    rec[28..36].copy_from_slice(&(t.blob.len() as u64).to_le_bytes());
    rec[36..40].copy_from_slice(&group.to_le_bytes());
    rec[40..44].copy_from_slice(&bits.to_le_bytes());
    Ok(rec)
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

/// Lays the checkpoint out as a `.cact` exactly as the reference's `_pack_cact` does.
/// `tokenizer_blob` is the RAW tokenizer dump (`Tokenizer::to_cact_blob`); its piece count must
/// equal the config's `vocab_size`.
pub fn build_cact(ckpt: &Checkpoint, bits: &BitsChoice, tokenizer_blob: &[u8]) -> Result<BuiltCact, BuildError> {
    pack(ckpt, bits, tokenizer_blob).map_err(|problem| BuildError { checkpoint: ckpt.source.clone(), problem })
}

fn pack(ckpt: &Checkpoint, bits: &BitsChoice, tokenizer_blob: &[u8]) -> Result<BuiltCact, BuildProblem> {
    let geo = Geometry::of(&ckpt.config)?;
    check_shapes(ckpt)?;
    let mut tensors = canonical_tensors(ckpt, &geo, bits)?;
    tensors.push(tokenizer_tensor(tokenizer_blob, ckpt.config.vocab_size)?);
    let mut bytes = header_bytes(ckpt, &geo, tensors.len(), &quant::header_codebooks())?;

    let mut offsets = Vec::with_capacity(tensors.len());
    let mut pos = bytes.len() + tensors.len() * RECORD_LEN;
    for t in &tensors {
        pos = align_up(pos);
        offsets.push(pos);
        pos += t.blob.len();
    }
    for (t, &offset) in tensors.iter().zip(&offsets) {
        bytes.extend_from_slice(&directory_record(t, offset)?);
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
            "<random seed 1>: no parameter `stack/mhc_b_res`; `needle build` needs a Needle 2 format-v2 checkpoint"
        );
    }

    #[test]
    fn a_tokenizer_of_another_vocabulary_is_refused() {
        let ckpt = random_checkpoint(&small_config(), false, 1).unwrap();
        let err = build_cact(&ckpt, &BitsChoice::Uniform(Bits::Four), &placeholder_tokenizer_blob(31)).unwrap_err();
        assert!(matches!(err.problem, BuildProblem::TokenizerVocab { tokenizer: 31, config: 32 }), "{err}");
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
