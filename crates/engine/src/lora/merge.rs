//! Folding an adapter into its base weights, as the reference's `merge_lora`:
//! `W + (scale * A @ B).astype(W.dtype)` — the product and its scaling in float32, the sum in the
//! weight's own dtype.
//!
//! That dtype is the one thing the two callers choose. `needle build` merges into the checkpoint's
//! arrays as stored ([`merge_into_checkpoint`]: a float16 checkpoint adds the float16-rounded delta,
//! as the reference's `build_main` does); evaluation merges into weights already widened to float32
//! ([`merge_into_params`], as the reference's `finetune` widens the
//! checkpoint before it merges).

use std::collections::BTreeMap;
use std::path::PathBuf;

use candle_core::{DType, Device, Tensor};
use half::f16;

use super::{check_fit, FitError};
use crate::checkpoint::{self, Checkpoint, NdArray, PickledAdapter};
use crate::model::Params;

/// An adapter that cannot be merged into its base weights; names the adapter file and the weight.
#[derive(Debug, thiserror::Error)]
pub enum MergeError {
    /// A factor that does not fit its weight (checked before anything is multiplied).
    #[error(transparent)]
    Fit(#[from] Box<FitError>),
    #[error("adapter {}: `{path}`: {which} is {dtype:?}; merging needs float16 or float32 arrays", adapter.display())]
    UnsupportedDtype { adapter: PathBuf, path: String, which: &'static str, dtype: checkpoint::DType },
    #[error(
        "adapter {}: merged into `{path}`, it gives a NaN or an infinity (scale · A·B does not fit the weight's \
         dtype), so the adapter diverged in training: retrain it (a lower --lr)",
        adapter.display()
    )]
    NonFinite { adapter: PathBuf, path: String },
    /// The tensor library failed (out of memory, a device error); boxed, as it is rare and large.
    #[error("adapter {}: merging into `{path}` failed: {source}", adapter.display())]
    Tensor { adapter: PathBuf, path: String, source: Box<candle_core::Error> },
}

impl MergeError {
    fn tensor(adapter: &PickledAdapter, path: &str) -> impl FnOnce(candle_core::Error) -> Self {
        let (adapter, path) = (adapter.source.clone(), path.to_string());
        move |source| MergeError::Tensor { adapter, path, source: Box::new(source) }
    }
}

/// `W + scale · A·B`, per layer when the factors carry the weight's leading layer axis: the product
/// and its scaling in float32 (the scale rounded to f32 first, as jnp does for a Python float times
/// an f32 array), rounded to W's dtype, added in W's dtype.
fn merged(weight: &Tensor, a: &Tensor, b: &Tensor, scale: f64) -> candle_core::Result<Tensor> {
    let delta = (a.to_dtype(DType::F32)?.matmul(&b.to_dtype(DType::F32)?)? * scale)?;
    (weight + delta.to_dtype(weight.dtype())?)?.contiguous()
}

/// Whether every value of `t` is finite: `0·x` is 0 for those and NaN for a NaN or an infinity, so
/// the sum is 0 exactly when all are (on whatever device `t` lives).
fn all_finite(t: &Tensor) -> candle_core::Result<bool> {
    Ok(t.to_dtype(DType::F32)?.affine(0.0, 0.0)?.sum_all()?.to_scalar::<f32>()? == 0.0)
}

/// Every weight `adapter` adapts, merged, by path: each in its base weight's dtype and on its
/// device. `weight` looks a base weight up by path. Every pair is checked against its weight (and
/// the adapter's rank and scale) first, so no product is sized by the adapter alone; on an error
/// nothing is returned.
pub fn merge_adapter(
    adapter: &PickledAdapter,
    weight: impl Fn(&str) -> Option<Tensor>,
) -> Result<Vec<(String, Tensor)>, MergeError> {
    check_fit(adapter, |path| weight(path).map(|w| w.dims().to_vec()))?;
    adapter
        .lora
        .iter()
        .map(|(path, factors)| {
            let weight = weight(path).ok_or_else(|| missing(adapter, path))?;
            let a = float_tensor(adapter, path, "A", &factors.a, weight.device())?;
            let b = float_tensor(adapter, path, "B", &factors.b, weight.device())?;
            let merged = merged(&weight, &a, &b, adapter.scale).map_err(MergeError::tensor(adapter, path))?;
            if !all_finite(&merged).map_err(MergeError::tensor(adapter, path))? {
                return Err(MergeError::NonFinite { adapter: adapter.source.clone(), path: path.clone() });
            }
            Ok((path.clone(), merged))
        })
        .collect()
}

