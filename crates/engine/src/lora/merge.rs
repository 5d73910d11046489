//! Folding an adapter into its base weights, as the reference's `merge_lora`:
//! `W + (scale * A @ B).astype(W.dtype)`, step by step with the roundings XLA makes:
//!
//! 1. `A @ B` in float32, each element a chain of fused multiply-adds in rank order (what XLA's
//!    and OpenBLAS's plain float32 dot compute);
//! 2. times the scale rounded to float32 (a Python float times a float32 array stays float32);
//! 3. rounded to nearest even in W's dtype (`astype`);
//! 4. added to W in W's dtype: the exact sum rounded once (XLA adds float16 and bfloat16 in float32
//!    and rounds back, which float32's width makes a single rounding).
//!
//! The dtype is the one thing the two callers choose. `needle build` merges into the checkpoint's
//! arrays as stored ([`merge_into_checkpoint`]): a float16 or bfloat16 checkpoint adds the delta
//! rounded to its own type, as the reference's `build_main` does. Evaluation merges into weights
//! already widened to float32 ([`merge_into_params`]), as the reference's `finetune` widens the
//! checkpoint before it merges.
//!
//! XLA picks its CPU dot kernel by shape and CPU, and some sum the rank in another order: their
//! product can differ from the chain in its last float32 bit, which moves a weight rounded to
//! float16 or bfloat16 only when the product lies within that bit of a rounding boundary.

use std::path::PathBuf;

use candle_core::Tensor;
use half::{bf16, f16};
use rayon::prelude::*;

use super::{check_fit, FactorDims, FitError};
use crate::checkpoint::{self, Checkpoint, NdArray, PickledAdapter};
use crate::model::Params;
use crate::simd::widest;

/// An adapter that cannot be merged into its base weights; names the adapter file and the weight.
#[derive(Debug, thiserror::Error)]
pub enum MergeError {
    /// A factor that does not fit its weight (checked before anything is multiplied).
    #[error(transparent)]
    Fit(#[from] Box<FitError>),
    #[error(
        "adapter {}: `{path}`: {which} is {dtype}; merging needs float16, bfloat16 or float32 arrays",
        adapter.display()
    )]
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

    fn dtype(adapter: &PickledAdapter, path: &str, which: &'static str, dtype: checkpoint::DType) -> Self {
        MergeError::UnsupportedDtype { adapter: adapter.source.clone(), path: path.into(), which, dtype }
    }
}

/// The float type a weight is stored in: the merge rounds its delta and its sum to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Storage {
    F16,
    BF16,
    F32,
}

impl Storage {
    fn of(dtype: checkpoint::DType) -> Option<Self> {
        use checkpoint::DType as D;
        match dtype {
            D::F16 => Some(Storage::F16),
            D::BF16 => Some(Storage::BF16),
            D::F32 => Some(Storage::F32),
            D::F64 | D::I8 | D::I16 | D::I32 | D::I64 | D::U8 | D::U16 | D::U32 | D::U64 | D::Bool => None,
        }
    }

    /// `x` rounded to nearest even in this type (and widened back, exactly).
    #[inline(always)]
    fn round(self, x: f32) -> f32 {
        match self {
            Storage::F16 => f16::from_f32(x).to_f32(),
            Storage::BF16 => bf16::from_f32(x).to_f32(),
            Storage::F32 => x,
        }
    }

    /// Values already in this type, as the little-endian bytes a checkpoint array holds.
    fn bytes(self, values: &[f32]) -> Vec<u8> {
        match self {
            Storage::F16 => values.iter().flat_map(|&v| f16::from_f32(v).to_le_bytes()).collect(),
            Storage::BF16 => values.iter().flat_map(|&v| bf16::from_f32(v).to_le_bytes()).collect(),
            Storage::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        }
    }
}

/// `weight` (stored as `storage`, widened to f32) with `scale · A·B` merged in, per layer when the
/// factors carry the weight's leading layer axis.
fn merge_values(weight: &mut [f32], storage: Storage, dims: FactorDims, a: &[f32], b: &[f32], scale: f32) {
    let FactorDims { d_in, rank, d_out, .. } = dims;
    weight.par_chunks_mut(d_out.max(1)).enumerate().for_each_init(
        || vec![0f32; d_out],
        |product, (row, weight)| {
            let a = &a[row * rank..][..rank];
            let b = &b[row / d_in * rank * d_out..][..rank * d_out];
            widest(|| merge_row(weight, storage, product, a, b, scale));
        },
    );
}

/// One row of `W [in, out]`: `product` (scratch of `out` values) gets row `a` of A times B, one
/// fused multiply-add per rank in rank order, and `weight` the rounded, scaled product added.
#[inline(always)]
fn merge_row(weight: &mut [f32], storage: Storage, product: &mut [f32], a: &[f32], b: &[f32], scale: f32) {
    product.fill(0.0);
    for (&a, b) in a.iter().zip(b.chunks_exact(product.len())) {
        for (p, &b) in product.iter_mut().zip(b) {
            *p = a.mul_add(b, *p);
        }
    }
    for (w, &p) in weight.iter_mut().zip(product.iter()) {
        *w = storage.round(*w + storage.round(p * scale));
    }
}

