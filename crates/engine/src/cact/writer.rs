//! Builds a `.cact` from a checkpoint: its generation's tensors ([`super::tensors`], in the order
//! [`super::layout`] gives) framed by the header, the directory and aligned blobs
//! ([`super::format`](mod@super::format)), written atomically.

use std::path::{Path, PathBuf};

use thiserror::Error;

use super::bits::BitsChoice;
use super::encode::{tokenizer_tensor, BuildError, BuildProblem};
use super::format::{align_up, RECORD_LEN};
use super::geometry::Geometry;
use super::tensors;
use crate::checkpoint::Checkpoint;
use crate::quant;

/// The `.cact` could not be written.
#[derive(Debug, Error)]
#[error("cannot write {}: {source}; check that the directory exists and is writable", path.display())]
pub struct WriteError {
    pub path: PathBuf,
    pub source: std::io::Error,
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
pub(in crate::cact) mod tests {
    use super::*;
    use crate::cact::synthetic::{placeholder_tokenizer_blob, random_checkpoint};
    use crate::cact::tensors::check_params;
    use crate::checkpoint::{DType, NdArray};
    use crate::config::ModelConfig;
    use crate::quant::Bits;

    /// A model small enough to build in a test, with an engram site and two lanes.
    pub(in crate::cact) fn small_config() -> ModelConfig {
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
