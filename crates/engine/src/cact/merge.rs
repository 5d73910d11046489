//! Folding a LoRA adapter into a checkpoint before export, as the reference's `merge_lora` does:
//! `W + (scale * A @ B).astype(W.dtype)`, with the product in float32 and the sum in W's own dtype
//! (so a float16 checkpoint adds the float16-rounded delta).

use std::path::PathBuf;

use half::f16;
use thiserror::Error;

use crate::checkpoint::{Checkpoint, DType, NdArray, PickledAdapter};

/// An adapter that does not fit the checkpoint; names the adapter file and the weight.
#[derive(Debug, Error, PartialEq, Eq)]
#[error("{}: {problem}", adapter.display())]
pub struct MergeError {
    pub adapter: PathBuf,
    pub problem: MergeProblem,
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum MergeProblem {
    #[error("targets `{path}`, which {} does not have; was the adapter trained on a different base?", checkpoint.display())]
    MissingTarget { path: String, checkpoint: PathBuf },
    #[error("`{path}`: weight {weight:?}, A {a:?}, B {b:?} do not compose as W[.., in, out] + A[.., in, r] @ B[.., r, out]; was the adapter trained on a different base?")]
    ShapeMismatch { path: String, weight: Vec<usize>, a: Vec<usize>, b: Vec<usize> },
    #[error("`{path}`: {which} is {dtype:?}; merging needs float16 or float32 arrays")]
    UnsupportedDtype { path: String, which: &'static str, dtype: DType },
}

/// Leading (batch) dims, `in`, `r`, `out` of a weight/A/B triple, when they compose.
fn merge_dims(w: &[usize], a: &[usize], b: &[usize]) -> Option<(usize, usize, usize, usize)> {
    let n = w.len();
    if n < 2 || a.len() != n || b.len() != n || w[..n - 2] != a[..n - 2] || w[..n - 2] != b[..n - 2] {
        return None;
    }
    let (d_in, d_out, rank) = (w[n - 2], w[n - 1], a[n - 1]);
    (a[n - 2] == d_in && b[n - 2] == rank && b[n - 1] == d_out)
        .then(|| (w[..n - 2].iter().product(), d_in, rank, d_out))
}

/// `scale * A @ B` per leading index, in float32 (the scale is rounded to f32 first, as jnp does for
/// a Python float times an f32 array).
fn scaled_delta(
    a: &[f32],
    b: &[f32],
    (batch, d_in, rank, d_out): (usize, usize, usize, usize),
    scale: f64,
) -> Vec<f32> {
    let scale = scale as f32;
    let mut delta = vec![0.0f32; batch * d_in * d_out];
    for n in 0..batch {
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

fn check_float(path: &str, which: &'static str, arr: &NdArray) -> Result<(), MergeProblem> {
    match arr.dtype {
        DType::F16 | DType::F32 => Ok(()),
        dtype => Err(MergeProblem::UnsupportedDtype { path: path.into(), which, dtype }),
    }
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

/// Adds every adapter pair into the checkpoint's weights in place.
pub fn merge_lora(ckpt: &mut Checkpoint, adapter: &PickledAdapter) -> Result<(), MergeError> {
    merge_factors(ckpt, adapter).map_err(|problem| MergeError { adapter: adapter.source.clone(), problem })
}

fn merge_factors(ckpt: &mut Checkpoint, adapter: &PickledAdapter) -> Result<(), MergeProblem> {
    for (path, factors) in &adapter.lora {
        let (a, b) = (&factors.a, &factors.b);
        let weight = ckpt
            .params
            .get_mut(path)
            .ok_or_else(|| MergeProblem::MissingTarget { path: path.clone(), checkpoint: ckpt.source.clone() })?;
        check_float(path, "the weight", weight)?;
        check_float(path, "A", a)?;
        check_float(path, "B", b)?;
        let dims = merge_dims(&weight.shape, &a.shape, &b.shape).ok_or_else(|| MergeProblem::ShapeMismatch {
            path: path.clone(),
            weight: weight.shape.clone(),
            a: a.shape.clone(),
            b: b.shape.clone(),
        })?;
        let delta = scaled_delta(&a.to_f32(), &b.to_f32(), dims, adapter.scale);
        weight.data = add_in_dtype(weight, &delta);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::LoraFactors;
    use crate::config::ModelConfig;

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

    #[test]
    fn mismatched_or_missing_targets_are_reported() {
        let mut ckpt = checkpoint(array(DType::F32, &[2, 2], &[0.0; 4]));
        let a = array(DType::F32, &[3, 1], &[0.0; 3]);
        let b = array(DType::F32, &[1, 2], &[0.0; 2]);
        let err = merge_lora(&mut ckpt, &adapter("w", a.clone(), b.clone(), 1.0)).unwrap_err();
        assert!(matches!(err.problem, MergeProblem::ShapeMismatch { .. }));
        let err = merge_lora(&mut ckpt, &adapter("nope", a, b, 1.0)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "adapter.pkl: targets `nope`, which base.pkl does not have; was the adapter trained on a different base?"
        );
    }
}