/// A factor's values as f32: float32 as stored; float16 and bfloat16 (which the reference never
/// writes) widened exactly.
fn factor_values(
    adapter: &PickledAdapter,
    path: &str,
    which: &'static str,
    array: &NdArray,
) -> Result<Vec<f32>, MergeError> {
    match Storage::of(array.dtype) {
        Some(_) => Ok(array.to_f32()),
        None => Err(MergeError::dtype(adapter, path, which, array.dtype)),
    }
}

/// Every weight `adapter` adapts, merged: `weight(path)` gives a base weight's shape, its values
/// widened to f32 and the type it is stored in; each comes back in that type, widened. Every pair
/// is checked against its weight (and the adapter's rank and scale) first, so no product is sized
/// by the adapter alone; on an error nothing is returned.
fn merge_all(
    adapter: &PickledAdapter,
    shape: impl Fn(&str) -> Option<Vec<usize>>,
    weight: impl Fn(&str) -> Result<(Vec<f32>, Storage), MergeError>,
) -> Result<Vec<(String, Vec<f32>, Storage)>, MergeError> {
    let fits = check_fit(adapter, shape)?;
    let scale = adapter.scale as f32;
    adapter
        .lora
        .iter()
        .map(|(path, factors)| {
            let dims = fits.get(path.as_str()).copied().ok_or_else(|| missing(adapter, path))?;
            let (mut values, storage) = weight(path)?;
            let a = factor_values(adapter, path, "A", &factors.a)?;
            let b = factor_values(adapter, path, "B", &factors.b)?;
            merge_values(&mut values, storage, dims, &a, &b, scale);
            if values.iter().any(|v| !v.is_finite()) {
                return Err(MergeError::NonFinite { adapter: adapter.source.clone(), path: path.clone() });
            }
            Ok((path.clone(), values, storage))
        })
        .collect()
}

/// Merges `adapter` into the weights a network is built from (float32, so the merge is in
/// float32 as the reference's `finetune` does it): evaluating and trying an adapter. Returns how
/// many weights changed; on an error nothing has changed.
pub fn merge_into_params(params: &mut Params, adapter: &PickledAdapter) -> Result<usize, MergeError> {
    let tensor = |path: &str| params.get(path).ok_or_else(|| missing(adapter, path));
    let merged = merge_all(
        adapter,
        |path| params.get(path).map(|w| w.dims().to_vec()),
        |path| {
            let values = tensor(path)?.flatten_all().and_then(|t| t.to_dtype(candle_core::DType::F32)?.to_vec1());
            Ok((values.map_err(MergeError::tensor(adapter, path))?, Storage::F32))
        },
    )?
    .into_iter()
    .map(|(path, values, _)| {
        let weight = tensor(&path)?;
        let merged =
            Tensor::from_vec(values, weight.dims(), weight.device()).map_err(MergeError::tensor(adapter, &path))?;
        Ok((path, merged))
    })
    .collect::<Result<Vec<_>, MergeError>>()?;
    let count = merged.len();
    params.replace(merged);
    Ok(count)
}

/// Merges `adapter` into the checkpoint's own arrays, each in the dtype it is stored in (what
/// `needle build` exports). On an error the checkpoint is unchanged.
pub fn merge_into_checkpoint(ckpt: &mut Checkpoint, adapter: &PickledAdapter) -> Result<(), MergeError> {
    let array = |path: &str| ckpt.params.get(path).ok_or_else(|| missing(adapter, path));
    let merged = merge_all(
        adapter,
        |path| ckpt.params.get(path).map(|w| w.shape.clone()),
        |path| {
            let array = array(path)?;
            let storage =
                Storage::of(array.dtype).ok_or_else(|| MergeError::dtype(adapter, path, "the weight", array.dtype))?;
            Ok((array.to_f32(), storage))
        },
    )?;
    for (path, values, storage) in merged {
        if let Some(array) = ckpt.params.get_mut(&path) {
            array.data = storage.bytes(&values);
        }
    }
    Ok(())
}

/// A weight the lookup no longer finds after the fit check found it.
fn missing(adapter: &PickledAdapter, path: &str) -> MergeError {
    let problem = super::FitProblem::MissingWeight;
    let fit = FitError { adapter: adapter.source.clone(), base: adapter.base.clone(), tensor: path.into(), problem };
    MergeError::Fit(Box::new(fit))
}

#[cfg(test)]
mod tests {
    use candle_core::Device;

    use super::*;
    use crate::checkpoint::{DType, LoraFactors};
    use crate::config::ModelConfig;
    use crate::lora::FitProblem;

