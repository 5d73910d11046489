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
mod fake_quant;
mod hadamard;
mod lanes;
mod matmul;
mod norm;
mod sigmoid;
mod sinkhorn;

pub use attention::{causal_softmax, rope, RopeTables, DECODE_ROPE_START};
pub use cross_entropy::cross_entropy;
pub use fake_quant::fake_quant_rows;
pub use hadamard::hadamard_mlp;
pub(crate) use hadamard::walsh_row;
pub use lanes::{lane_mix, lane_read, lane_spread};
pub use matmul::frozen_matmul;
pub use norm::rms_norm;
pub use sigmoid::sigmoid;
pub use sinkhorn::sinkhorn;

// The row functions the custom ops are made of, which the CPU training path calls directly.
pub(crate) use cross_entropy::log_sum_exp;
pub(crate) use fake_quant::fake_quant_row;
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

/// Runs `f` compiled for the widest vectors this CPU has — AVX-512, else AVX2 with FMA, else the
/// baseline — chosen at run time: the row kernels `f` calls are inlined into it, and so are
/// compiled for them too. The arithmetic is the same on each (no contraction into fused
/// multiply-adds, the same order of sums), so every CPU computes the same values.
#[inline(always)]
pub(crate) fn widest<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F, which is all `avx512` is compiled to use.
            return unsafe { avx512(f) };
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU has AVX2 and FMA, which is all `avx2` is compiled to use.
            return unsafe { avx2(f) };
        }
    }
    f()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn avx512<R>(f: impl FnOnce() -> R) -> R {
    f()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn avx2<R>(f: impl FnOnce() -> R) -> R {
    f()
}

/// `e^x` to within an ulp or two, branch-free so that loops over it vectorize: `x = n·ln2 + r`
/// with `|r| ≤ ln2/2` (ln2 split in two for exactness), a degree-6 polynomial for `e^r` (Cephes'
/// `expf`), and `2^n` put in the exponent bits. Inputs are clamped to where `e^x` is a normal
/// f32, so it never overflows or returns a subnormal.
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HIGH: f32 = 0.693_359_4;
    const LN2_LOW: f32 = -2.121_944_4e-4;
    // Adding 1.5·2²³ rounds to an integer and leaves it in the low mantissa bits.
    const ROUND: f32 = 12_582_912.0;
    let x = x.clamp(-87.0, 88.0);
    let shifted = x * LOG2E + ROUND;
    let n = shifted - ROUND;
    let r = x - n * LN2_HIGH - n * LN2_LOW;
    let mut p = 1.987_569_1e-4_f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 0.166_666_65;
    p = p * r + 0.5;
    let e_r = p * r * r + r + 1.0;
    let exponent = (shifted.to_bits().wrapping_sub(ROUND.to_bits()) as i32 + 127) as u32;
    e_r * f32::from_bits(exponent << 23)
}

/// `1 / (1 + e^{−x})` of one value (the clamp in [`exp`] keeps `e^{−x}` finite).
#[inline(always)]
pub(crate) fn logistic(x: f32) -> f32 {
    1.0 / (1.0 + exp(-x))
}

/// Lanes of the partial sums below: wide enough for the widest vectors, so that the loops
/// vectorize (a single running sum would have to be added in order).
const LANES: usize = 16;

/// `Σ aᵢ·bᵢ`.
#[inline(always)]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0f32; LANES];
    let (a_chunks, b_chunks) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let tail: f32 = a_chunks.remainder().iter().zip(b_chunks.remainder()).map(|(a, b)| a * b).sum();
    for (a, b) in a_chunks.zip(b_chunks) {
        for i in 0..LANES {
            acc[i] += a[i] * b[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// `Σ xᵢ`.
#[inline(always)]
pub(crate) fn sum(x: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    let chunks = x.chunks_exact(LANES);
    let tail: f32 = chunks.remainder().iter().sum();
    for c in chunks {
        for i in 0..LANES {
            acc[i] += c[i];
        }
    }
    acc.iter().sum::<f32>() + tail
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The row kernels as the CPU path runs them on one row: an MLP, the norms, the Sinkhorn
    /// iterations and a softmax's exponentials, every output concatenated.
    #[inline(always)]
    fn rows(x: &[f32]) -> Vec<f32> {
        let n = x.len();
        let mlp =
            HadamardMlp::new(x.iter().map(|v| 1.0 + v).collect(), x.to_vec(), x.iter().map(|v| 0.5 * v).collect());
        let (mut c, mut z, mut y, mut g, mut dx) =
            (vec![0f32; n], vec![0f32; n], vec![0f32; n], vec![0f32; n], vec![0f32; n]);
        mlp.pre_activation(x, &mut c);
        mlp.output(&c, &mut z, &mut y);
        mlp.backward(&c, x, &mut g, &mut dx);
        let (mut normed, mut back) = (vec![0f32; n], vec![0f32; n]);
        rms_norm_row(x, &y, &mut normed);
        rms_norm_backward_row(x, &y, &dx, &mut back);
        let (mut k, mut dk) = (vec![0f32; 16], vec![0f32; 16]);
        let mut scratch = Vec::new();
        sinkhorn_row(&x[..16], 4, 20, &mut k, &mut scratch);
        sinkhorn_backward_row(&x[..16], &x[16..32], 4, 20, &mut dk, &mut scratch);
        let exps = x.iter().map(|v| exp(4.0 * v) + logistic(*v));
        [y, dx, normed, back, k, dk]
            .concat()
            .into_iter()
            .chain(exps)
            .chain([dot(x, &c), sum(x), log_sum_exp(x)])
            .collect()
    }

    #[test]
    fn every_vector_width_computes_the_same_values() {
        let x: Vec<f32> = (0..256u32).map(|i| (i.wrapping_mul(2_654_435_761) % 2000) as f32 / 1000.0 - 1.0).collect();
        let baseline = rows(&x);
        assert!(baseline.iter().all(|v| v.is_finite()));
        assert_eq!(widest(|| rows(&x)), baseline);
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
                // SAFETY: the CPU has AVX2 and FMA.
                assert_eq!(unsafe { avx2(|| rows(&x)) }, baseline);
            }
            if std::arch::is_x86_feature_detected!("avx512f") {
                // SAFETY: the CPU has AVX-512F.
                assert_eq!(unsafe { avx512(|| rows(&x)) }, baseline);
            }
        }
    }

    #[test]
    fn the_fast_exponential_is_within_a_few_ulps_and_never_overflows() {
        for i in -2000..=2000 {
            let x = i as f32 * 0.043;
            let (got, want) = (exp(x), (x as f64).exp());
            let want = want.clamp(f32::MIN_POSITIVE as f64, f32::MAX as f64);
            assert!(((got as f64 - want) / want).abs() < 2.5e-7, "exp({x}) = {got}, not {want}");
        }
        assert!(exp(1000.0).is_finite() && exp(-1000.0) > 0.0);
        assert!((0.0..1e-37).contains(&logistic(-1000.0)));
        assert_eq!(logistic(1000.0), 1.0);
    }
}
