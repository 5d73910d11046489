//! Folding a LoRA adapter into a checkpoint before export, as the reference's `merge_lora` does:
//! `W + (scale * A @ B).astype(W.dtype)`, with the product in float32 and the sum in W's own dtype
//! (so a float16 checkpoint adds the float16-rounded delta).

use std::path::PathBuf;

use half::f16;
use thiserror::Error;

use crate::checkpoint::{Checkpoint, DType, NdArray, PickledAdapter};
use crate::lora::{check_fit, FactorDims, FitError};

/// An adapter that cannot be merged into the checkpoint; names the adapter file and the weight.
#[derive(Debug, Error, PartialEq)]
pub enum MergeError {
    #[error(transparent)]
    Fit(#[from] Box<FitError>),
    #[error("adapter {}: `{path}`: {which} is {dtype:?}; merging needs float16 or float32 arrays", adapter.display())]
    UnsupportedDtype { adapter: PathBuf, path: String, which: &'static str, dtype: DType },
}

/// `scale * A @ B` per leading index, in float32 (the scale is rounded to f32 first, as jnp does for
/// a Python float times an f32 array).
fn scaled_delta(a: &[f32], b: &[f32], dims: FactorDims, scale: f64) -> Vec<f32> {
    let FactorDims { layers, d_in, rank, d_out } = dims;
    let scale = scale as f32;
    // The weight's own size: `check_fit` tied every dimension to it before this is allocated.
    let mut delta = vec![0.0f32; layers * d_in * d_out];
    for n in 0..layers {
        let a_n = &a[n * d_in * rank..(n + 1) * d_in * rank];
        let b_n = &b[n * rank * d_out..(n + 1) * rank * d_out];
        let out = &mut delta[n * d_in * d_out..(n + 1) * d_in * d_out];
        for (i, row) in out.chunks_exact_mut(d_out).enumerate() {
            for (j, cell) in row.iter_mut().enumerate() {
                let dot = (0..rank).fold(0.0f32, |acc, k| acc + a_n[i * rank + k] * b_n[k * d_out + j]);
                *cell = scale * dot;
            }
        }
    }
    delta
}

/// `W + delta` in W's dtype, returned as W's little-endian bytes.
fn add_in_dtype(weight: &NdArray, delta: &[f32]) -> Vec<u8> {
    let w = weight.to_f32();
    match weight.dtype {
        DType::F16 => w
            .iter()
            .zip(delta)
            .flat_map(|(&x, &d)| f16::from_f32(x + f16::from_f32(d).to_f32()).to_le_bytes())
            .collect(),
        _ => w.iter().zip(delta).flat_map(|(&x, &d)| (x + d).to_le_bytes()).collect(),
    }
}

/// Adds every adapter pair into the checkpoint's weights in place, after checking that every pair
/// fits its weight (so no product is sized by the adapter alone).
pub fn merge_lora(ckpt: &mut Checkpoint, adapter: &PickledAdapter) -> Result<(), MergeError> {
    let fits = check_fit(adapter, |path| ckpt.params.get(path).map(|w| w.shape.clone()))?;
    for (path, weight) in ckpt.params.iter_mut() {
        let (Some(factors), Some(&dims)) = (adapter.lora.get(path), fits.get(path.as_str())) else { continue };
        for (which, array) in [("the weight", &*weight), ("A", &factors.a), ("B", &factors.b)] {
            if !matches!(array.dtype, DType::F16 | DType::F32) {
                let (adapter, path) = (adapter.source.clone(), path.clone());
                return Err(MergeError::UnsupportedDtype { adapter, path, which, dtype: array.dtype });
            }
        }
        let delta = scaled_delta(&factors.a.to_f32(), &factors.b.to_f32(), dims, adapter.scale);
        weight.data = add_in_dtype(weight, &delta);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::LoraFactors;
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
        merge_lora(&mut ckpt, &lora).unwrap();
        let expected = f16::from_f32(1.0 + f16::from_f32(2e-4).to_f32());
        assert_eq!(ckpt.params["w"].data, expected.to_le_bytes().to_vec());
    }

    #[test]
    fn stacked_kernels_merge_per_layer() {
        let mut ckpt = checkpoint(array(DType::F32, &[2, 2, 1], &[0.0; 4]));
        let a = array(DType::F32, &[2, 2, 1], &[1.0, 2.0, 3.0, 4.0]);
        let b = array(DType::F32, &[2, 1, 1], &[10.0, 100.0]);
        merge_lora(&mut ckpt, &adapter("w", a, b, 0.5)).unwrap();
        assert_eq!(ckpt.params["w"].to_f32(), vec![5.0, 10.0, 150.0, 200.0]);
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
            fit_problem(merge_lora(&mut ckpt, &adapter("w", a.clone(), b.clone(), 1.0)).unwrap_err());
        assert!(tensor == "w/A" && matches!(problem, FitProblem::Shape { .. }), "{tensor}: {problem}");
        let err = merge_lora(&mut ckpt, &adapter("nope", a, b, 1.0)).unwrap_err();
        assert!(err.to_string().starts_with("adapter adapter.pkl: `nope` names a weight the base model does not have"));
        assert_eq!(ckpt.params["w"].to_f32(), vec![0.0; 4], "nothing merged");
    }

    #[test]
    fn a_huge_product_is_refused_before_it_is_allocated() {
        // 800 KB of factors whose product would be 100000 × 100000 f32 (40 GB).
        let mut ckpt = checkpoint(array(DType::F32, &[2, 2], &[0.0; 4]));
        let a = array(DType::F32, &[100_000, 1], &vec![1.0; 100_000]);
        let b = array(DType::F32, &[1, 100_000], &vec![1.0; 100_000]);
        let (tensor, problem) = fit_problem(merge_lora(&mut ckpt, &adapter("w", a, b, 1.0)).unwrap_err());
        assert_eq!(tensor, "w/A");
        assert!(matches!(problem, FitProblem::Shape { expected, .. } if expected == [2, 1]));
    }

    #[test]
    fn integer_factors_are_refused() {
        let mut ckpt = checkpoint(array(DType::F32, &[1, 1], &[0.0]));
        let a = NdArray { dtype: DType::I32, shape: vec![1, 1], data: vec![0; 4] };
        let err = merge_lora(&mut ckpt, &adapter("w", a, array(DType::F32, &[1, 1], &[1.0]), 1.0)).unwrap_err();
        assert!(matches!(err, MergeError::UnsupportedDtype { which: "A", dtype: DType::I32, .. }), "{err}");
    }
}