/// Merges `adapter` into the weights a network is built from (widened to f32, so the merge is in
/// f32 as the reference's `finetune` does it): evaluating and trying an adapter. Returns how many
/// weights changed; on an error nothing has changed.
pub fn merge_into_params(params: &mut Params, adapter: &PickledAdapter) -> Result<usize, MergeError> {
    let merged = merge_adapter(adapter, |path| params.get(path))?;
    let count = merged.len();
    params.replace(merged);
    Ok(count)
}

/// Merges `adapter` into the checkpoint's own arrays, each in the dtype it is stored in (what
/// `needle build` exports). On an error the checkpoint is unchanged.
pub fn merge_into_checkpoint(ckpt: &mut Checkpoint, adapter: &PickledAdapter) -> Result<(), MergeError> {
    // Only the adapted weights become tensors; one the adapter names but the checkpoint lacks is
    // reported by the fit check.
    let weights = adapter
        .lora
        .keys()
        .filter_map(|path| Some((path.as_str(), ckpt.params.get(path)?)))
        .map(|(path, array)| Ok((path, float_tensor(adapter, path, "the weight", array, &Device::Cpu)?)))
        .collect::<Result<BTreeMap<&str, Tensor>, MergeError>>()?;
    let merged = merge_adapter(adapter, |path| weights.get(path).cloned())?
        .into_iter()
        .map(|(path, tensor)| Ok((array_bytes(&tensor).map_err(MergeError::tensor(adapter, &path))?, path)))
        .collect::<Result<Vec<_>, MergeError>>()?;
    for (bytes, path) in merged {
        if let Some(array) = ckpt.params.get_mut(&path) {
            array.data = bytes;
        }
    }
    Ok(())
}

/// A float16 or float32 array as a tensor of its own dtype on `device`.
fn float_tensor(
    adapter: &PickledAdapter,
    path: &str,
    which: &'static str,
    array: &NdArray,
    device: &Device,
) -> Result<Tensor, MergeError> {
    let dtype = match array.dtype {
        checkpoint::DType::F16 => DType::F16,
        checkpoint::DType::F32 => DType::F32,
        dtype => {
            let (adapter, path) = (adapter.source.clone(), path.to_string());
            return Err(MergeError::UnsupportedDtype { adapter, path, which, dtype });
        }
    };
    // Widening float16 to f32 and back is exact.
    Tensor::from_vec(array.to_f32(), array.shape.as_slice(), device)
        .and_then(|t| t.to_dtype(dtype))
        .map_err(MergeError::tensor(adapter, path))
}

/// A float16 or float32 tensor's values as little-endian bytes, as a checkpoint array holds them.
fn array_bytes(tensor: &Tensor) -> candle_core::Result<Vec<u8>> {
    let flat = tensor.flatten_all()?;
    Ok(match tensor.dtype() {
        DType::F16 => flat.to_vec1::<f16>()?.iter().flat_map(|v| v.to_le_bytes()).collect(),
        _ => flat.to_dtype(DType::F32)?.to_vec1::<f32>()?.iter().flat_map(|v| v.to_le_bytes()).collect(),
    })
}

