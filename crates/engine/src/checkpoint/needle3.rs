//! Needle 3 checkpoints (cactus-needle 3.x's `write_checkpoint`): a safetensors file whose tensors
//! are the params under their `/`-joined flax paths, with `format_version`, the model's `config`
//! (JSON), `step` and `run` as string metadata.

use std::collections::{BTreeMap, HashMap};

use safetensors::Dtype;

use super::safetensors_file;
use super::{Checkpoint, CheckpointError, DType, FileReader, NdArray, FORMAT_VERSION};
use crate::config::ModelConfig;
use crate::generation::Generation;

/// Keys of a Needle 2 config that Needle 3's `TransformerConfig` lacks, so `from_saved` drops them
/// (a stray `attn_dim` would otherwise set the head widths).
const NEEDLE2_ONLY: [&str; 2] = ["attn_dim", "contrastive_dim"];

/// The metadata that makes a safetensors file a Needle 3 checkpoint (3.x's `write_checkpoint`).
pub(super) const CHECKPOINT_METADATA: [&str; 2] = ["format_version", "config"];

/// A safetensors header's string metadata, from bytes that may stop after the header (the tensors
/// are not read); `None` when the header is not there or not JSON.
pub(super) fn header_metadata(bytes: &[u8]) -> Option<HashMap<String, String>> {
    #[derive(serde::Deserialize)]
    struct Header {
        #[serde(rename = "__metadata__")]
        metadata: Option<HashMap<String, String>>,
    }
    let len = usize::try_from(u64::from_le_bytes(*bytes.first_chunk::<8>()?)).ok()?;
    let json = bytes.get(8..8usize.checked_add(len)?)?;
    // Only the metadata is read; the tensor entries beside it are left as they are.
    serde_json::from_slice::<Header>(json).ok()?.metadata
}

impl FileReader<'_> {
    pub(super) fn needle3_checkpoint(&self, bytes: &[u8]) -> Result<Checkpoint, CheckpointError> {
        let (tensors, metadata) = safetensors_file::parse(bytes)
            .map_err(|problem| CheckpointError::Safetensors { path: self.path.to_owned(), problem })?;
        if let Some(key) = CHECKPOINT_METADATA.into_iter().find(|key| !metadata.contains_key(*key)) {
            return Err(CheckpointError::NoCheckpointMetadata { path: self.path.to_owned(), key });
        }
        let text = |key: &str| metadata.get(key).map(String::as_str).unwrap_or_default();
        if text("format_version") != FORMAT_VERSION.to_string() {
            let found = format!("{:?}", text("format_version"));
            let generation = Generation::Needle3;
            return Err(CheckpointError::FormatVersion { path: self.path.to_owned(), found, generation });
        }
        let config = self.needle3_config(text("config"))?;
        let step = match text("step") {
            "" => None,
            step => Some(step.parse::<i64>().map_err(|e| self.config_value("step", e.to_string()))?),
        };
        // In name order, so that the first bad tensor reported is the same on every read.
        let mut views = tensors.tensors();
        views.sort_by(|(a, _), (b, _)| a.cmp(b));
        // 3.x's `load_checkpoint` leaves the multi-token-prediction block out: nothing reads it.
        let params = views
            .into_iter()
            .filter(|(name, _)| !name.starts_with("mtp_"))
            .map(|(name, view)| {
                // Kept in its stored type: `needle build` merges an adapter in it, as 3.x does;
                // everything else widens it to float32.
                let dtype = match view.dtype() {
                    Dtype::F32 => DType::F32,
                    Dtype::F16 => DType::F16,
                    Dtype::BF16 => DType::BF16,
                    other => {
                        let (path, dtype) = (self.path.to_owned(), format!("{other:?}"));
                        return Err(CheckpointError::ParamDtype { path, name, dtype });
                    }
                };
                let array = NdArray { dtype, shape: view.shape().to_vec(), data: view.data().to_vec() };
                Ok((name.clone(), self.weight(&name, array)?))
            })
            .collect::<Result<BTreeMap<_, _>, _>>()?;
        Ok(Checkpoint { source: self.path.to_owned(), params, config, step })
    }

    /// The `config` metadata over Needle 3's defaults.
    fn needle3_config(&self, json: &str) -> Result<ModelConfig, CheckpointError> {
        let fields = match serde_json::from_str(json) {
            Ok(serde_json::Value::Object(fields)) => fields,
            Ok(_) => return Err(self.config_value("config", "is not a JSON object of TransformerConfig fields".into())),
            Err(e) => return Err(self.config_value("config", format!("is not JSON: {e}"))),
        };
        let known = super::config_field_names();
        let fields = fields.into_iter().filter(|(key, _)| known.contains(key) && !NEEDLE2_ONLY.contains(&key.as_str()));
        self.config_from_json(fields.collect(), ModelConfig::needle3_defaults())
    }

    fn config_value(&self, key: &str, problem: String) -> CheckpointError {
        CheckpointError::ConfigValue { path: self.path.to_owned(), key: key.into(), problem }
    }
}

