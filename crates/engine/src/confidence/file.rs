//! The trained head kept beside its adapter: `<adapter>.head.safetensors`, the head's parameters
//! under their checkpoint names (`confidence_head/proj/kernel`) in float32, and in its metadata
//! the calibration and which sequence the head reads. A companion file, not tensors in the
//! adapter: 3.2.8's `read_adapter` takes every tensor of an adapter for a LoRA factor, and its
//! `needle build --lora` fails on one without `A`/`B`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};

use super::fit::Calibration;
use super::head::{ConfidenceHead, KEY};
use crate::atomic::write_atomically;
use crate::config::ModelConfig;
use crate::generation::Generation;

/// What follows the adapter's file name.
pub const SUFFIX: &str = ".head.safetensors";

/// The sequence the head reads for a turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reading {
    /// BOS and the prompt: how hard the request is, before any answer.
    Prompt,
    /// BOS, the prompt and the answer the model gave, as it wrote it (up to its `<|im_end|>`).
    PromptAndAnswer,
}

impl Reading {
    pub fn as_str(self) -> &'static str {
        match self {
            Reading::Prompt => "prompt",
            Reading::PromptAndAnswer => "prompt_and_answer",
        }
    }

    /// The tokens the head reads of a turn: `prompt` (BOS first), then `answer` where it reads it.
    pub fn tokens(self, prompt: &[u32], answer: &[u32]) -> Vec<u32> {
        match self {
            Reading::Prompt => prompt.to_vec(),
            Reading::PromptAndAnswer => [prompt, answer].concat(),
        }
    }
}

/// A head fitted to a tuned model, as it is kept and shipped.
#[derive(Debug, Clone)]
pub struct TrainedHead {
    pub head: ConfidenceHead,
    pub calibration: Calibration,
    pub reads: Reading,
}

#[derive(Debug, thiserror::Error)]
pub enum HeadFileError {
    #[error("{}: {problem}", path.display())]
    Invalid { path: PathBuf, problem: String },
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
}

/// The companion file of `adapter`.
pub fn companion_path(adapter: &Path) -> PathBuf {
    let mut name = adapter.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(SUFFIX);
    adapter.with_file_name(name)
}

const SCALE: &str = "calibration_scale";
const SHIFT: &str = "calibration_shift";
const READS: &str = "reads";
const GENERATION: &str = "generation";

impl TrainedHead {
    /// Writes the head to `path` atomically.
    pub fn save(&self, path: &Path) -> Result<(), HeadFileError> {
        let invalid = |problem: String| HeadFileError::Invalid { path: path.into(), problem };
        let mut buffers = Vec::new();
        for (name, tensor) in self.head.named() {
            let values = tensor.flatten_all().and_then(|t| t.to_vec1::<f32>()).map_err(|e| invalid(e.to_string()))?;
            let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
            buffers.push((format!("{KEY}/{name}"), tensor.dims().to_vec(), bytes));
        }
        let views = buffers
            .iter()
            .map(|(name, shape, bytes)| Ok((name.clone(), TensorView::new(Dtype::F32, shape.clone(), bytes)?)))
            .collect::<Result<Vec<_>, safetensors::SafeTensorError>>()
            .map_err(|e| invalid(e.to_string()))?;
        let generation = match self.head.generation() {
            Generation::Needle2 => "2",
            Generation::Needle3 => "3",
        };
        let metadata = HashMap::from([
            (SCALE.to_string(), format!("{:?}", self.calibration.scale)),
            (SHIFT.to_string(), format!("{:?}", self.calibration.shift)),
            (READS.to_string(), self.reads.as_str().to_string()),
            (GENERATION.to_string(), generation.to_string()),
        ]);
        let bytes = safetensors::serialize(views, &Some(metadata)).map_err(|e| invalid(e.to_string()))?;
        write_atomically(path, &bytes).map_err(|source| HeadFileError::Io { path: path.into(), source })
    }