    fn array(dtype: DType, shape: &[usize], values: &[f32]) -> NdArray {
        let data = match dtype {
            DType::F16 => values.iter().flat_map(|&v| f16::from_f32(v).to_le_bytes()).collect(),
            DType::BF16 => values.iter().flat_map(|&v| bf16::from_f32(v).to_le_bytes()).collect(),
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

    /// The merged value of a one-element weight of `dtype`, merged in its own type.
    fn merged_scalar(dtype: DType, weight: f32, lora: &PickledAdapter) -> f32 {
        let mut ckpt = checkpoint(array(dtype, &[1, 1], &[weight]));
        merge_into_checkpoint(&mut ckpt, lora).unwrap();
        assert_eq!(ckpt.params["w"].dtype, dtype, "the merge keeps the stored type");
        ckpt.params["w"].to_f32()[0]
    }

    #[test]
    fn half_precision_weights_add_the_delta_rounded_to_their_own_type() {
        // 1 + 2 · (1e-4 · 1): the delta rounds to the weight's type before the add in that type.
        let lora = adapter("w", array(DType::F32, &[1, 1], &[1e-4]), array(DType::F32, &[1, 1], &[1.0]), 2.0);
        assert_eq!(merged_scalar(DType::F16, 1.0, &lora), f16::from_f32(1.0 + f16::from_f32(2e-4).to_f32()).to_f32());
        // bfloat16's ulp at 1 is 2⁻⁷: a delta under half of it leaves the weight as it was.
        assert_eq!(merged_scalar(DType::BF16, 1.0, &lora), 1.0);
        // 0.75 + 2 · 0.0127 = 0.7754 in float32, which rounds to bfloat16's 0.77734375; the delta
        // rounded first (0.025390625) leaves 0.775390625, a tie that rounds to even: 0.7734375.
        let lora = adapter("w", array(DType::F32, &[1, 1], &[0.0127]), array(DType::F32, &[1, 1], &[1.0]), 2.0);
        assert_eq!(merged_scalar(DType::BF16, 0.75, &lora), 0.773_437_5);
        // Widened to f32 first (evaluation), the same merge keeps the whole delta.
        let lora = adapter("w", array(DType::F32, &[1, 1], &[1e-4]), array(DType::F32, &[1, 1], &[1.0]), 2.0);
        let mut params =
            Params::from_checkpoint(&checkpoint(array(DType::BF16, &[1, 1], &[1.0])), &Device::Cpu).unwrap();
        assert_eq!(merge_into_params(&mut params, &lora).unwrap(), 1);
        assert_eq!(params.get("w").unwrap().to_vec2::<f32>().unwrap(), [[1.0 + (2.0 * 1e-4f32)]]);
    }

    #[test]
    fn the_product_is_a_chain_of_fused_multiply_adds_in_rank_order() {
        // -1 · (1 + 2⁻¹¹) + (1 + 2⁻¹²)²: the second product is 1 + 2⁻¹¹ + 2⁻²⁴, which float32 holds
        // only inside a fused multiply-add. Summed in rank order with one, the 2⁻²⁴ survives;
        // rounded products, or the other order, give 0.
        let (x, y) = (1.0 + 2f32.powi(-11), 1.0 + 2f32.powi(-12));
        let mut lora = adapter("w", array(DType::F32, &[1, 2], &[-1.0, y]), array(DType::F32, &[2, 1], &[x, y]), 1.0);
        lora.rank = 2;
        assert_eq!(merged_scalar(DType::F32, 0.0, &lora), 2f32.powi(-24));
    }

    #[test]
    fn the_scale_is_rounded_to_float32_before_it_multiplies() {
        // 5 · f32(8/3) is 13.333334 in float32; 5 · 8/3 in f64, then rounded, is 13.333333.
        let scale = 8.0 / 3.0;
        let lora = adapter("w", array(DType::F32, &[1, 1], &[5.0]), array(DType::F32, &[1, 1], &[1.0]), scale);
        let want = 5.0 * (scale as f32);
        assert_ne!(want, (5.0 * scale) as f32);
        assert_eq!(merged_scalar(DType::F32, 0.0, &lora), want);
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
        let a = NdArray { dtype: DType::I32, shape: vec![1, 1], data: vec![0; 4] };
        let lora = adapter("w", a, array(DType::F32, &[1, 1], &[1.0]), 1.0);
        let mut ckpt = checkpoint(array(DType::F32, &[1, 1], &[0.0]));
        let err = merge_into_checkpoint(&mut ckpt, &lora).unwrap_err();
        assert!(matches!(err, MergeError::UnsupportedDtype { which: "A", dtype: DType::I32, .. }), "{err}");
        // The same rule where the weights are tensors already.
        let mut params = Params::from_checkpoint(&ckpt, &Device::Cpu).unwrap();
        let err = merge_into_params(&mut params, &lora).unwrap_err();
        assert!(matches!(err, MergeError::UnsupportedDtype { which: "A", .. }), "{err}");
        // And a weight stored as integers.
        let mut ckpt = checkpoint(NdArray { dtype: DType::I32, shape: vec![1, 1], data: vec![0; 4] });
        let lora = adapter("w", array(DType::F32, &[1, 1], &[1.0]), array(DType::F32, &[1, 1], &[1.0]), 1.0);
        let err = merge_into_checkpoint(&mut ckpt, &lora).unwrap_err();
        assert!(matches!(err, MergeError::UnsupportedDtype { which: "the weight", dtype: DType::I32, .. }), "{err}");
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
