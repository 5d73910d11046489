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

mod attention;
mod cross_entropy;
mod fake_quant;
mod hadamard;
mod lanes;
mod matmul;
mod norm;
mod rows;
mod sigmoid;
mod sinkhorn;
#[cfg(test)]
mod testing;

pub use attention::{causal_bias_after, causal_softmax, rope, RopeTables, DECODE_ROPE_START};
pub use cross_entropy::cross_entropy;
pub use fake_quant::fake_quant_rows;
pub use hadamard::{hadamard_mlp, walsh_matrix};
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simd::{avx2, avx512, dot, exp, logistic, sum, widest};

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
}