    /// Reads a head written by [`TrainedHead::save`].
    pub fn load(path: &Path) -> Result<Self, HeadFileError> {
        let invalid = |problem: String| HeadFileError::Invalid { path: path.into(), problem };
        let bytes = std::fs::read(path).map_err(|source| HeadFileError::Io { path: path.into(), source })?;
        let file = SafeTensors::deserialize(&bytes).map_err(|e| invalid(format!("not a safetensors file ({e})")))?;
        let (_, header) = SafeTensors::read_metadata(&bytes).map_err(|e| invalid(e.to_string()))?;
        let metadata = header.metadata().clone().unwrap_or_default();
        let field = |key: &str| {
            metadata.get(key).ok_or_else(|| {
                invalid(format!("the metadata has no `{key}`; write the head again with `needle finetune`"))
            })
        };
        let number = |key: &str| {
            field(key)?
                .parse::<f64>()
                .ok()
                .filter(|v| v.is_finite())
                .ok_or_else(|| invalid(format!("the metadata's `{key}` is not a finite number")))
        };
        let calibration = Calibration { scale: number(SCALE)?, shift: number(SHIFT)? };
        let reads = match field(READS)?.as_str() {
            "prompt" => Reading::Prompt,
            "prompt_and_answer" => Reading::PromptAndAnswer,
            other => return Err(invalid(format!("`{READS}` is {other:?}; it must be prompt or prompt_and_answer"))),
        };
        let generation = match field(GENERATION)?.as_str() {
            "2" => Generation::Needle2,
            "3" => Generation::Needle3,
            other => return Err(invalid(format!("`{GENERATION}` is {other:?}; it must be 2 or 3"))),
        };
        let names: Vec<&str> = match generation {
            Generation::Needle2 => vec!["probes", "proj/kernel", "proj/bias"],
            Generation::Needle3 => vec!["probes", "gain", "query", "row_bias", "proj/kernel", "proj/bias"],
        };
        let tensors = names
            .iter()
            .map(|name| {
                let key = format!("{KEY}/{name}");
                let view = file.tensor(&key).map_err(|_| invalid(format!("no tensor `{key}`")))?;
                if view.dtype() != Dtype::F32 {
                    return Err(invalid(format!("`{key}` is {:?}; the head is stored in F32", view.dtype())));
                }
                let values: Vec<f32> =
                    view.data().chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
                Tensor::from_vec(values, view.shape(), &Device::Cpu).map_err(|e| invalid(format!("`{key}`: {e}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let head = ConfidenceHead::from_tensors(generation, tensors);
        head.check_shapes().map_err(invalid)?;
        Ok(Self { head, calibration, reads })
    }

    /// Why the head cannot serve a model of `cfg`, if it cannot: it is of another generation, or its
    /// shapes are not those of the head such a model has (its width, its depth rows, its probes and
    /// queries).
    pub fn misfit(&self, cfg: &ModelConfig) -> Option<String> {
        let generation = self.head.generation();
        if generation != cfg.generation {
            return Some(format!(
                "the head is a Needle {} head but the model is Needle {}",
                generation.number(),
                cfg.generation.number()
            ));
        }
        let shapes = |head: &ConfidenceHead| head.tensors().iter().map(|t| t.dims().to_vec()).collect::<Vec<_>>();
        let expected = match ConfidenceHead::initial(cfg, &Device::Cpu, 0) {
            Ok(head) => shapes(&head),
            Err(e) => return Some(format!("no head fits a model of this config ({e})")),
        };
        let found = shapes(&self.head);
        (found != expected).then(|| {
            format!(
                "the head's shapes {found:?} do not fit a model of d_model {} with {} depth rows, whose head has {expected:?}",
                cfg.d_model,
                cfg.num_layers + 1
            )
        })
    }

    /// The head's parameters as a `.cact` ships them, each `(checkpoint name, shape, values)`: the
    /// calibration folded into the projection — σ(a·(w·x + b) + c) = σ((a·w)·x + (a·b + c)) — so the
    /// file's head alone gives the calibrated confidence. Float32 arithmetic, as the values are stored.
    pub fn shipped_params(&self) -> Result<Vec<(String, Vec<usize>, Vec<f32>)>, candle_core::Error> {
        let (scale, shift) = (self.calibration.scale as f32, self.calibration.shift as f32);
        self.head
            .named()
            .into_iter()
            .map(|(name, tensor)| {
                let mut values = tensor.flatten_all()?.to_vec1::<f32>()?;
                match name {
                    "proj/kernel" => values.iter_mut().for_each(|v| *v *= scale),
                    "proj/bias" => values.iter_mut().for_each(|v| *v = *v * scale + shift),
                    _ => {}
                }
                Ok((format!("{KEY}/{name}"), tensor.dims().to_vec(), values))
            })
            .collect()
    }
}

impl ConfidenceHead {
    /// Fails, saying which, when the parameters do not fit one another.
    fn check_shapes(&self) -> Result<(), String> {
        let dims: Vec<Vec<usize>> = self.tensors().iter().map(|t| t.dims().to_vec()).collect();
        let fits = match (self.generation(), &dims[..]) {
            (Generation::Needle2, [probes, kernel, bias]) => match (&probes[..], &kernel[..], &bias[..]) {
                ([k, d], [inputs, 1], [1]) => *inputs == k * d,
                _ => false,
            },
            (Generation::Needle3, [probes, gain, query, row_bias, kernel, bias]) => {
                match (&probes[..], &gain[..], &query[..], &row_bias[..], &kernel[..], &bias[..]) {
                    ([r, k, d], [gr, gk], [q, qd], [bq, br, bk], [inputs, 1], [1]) => {
                        (gr, gk, qd, bq, br, bk, *inputs) == (r, k, d, q, r, k, q * d)
                    }
                    _ => false,
                }
            }
            _ => false,
        };
        match fits {
            true => Ok(()),
            false => Err(format!("the head's tensors {dims:?} do not fit one another")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ModelConfig;

    #[test]
    fn a_head_comes_back_as_it_was_saved_beside_its_adapter() {
        let dir = tempfile::tempdir().unwrap();
        let adapter = dir.path().join("needle_lora.safetensors");
        let path = companion_path(&adapter);
        assert_eq!(path, dir.path().join("needle_lora.safetensors.head.safetensors"));
        for generation in [Generation::Needle2, Generation::Needle3] {
            let cfg = ModelConfig { d_model: 8, num_layers: 2, ..ModelConfig::defaults_for(generation) };
            let head = ConfidenceHead::initial(&cfg, &Device::Cpu, 4).unwrap();
            let calibration = Calibration { scale: 1.25, shift: -0.1 };
            TrainedHead { head: head.clone(), calibration, reads: Reading::PromptAndAnswer }.save(&path).unwrap();
            let back = TrainedHead::load(&path).unwrap();
            assert_eq!(
                (back.calibration, back.reads, back.head.generation()),
                (calibration, Reading::PromptAndAnswer, generation)
            );
            for (a, b) in back.head.tensors().iter().zip(head.tensors()) {
                let (a, b) = (
                    a.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                    b.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                );
                assert_eq!(a, b);
            }
        }
    }

    #[test]
    fn a_bad_head_file_is_refused_naming_the_file_and_what_is_wrong() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.head.safetensors");
        std::fs::write(&path, b"not safetensors").unwrap();
        let err = TrainedHead::load(&path).unwrap_err().to_string();
        assert!(err.contains("a.head.safetensors") && err.contains("not a safetensors file"), "{err}");

        let cfg = ModelConfig { d_model: 8, num_layers: 2, ..ModelConfig::defaults_for(Generation::Needle3) };
        let head = ConfidenceHead::initial(&cfg, &Device::Cpu, 4).unwrap();
        let calibration = Calibration::IDENTITY;
        // A query as wide as another model's.
        let mut tensors = head.tensors();
        tensors[2] = Tensor::zeros((4, 9), candle_core::DType::F32, &Device::Cpu).unwrap();
        let misfit = head.with_tensors(tensors);
        TrainedHead { head: misfit, calibration, reads: Reading::Prompt }.save(&path).unwrap();
        let err = TrainedHead::load(&path).unwrap_err().to_string();
        assert!(err.contains("do not fit one another"), "{err}");
    }
}