#[cfg(test)]
mod tests {
    use safetensors::tensor::TensorView;

    use super::super::{file_generation, generation};
    use super::*;

    /// A Needle 3 checkpoint of one tensor `w` holding `data` (as `dtype`), with `metadata` beside a
    /// filler entry that makes its header length `header_len` (a multiple of 8).
    fn checkpoint(dtype: Dtype, shape: &[usize], data: &[u8], metadata: &[(&str, &str)], header_len: u64) -> Vec<u8> {
        (0..1024)
            .map(|width| {
                let mut entries: HashMap<String, String> =
                    metadata.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
                entries.insert("filler".into(), "x".repeat(width));
                let view = TensorView::new(dtype, shape.to_vec(), data).unwrap();
                safetensors::serialize([("w", view)], &Some(entries)).unwrap()
            })
            .find(|bytes| bytes[..8] == header_len.to_le_bytes())
            .expect("a filler width gives the header length")
    }

    const SOUND: [(&str, &str); 2] = [("format_version", "2"), ("config", "{}")];

    fn load(bytes: &[u8]) -> (Result<Checkpoint, CheckpointError>, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.safetensors");
        std::fs::write(&path, bytes).unwrap();
        (Checkpoint::load(&path), dir)
    }

    fn f32_bytes(values: &[f32]) -> Vec<u8> {
        values.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    #[test]
    fn a_header_length_whose_low_byte_is_a_pickles_mark_is_still_safetensors() {
        // 0x280: byte 0 is 0x80 and byte 1 is 2, a protocol-2 pickle's first two bytes.
        let bytes = checkpoint(Dtype::F32, &[2], &f32_bytes(&[1.0, 2.0]), &SOUND, 0x280);
        assert_eq!(bytes[..2], [0x80, 0x02]);
        assert_eq!(generation(&bytes), Some(Generation::Needle3));
        let (loaded, dir) = load(&bytes);
        assert_eq!(loaded.unwrap().params["w"].to_f32(), [1.0, 2.0]);
        assert_eq!(file_generation(&dir.path().join("model.safetensors")), Some(Generation::Needle3));
        // Cut short, it is a damaged safetensors file, not a broken pickle.
        let (cut, _dir) = load(&bytes[..bytes.len() - 4]);
        let message = cut.unwrap_err().to_string();
        assert!(message.contains("is not a readable safetensors file: tensor `w` ends at byte"), "{message}");
        assert!(!message.contains("pickle"), "{message}");
    }

    #[test]
    fn another_format_version_is_not_sent_to_needle_2() {
        let bytes = checkpoint(Dtype::F32, &[1], &f32_bytes(&[1.0]), &[("format_version", "3"), ("config", "{}")], 256);
        let message = load(&bytes).0.unwrap_err().to_string();
        assert!(message.contains("format_version=\"3\"") && message.contains("cactus-needle 3.x"), "{message}");
        assert!(!message.contains("2.x"), "{message}");
    }

    #[test]
    fn a_safetensors_file_without_checkpoint_metadata_is_named_as_such() {
        let bytes = checkpoint(Dtype::F32, &[1], &f32_bytes(&[1.0]), &[("format_version", "2")], 256);
        let error = load(&bytes).0.unwrap_err();
        assert!(matches!(error, CheckpointError::NoCheckpointMetadata { key: "config", .. }), "{error}");
    }

    #[test]
    fn a_non_finite_weight_is_refused_with_its_name_and_place() {
        let nan = checkpoint(Dtype::F32, &[2, 2], &f32_bytes(&[0.0, 1.0, f32::INFINITY, 2.0]), &SOUND, 256);
        let message = load(&nan).0.unwrap_err().to_string();
        assert!(message.contains("`w` holds inf at [1, 0]; weights must be finite numbers"), "{message}");
        // A bfloat16 NaN (0x7FC0).
        let bf16: Vec<u8> = [0x3F80u16, 0x7FC0].iter().flat_map(|v| v.to_le_bytes()).collect();
        let message = load(&checkpoint(Dtype::BF16, &[2], &bf16, &SOUND, 256)).0.unwrap_err().to_string();
        assert!(message.contains("`w` holds NaN at [1]"), "{message}");
    }

    #[test]
    fn a_file_of_neither_kind_says_what_it_begins_with() {
        let (error, _dir) = load(b"version https://git-lfs.github.com/spec/v1\n");
        let message = error.unwrap_err().to_string();
        assert!(message.contains("is neither a Needle 2 checkpoint"), "{message}");
        assert!(message.contains("it begins with the bytes 76 65 72 73"), "{message}");
    }
}
