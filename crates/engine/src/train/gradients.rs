//! One reverse pass on a given batch and adapter: the loss and every LoRA factor's gradient, on any
//! device. The reference's goldens (`tests/fixtures/golden/<stem>/forward.safetensors`, the batch, and
//! `lora.safetensors`, the factors with the loss and gradients it computed from them) are read here for
//! the parity tests and for `needle gradients`, with which bench/gpu_check.sh holds a GPU's reverse pass
//! (candle's autograd) against the CPU's (the hand-written path) and the reference's.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Device, Tensor};

use super::error::{GoldenError, Result};
use super::{Schedule, Trainer};
use crate::checkpoint::Checkpoint;
use crate::dataset::Encoded;
use crate::lora::{target_paths, LoadError, Lora};
use crate::model::{ModelError, Network, Params};

/// Every tensor of a safetensors file, on the CPU.
pub fn read(path: &Path) -> std::result::Result<HashMap<String, Tensor>, GoldenError> {
    candle_core::safetensors::load(path, &Device::Cpu)
        .map_err(|source| GoldenError::Read { path: path.into(), source: Box::new(source) })
}

/// The batch's rows (its padding included: it sits after every scored token).
pub fn batch(path: &Path) -> std::result::Result<Vec<Encoded>, GoldenError> {
    let tensors = read(path)?;
    let ids = table(path, &tensors, "ids", DType::U32, Tensor::to_vec2::<u32>)?;
    let mask = table(path, &tensors, "mask", DType::F32, Tensor::to_vec2::<f32>)?;
    Ok(ids.into_iter().zip(mask).map(|(ids, mask)| Encoded { ids, mask, truncated: false }).collect())
}

/// The [rows, length] table `key` of the file at `path`, as `dtype`.
fn table<T>(
    path: &Path,
    tensors: &HashMap<String, Tensor>,
    key: &str,
    dtype: DType,
    rows: fn(&Tensor) -> candle_core::Result<Vec<Vec<T>>>,
) -> std::result::Result<Vec<Vec<T>>, GoldenError> {
    let tensor = tensors.get(key).ok_or_else(|| GoldenError::Missing { path: path.into(), key: key.into() })?;
    tensor.to_dtype(dtype).and_then(|t| rows(&t)).map_err(|source| GoldenError::Shape {
        path: path.into(),
        key: key.into(),
        source: Box::new(source),
    })
}

/// A trainer on `checkpoint`, on `device`, holding the factors `<weight>/A`, `<weight>/B` of `adapter`
/// (of rank `rank`, scaled by `alpha / rank`), one for every weight LoRA adapts. Needle 3 trains
/// quantization-aware, as the reference's `finetune_local` does; Needle 2 too with `qat`. Also the
/// adapter file's tensors, for the goldens beside the factors.
pub fn trainer(
    checkpoint: &Path,
    adapter: &Path,
    (rank, alpha): (usize, f64),
    qat: bool,
    schedule: Schedule,
    device: &Device,
) -> Result<(Trainer, HashMap<String, Tensor>)> {
    let loaded = Checkpoint::load(checkpoint).map_err(LoadError::from)?;
    let params = Params::from_checkpoint(&loaded, device)?.for_training(&loaded.config, qat)?;
    let tensors = read(adapter)?;
    let mut paths: Vec<&str> = tensors.keys().filter_map(|key| key.strip_suffix("/A")).collect();
    paths.sort_unstable();
    let expected = target_paths(&params)?;
    if expected != paths {
        let found = paths.iter().map(ToString::to_string).collect();
        return Err(GoldenError::Targets { path: adapter.into(), expected, found }.into());
    }
    let factor = |path: &str, side: &str| {
        let key = format!("{path}/{side}");
        tensors.get(&key).cloned().ok_or_else(|| GoldenError::Missing { path: adapter.into(), key })
    };
    let factors = paths
        .iter()
        .map(|&path| Ok((path.to_string(), factor(path, "A")?, factor(path, "B")?)))
        .collect::<std::result::Result<Vec<_>, GoldenError>>()?;
    let lora = Lora::from_factors(&params, rank, alpha, factors)?;
    let network = Network::load(&loaded.config, &params)?;
    Ok((Trainer::new(network, lora, schedule)?, tensors))
}

/// The loss on `rows` and each factor's gradients, named `<weight>/grad_A` and `<weight>/grad_B` as the
/// goldens name them, on the CPU.
pub fn gradients(trainer: &mut Trainer, rows: &[Encoded]) -> Result<(f32, Vec<(String, Tensor)>)> {
    let (loss, grads) = trainer.loss_and_gradients(rows)?;
    let names = trainer.lora.factors.iter().flat_map(|f| [format!("{}/grad_A", f.path), format!("{}/grad_B", f.path)]);
    let stacked = trainer.lora.stacked(&grads).map_err(ModelError::from)?;
    let named = names
        .zip(stacked)
        .map(|(name, grad)| Ok((name, grad.to_device(&Device::Cpu)?)))
        .collect::<candle_core::Result<Vec<_>>>()
        .map_err(ModelError::from)?;
    Ok((loss, named))
}

/// Writes `loss` and the named gradients to `path` as the goldens hold them (safetensors).
pub fn save(path: &Path, loss: f32, grads: Vec<(String, Tensor)>) -> candle_core::Result<()> {
    let mut tensors: HashMap<String, Tensor> = grads.into_iter().collect();
    tensors.insert("loss".into(), Tensor::new(&[loss], &Device::Cpu)?);
    candle_core::safetensors::save(&tensors, path)
}