/// A weight the lookup no longer finds after the fit check found it.
fn missing(adapter: &PickledAdapter, path: &str) -> MergeError {
    let problem = super::FitProblem::MissingWeight;
    let fit = FitError { adapter: adapter.source.clone(), base: adapter.base.clone(), tensor: path.into(), problem };
    MergeError::Fit(Box::new(fit))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::{DType, LoraFactors};
    use crate::config::ModelConfig;
    use crate::lora::FitProblem;

    fn array(dtype: DType, shape: &[usize], values: &[f32]) -> NdArray {
        let data = match dtype {
            DType::F16 => values.iter().flat_map(|&v| f16::from_f32(v).to_le_bytes()).collect(),
            _ => values.iter().flat_map(|&v| v.to_le_bytes()).collect(),
        };
        NdArray { dtype, shape: shape.to_vec(), data }
    }

    fn checkpoint(weight: NdArray) -> Checkpoint {
        Checkpoint {
            source: "base.pkl".into(),
            params: [("w".to_string(), weight)].into(),
            config: ModelConfig::default(),
            step: None,
        }
    }

    fn adapter(path: &str, a: NdArray, b: NdArray, scale: f64) -> PickledAdapter {
        PickledAdapter {
            source: "adapter.pkl".into(),
            lora: [(path.to_string(), LoraFactors { a, b })].into(),
            scale,
            base: "base.pkl".into(),
            rank: 1,
        }
    }

    #[test]
    fn float16_weights_add_the_float16_rounded_delta() {
        // 1 + 2 * (1e-4 * 1) : the delta rounds to f16 before the f16 add.
        let mut ckpt = checkpoint(array(DType::F16, &[1, 1], &[1.0]));
        let lora = adapter("w", array(DType::F32, &[1, 1], &[1e-4]), array(DType::F32, &[1, 1], &[1.0]), 2.0);
        merge_into_checkpoint(&mut ckpt, &lora).unwrap();
        let expected = f16::from_f32(1.0 + f16::from_f32(2e-4).to_f32());
        assert_eq!(ckpt.params["w"].data, expected.to_le_bytes().to_vec());
        // Widened to f32 first, the same merge keeps the whole delta.
        let widened = Tensor::new(&[[1f32]], &Device::Cpu).unwrap();
        let (_, merged) = merge_adapter(&lora, |_| Some(widened.clone())).unwrap().remove(0);
        assert_eq!(merged.to_vec2::<f32>().unwrap(), [[1.0 + 2.0 * 1e-4f32]]);
    }

    #[test]
    fn stacked_kernels_merge_per_layer() {
        let mut ckpt = checkpoint(array(DType::F32, &[2, 2, 1], &[0.0; 4]));
        let a = array(DType::F32, &[2, 2, 1], &[1.0, 2.0, 3.0, 4.0]);
        let b = array(DType::F32, &[2, 1, 1], &[10.0, 100.0]);
        merge_into_checkpoint(&mut ckpt, &adapter("w", a, b, 0.5)).unwrap();
        assert_eq!(ckpt.params["w"].to_f32(), vec![5.0, 10.0, 150.0, 200.0]);
    }

    #[test]
    fn a_merge_that_overflows_the_weights_dtype_is_refused_by_name() {
        // 2 · 300 · 300 = 180000, past float16's largest value: the merged weight would be infinite.
        let mut ckpt = checkpoint(array(DType::F16, &[1, 1], &[1.0]));
        let lora = adapter("w", array(DType::F32, &[1, 1], &[300.0]), array(DType::F32, &[1, 1], &[300.0]), 2.0);
        let err = merge_into_checkpoint(&mut ckpt, &lora).unwrap_err();
        assert!(matches!(&err, MergeError::NonFinite { path, .. } if path == "w"), "{err}");
        assert!(err.to_string().starts_with("adapter adapter.pkl: merged into `w`, it gives a NaN"), "{err}");
        assert_eq!(ckpt.params["w"].to_f32(), [1.0], "on an error the checkpoint is unchanged");
    }

    fn fit_problem(err: MergeError) -> (String, FitProblem) {
        match err {
            MergeError::Fit(fit) => (fit.tensor, fit.problem),
            other => panic!("expected a fit error, got {other}"),
        }
    }

    #[test]
    fn mismatched_or_missing_targets_are_reported() {
        let mut ckpt = checkpoint(array(DType::F32, &[2, 2], &[0.0; 4]));
        let a = array(DType::F32, &[3, 1], &[0.0; 3]);
        let b = array(DType::F32, &[1, 2], &[0.0; 2]);
        let (tensor, problem) =
            fit_problem(merge_into_checkpoint(&mut ckpt, &adapter("w", a.clone(), b.clone(), 1.0)).unwrap_err());
        assert!(tensor == "w/A" && matches!(problem, FitProblem::Shape { .. }), "{tensor}: {problem}");
        let err = merge_into_checkpoint(&mut ckpt, &adapter("nope", a, b, 1.0)).unwrap_err();
        assert!(err.to_string().starts_with("adapter adapter.pkl: `nope` names a weight the base model does not have"));
        assert_eq!(ckpt.params["w"].to_f32(), vec![0.0; 4], "nothing merged");
    }

    #[test]
    fn a_huge_product_is_refused_before_it_is_allocated() {
        // 800 KB of factors whose product would be 100000 × 100000 f32 (40 GB).
        let mut ckpt = checkpoint(array(DType::F32, &[2, 2], &[0.0; 4]));
        let a = array(DType::F32, &[100_000, 1], &vec![1.0; 100_000]);
        let b = array(DType::F32, &[1, 100_000], &vec![1.0; 100_000]);
        let (tensor, problem) = fit_problem(merge_into_checkpoint(&mut ckpt, &adapter("w", a, b, 1.0)).unwrap_err());
        assert_eq!(tensor, "w/A");
        assert!(matches!(problem, FitProblem::Shape { expected, .. } if expected == [2, 1]));
    }

    #[test]
    fn integer_arrays_are_refused() {
        let mut ckpt = checkpoint(array(DType::F32, &[1, 1], &[0.0]));
        let a = NdArray { dtype: DType::I32, shape: vec![1, 1], data: vec![0; 4] };
        let lora = adapter("w", a, array(DType::F32, &[1, 1], &[1.0]), 1.0);
        let err = merge_into_checkpoint(&mut ckpt, &lora).unwrap_err();
        assert!(matches!(err, MergeError::UnsupportedDtype { which: "A", dtype: DType::I32, .. }), "{err}");
        // The same rule where the weights are tensors already.
        let weight = Tensor::zeros((1, 1), candle_core::DType::F32, &Device::Cpu).unwrap();
        let err = merge_adapter(&lora, |_| Some(weight.clone())).unwrap_err();
        assert!(matches!(err, MergeError::UnsupportedDtype { which: "A", .. }), "{err}");
    }
}

