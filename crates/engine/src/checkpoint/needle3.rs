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
