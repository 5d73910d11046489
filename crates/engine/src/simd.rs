//! The row primitives every CPU kernel is made of, written so that their loops vectorize: the
//! widest vectors this CPU has ([`widest`]), a branch-free `e^x`, sums in lanes, and the
//! Walsh–Hadamard butterfly that both the quantizer and Needle 2's MLP rotate rows with. Ground
//! floor: it imports nothing of the crate.

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
pub(crate) unsafe fn avx512<R>(f: impl FnOnce() -> R) -> R {
    f()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn avx2<R>(f: impl FnOnce() -> R) -> R {
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

/// The orthonormal Walsh–Hadamard transform of one row, in place, natural (Sylvester) order: `H`
/// is symmetric and orthonormal after the `1/√n` scale, so the same call inverts it (CQ's
/// rotation of a group, [`crate::quant`], is this transform of 128 values). The
/// butterflies of span 1, 2 and 4 run as one 8-point transform per block of 8 (their own loops
/// would be too short to vectorize); the wider spans are long element-wise loops. Each output is
/// the same sum or difference a stage-by-stage butterfly forms, so the values are bit-identical.
#[inline(always)]
pub(crate) fn walsh_row(row: &mut [f32]) {
    let n = row.len();
    let mut h = 1;
    if n >= 8 {
        for b in row.chunks_exact_mut(8) {
            let [x0, x1, x2, x3, x4, x5, x6, x7] = [b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]];
            let (a0, a1, a2, a3, a4, a5, a6, a7) =
                (x0 + x1, x0 - x1, x2 + x3, x2 - x3, x4 + x5, x4 - x5, x6 + x7, x6 - x7);
            let (c0, c1, c2, c3, c4, c5, c6, c7) =
                (a0 + a2, a1 + a3, a0 - a2, a1 - a3, a4 + a6, a5 + a7, a4 - a6, a5 - a7);
            b.copy_from_slice(&[c0 + c4, c1 + c5, c2 + c6, c3 + c7, c0 - c4, c1 - c5, c2 - c6, c3 - c7]);
        }
        h = 8;
    }
    while h < n {
        for block in row.chunks_mut(2 * h) {
            let (lo, hi) = block.split_at_mut(h);
            for (a, b) in lo.iter_mut().zip(hi.iter_mut()) {
                let (x, y) = (*a, *b);
                *a = x + y;
                *b = x - y;
            }
        }
        h *= 2;
    }
    let unit = 1.0 / (n as f32).sqrt();
    row.iter_mut().for_each(|v| *v *= unit);
}

#[cfg(test)]
mod tests {
    use super::*;

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