/// The reference's own adapters, merged for evaluation, give the reference's adapted loss.
#[cfg(test)]
mod parity_tests {
    use candle_core::{DType, Device};

    use super::merge_into_params;
    use crate::checkpoint::{Checkpoint, PickledAdapter};
    use crate::fixtures::fixture;
    use crate::model::{masked_loss, Network, Params};

    #[test]
    fn merged_reference_adapter_gives_the_reference_lora_loss() {
        for stem in ["tiny_f32", "tiny_f16", "pretrained"] {
            let checkpoint = Checkpoint::load(&fixture(&format!("models/{stem}.pkl"))).unwrap();
            let adapter = PickledAdapter::load(&fixture(&format!("golden/{stem}/adapter.pkl"))).unwrap();
            let mut params = Params::from_checkpoint(&checkpoint, &Device::Cpu).unwrap();
            assert_eq!(merge_into_params(&mut params, &adapter).unwrap(), adapter.lora.len());
            let forward =
                candle_core::safetensors::load(fixture(&format!("golden/{stem}/forward.safetensors")), &Device::Cpu)
                    .unwrap();
            let lora =
                candle_core::safetensors::load(fixture(&format!("golden/{stem}/lora.safetensors")), &Device::Cpu)
                    .unwrap();
            let ids = forward["ids"].to_dtype(DType::U32).unwrap();
            let logits = Network::load(&checkpoint.config, &params).unwrap().forward(&ids).unwrap();
            let loss: f32 = masked_loss(&logits, &ids, &forward["mask"]).unwrap().to_scalar().unwrap();
            let want = lora["loss"].to_vec1::<f32>().unwrap()[0];
            assert!(((loss - want) / want).abs() <= 1e-5, "{stem}: adapted loss {loss} vs reference {want}");
        }
    }

    #[test]
    fn an_adapter_for_another_base_is_refused() {
        let adapter = PickledAdapter::load(&fixture("golden/tiny_f32/adapter.pkl")).unwrap();
        let other = Checkpoint::load(&fixture("models/tiny_f16.pkl")).unwrap();
        let mut params = Params::from_checkpoint(&other, &Device::Cpu).unwrap();
        let err = merge_into_params(&mut params, &adapter).unwrap_err();
        assert!(err.to_string().contains("pass the base checkpoint the adapter was trained from"), "{err}");
    }
}
