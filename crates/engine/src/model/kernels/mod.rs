//! Fused operations with hand-written backward passes, for the training path.
//!
//! candle's autograd keeps every intermediate of a composite op and computes a gradient for every
//! operand, frozen or not: `x·W` with a frozen `W` still forms `xᵀ·dY` (a dense weight gradient),
//! and `x ⊙ gain` still reduces a gradient for the gain. The ops here keep only their input and
//! return a gradient for it alone, so the frozen base model costs no backward work of its own.
//!
//! [`frozen_matmul`] runs on every backend (it calls the backend's own matmul). The others have a
//! CPU kernel; on CUDA and Metal they fall back to the composite candle ops they replace, which
//! their tests compare them with on the CPU.

use candle_core::backend::BackendStorage;
use candle_core::{bail, CpuStorage, DType, Layout, Result, Tensor};
use rayon::prelude::*;

mod attention;
mod cross_entropy;
mod hadamard;
mod lanes;
mod matmul;
mod norm;
mod sigmoid;
mod sinkhorn;

pub use attention::{causal_softmax, rope, RopeTables};
pub use cross_entropy::cross_entropy;
pub use hadamard::hadamard_mlp;
pub use lanes::{lane_mix, lane_read, lane_spread};
pub use matmul::frozen_matmul;
pub use norm::rms_norm;
pub use sigmoid::sigmoid;
pub use sinkhorn::sinkhorn;

// The row functions the custom ops are made of, which the CPU training path calls directly.
pub(crate) use cross_entropy::log_sum_exp;
pub(crate) use hadamard::HadamardMlp;
pub(crate) use norm::{inverse_rms, rms_norm_backward_row, rms_norm_row};
pub(crate) use sinkhorn::{sinkhorn_backward_row, sinkhorn_row};

/// Rows of this many elements or fewer are processed on one thread: rayon's hand-off costs more.
const PARALLEL_MIN: usize = 1 << 14;

/// The contiguous f32 elements of a CPU tensor.
fn f32s<'a>(storage: &'a CpuStorage, layout: &Layout) -> Result<&'a [f32]> {
    let CpuStorage::F32(values) = storage else { bail!("fused ops take f32 tensors, got {:?}", storage.dtype()) };
    match layout.contiguous_offsets() {
        Some((start, end)) => Ok(&values[start..end]),
        None => bail!("fused ops take contiguous tensors"),
    }
}

/// `rows` output rows of `width` values, row i written by `f(i, row)`: in parallel when the work
/// is large. The one loop every CPU kernel runs.
fn fill_rows(rows: usize, width: usize, f: impl Fn(usize, &mut [f32]) + Sync) -> Vec<f32> {
    let mut out = vec![0f32; rows * width];
    let width = width.max(1);
    if out.len() <= PARALLEL_MIN {
        out.chunks_mut(width).enumerate().for_each(|(i, o)| f(i, o));
    } else {
        out.par_chunks_mut(width).enumerate().for_each(|(i, o)| f(i, o));
    }
    out
}

/// `f(i, input_row, output_row)` over every `width`-wide row of `input`.
fn map_rows(input: &[f32], width: usize, f: impl Fn(usize, &[f32], &mut [f32]) + Sync) -> Vec<f32> {
    fill_rows(input.len() / width.max(1), width, |i, o| f(i, &input[i * width..][..width], o))
}

/// Like [`map_rows`] over two inputs of the same shape (a forward input and a gradient).
fn map_row_pairs(a: &[f32], b: &[f32], width: usize, f: impl Fn(usize, &[f32], &[f32], &mut [f32]) + Sync) -> Vec<f32> {
    fill_rows(a.len() / width.max(1), width, |i, o| f(i, &a[i * width..][..width], &b[i * width..][..width], o))
}

/// Whether the fused CPU kernels serve `x` (else the composite ops do).
fn fused(x: &Tensor) -> bool {
    x.device().is_cpu() && x.dtype() == DType::F32
}

/// `1 / (1 + e^{−x})` of one value.
pub(crate) fn logistic(x: f32) -> f32 {
    // Split by sign so that exp never overflows.
    if x >= 0.0 {
        1.0 / (1.0 + (-x).exp())
    } else {
        let e = x.exp();
        e / (1.0 + e)
    }
}

pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(a, b)| a * b).sum()
}

#[cfg(test)]
mod testing {
    use candle_core::{Device, Tensor, Var};

    pub fn random(shape: &[usize], seed: u64) -> Tensor {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let n: usize = shape.iter().product();
        Tensor::from_vec((0..n).map(|_| rng.random_range(-2.0f32..2.0)).collect::<Vec<_>>(), shape, &Device::Cpu)
            .unwrap()
    }

    pub fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
        (a - b).unwrap().abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar().unwrap()
    }

    /// The value and input gradient of `op(x)·probe` summed, for a fused and a composite op.
    pub fn value_and_grad(x: &Tensor, probe: &Tensor, op: impl Fn(&Tensor) -> Tensor) -> (Tensor, Tensor) {
        let var = Var::from_tensor(x).unwrap();
        let y = op(var.as_tensor());
        let grads = (&y * probe).unwrap().sum_all().unwrap().backward().unwrap();
        (y, grads.get(var.as_tensor()).unwrap().clone())
    }

    pub fn assert_same(name: &str, fused: (Tensor, Tensor), composite: (Tensor, Tensor)) {
        let (value, grad) = (max_diff(&fused.0, &composite.0), max_diff(&fused.1, &composite.1));
        assert!(value < 1e-5 && grad < 1e-5, "{name}: value off by {value}, gradient by {grad}");
    }
}
