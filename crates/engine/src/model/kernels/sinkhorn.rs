//! Sinkhorn normalisation of the lane-mixing logits towards a doubly-stochastic matrix.

use candle_core::{bail, CpuStorage, CustomOp1, CustomOp2, Layout, Result, Shape, Tensor};

use super::rows::{f32s, fused, map_row_pairs, map_rows};
use crate::simd::exp;

/// Alternately normalises the rows and the columns of `exp(logits)`, `iterations` times each, over
/// the last two axes (`[…, n, n]`). On the CPU one op whose backward replays the
/// iterations of each small matrix; elsewhere the composite candle ops (about 80 per call).
pub fn sinkhorn(logits: &Tensor, iterations: usize) -> Result<Tensor> {
    if fused(logits) {
        return logits.contiguous()?.apply_op1(Sinkhorn { iterations });
    }
    sinkhorn_composite(logits, iterations)
}

fn sinkhorn_composite(logits: &Tensor, iterations: usize) -> Result<Tensor> {
    let rank = logits.rank();
    let mut log_k = logits.clone();
    for _ in 0..iterations {
        log_k = log_k.broadcast_sub(&log_k.log_sum_exp(rank - 1)?.unsqueeze(rank - 1)?)?;
        log_k = log_k.broadcast_sub(&log_k.log_sum_exp(rank - 2)?.unsqueeze(rank - 2)?)?;
    }
    log_k.exp()
}

struct Sinkhorn {
    iterations: usize,
}

/// The `n` lines of an `n × n` matrix along rows (`m[i, ·]`) or columns (`m[·, j]`): the flat
/// index of entry `k` of line `line`.
#[inline(always)]
fn at(n: usize, by_rows: bool, line: usize, k: usize) -> usize {
    if by_rows {
        line * n + k
    } else {
        k * n + line
    }
}

/// Subtracts each line's log-sum-exp: one half-step of the iteration.
#[inline(always)]
fn normalise(m: &mut [f32], n: usize, by_rows: bool) {
    for line in 0..n {
        let max = (0..n).map(|k| m[at(n, by_rows, line, k)]).fold(f32::NEG_INFINITY, f32::max);
        let lse = max + (0..n).map(|k| (m[at(n, by_rows, line, k)] - max).exp()).sum::<f32>().ln();
        (0..n).for_each(|k| m[at(n, by_rows, line, k)] -= lse);
    }
}

fn side(layout: &Layout) -> Result<usize> {
    let dims = layout.dims();
    match dims {
        [.., a, b] if a == b => Ok(*a),
        _ => bail!("sinkhorn takes [..., n, n] logits, got {dims:?}"),
    }
}

impl CustomOp1 for Sinkhorn {
    fn name(&self) -> &'static str {
        "sinkhorn"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let n = side(layout)?;
        let out = map_rows(f32s(storage, layout)?, n * n, |_, logits, out| {
            sinkhorn_row(logits, n, self.iterations, out, &mut Vec::new())
        });
        Ok((CpuStorage::F32(out), layout.shape().clone()))
    }

    fn bwd(&self, logits: &Tensor, _k: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        let backward = SinkhornBackward { iterations: self.iterations };
        Ok(Some(logits.apply_op2_no_bwd(&grad.contiguous()?, &backward)?))
    }
}

/// Beyond this spread between a matrix's largest and smallest logit, the exponential of the
/// smallest could underflow beside the largest: such a matrix is normalised in log space instead.
const EXP_SPREAD: f32 = 60.0;

/// Whether a matrix of logits is normalised by scaling `exp(logits − max)` (else in log space).
#[inline(always)]
fn scaled(logits: &[f32]) -> bool {
    let (low, high) = logits.iter().fold((f32::INFINITY, f32::NEG_INFINITY), |(l, h), &x| (l.min(x), h.max(x)));
    high - low <= EXP_SPREAD
}

/// `K₀ = exp(logits − max)` and the `2·iterations` half-steps after it, each dividing the lines of
/// the one before by their sums (rows, then columns): `history` holds `K₀ … K₂ᵢ`, `n²` each. The
/// same matrices as the log-space iterations (dividing by a line's sum is subtracting its
/// log-sum-exp), for one exponential per entry instead of one per entry and half-step.
#[inline(always)]
fn scale_history(logits: &[f32], n: usize, iterations: usize, history: &mut Vec<f32>) {
    let size = n * n;
    history.resize((2 * iterations + 1) * size, 0.0);
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    history[..size].iter_mut().zip(logits).for_each(|(k, l)| *k = exp(l - max));
    for step in 0..2 * iterations {
        let (before, after) = history[step * size..(step + 2) * size].split_at_mut(size);
        let by_rows = step % 2 == 0;
        for line in 0..n {
            let sum: f32 = (0..n).map(|k| before[at(n, by_rows, line, k)]).sum();
            (0..n).for_each(|k| after[at(n, by_rows, line, k)] = before[at(n, by_rows, line, k)] / sum);
        }
    }
}

/// One `n × n` matrix of logits normalised `iterations` times, into `out`; `scratch` is reused
/// between calls.
#[inline(always)]
pub(crate) fn sinkhorn_row(logits: &[f32], n: usize, iterations: usize, out: &mut [f32], scratch: &mut Vec<f32>) {
    if scaled(logits) {
        scale_history(logits, n, iterations, scratch);
        out.copy_from_slice(&scratch[2 * iterations * n * n..]);
        return;
    }
    out.copy_from_slice(logits);
    for _ in 0..iterations {
        normalise(out, n, true);
        normalise(out, n, false);
    }
    out.iter_mut().for_each(|v| *v = v.exp());
}

/// The logits' gradient `dm` from the output's `dk`, for one matrix. Scaled: walks the half-steps
/// back, `y = x / Σx` along a line giving `dx = (dy − Σ dy⊙y) / Σx`, then `dm = dK₀ ⊙ K₀`. In log
/// space: replays the iterations keeping every half-step's input, then walks them back: after
/// `m' = m − lse(m)` along a line, `dm = dm' − softmax(m)·Σ dm'` along it.
#[inline(always)]
pub(crate) fn sinkhorn_backward_row(
    logits: &[f32],
    dk: &[f32],
    n: usize,
    iterations: usize,
    dm: &mut [f32],
    scratch: &mut Vec<f32>,
) {
    let size = n * n;
    if scaled(logits) {
        scale_history(logits, n, iterations, scratch);
        dm.copy_from_slice(dk);
        for step in (0..2 * iterations).rev() {
            let (before, after) = (&scratch[step * size..][..size], &scratch[(step + 1) * size..][..size]);
            let by_rows = step % 2 == 0;
            for line in 0..n {
                let index = |k| at(n, by_rows, line, k);
                let sum: f32 = (0..n).map(|k| before[index(k)]).sum();
                let through: f32 = (0..n).map(|k| dm[index(k)] * after[index(k)]).sum();
                (0..n).for_each(|k| dm[index(k)] = (dm[index(k)] - through) / sum);
            }
        }
        dm.iter_mut().zip(&scratch[..size]).for_each(|(d, k)| *d *= k);
        return;
    }
    let mut m = logits.to_vec();
    let mut inputs = Vec::with_capacity(2 * iterations);
    for step in 0..2 * iterations {
        inputs.push(m.clone());
        normalise(&mut m, n, step % 2 == 0);
    }
    // K = exp(m): dm = dK ⊙ K.
    dm.iter_mut().zip(dk.iter().zip(&m)).for_each(|(dm, (dk, m))| *dm = dk * m.exp());
    for (step, before) in inputs.iter().enumerate().rev() {
        let by_rows = step % 2 == 0;
        for line in 0..n {
            let index = |k| at(n, by_rows, line, k);
            let total: f32 = (0..n).map(|k| dm[index(k)]).sum();
            let max = (0..n).map(|k| before[index(k)]).fold(f32::NEG_INFINITY, f32::max);
            let weights: Vec<f32> = (0..n).map(|k| (before[index(k)] - max).exp()).collect();
            let sum: f32 = weights.iter().sum();
            (0..n).for_each(|k| dm[index(k)] -= weights[k] / sum * total);
        }
    }
}

/// The logits' gradient, matrix by matrix ([`sinkhorn_backward_row`]).
struct SinkhornBackward {
    iterations: usize,
}

impl CustomOp2 for SinkhornBackward {
    fn name(&self) -> &'static str {
        "sinkhorn-backward"
    }

    fn cpu_fwd(&self, ls: &CpuStorage, ll: &Layout, gs: &CpuStorage, gl: &Layout) -> Result<(CpuStorage, Shape)> {
        let n = side(ll)?;
        let out = map_row_pairs(f32s(ls, ll)?, f32s(gs, gl)?, n * n, |_, logits, dk, dm| {
            sinkhorn_backward_row(logits, dk, n, self.iterations, dm, &mut Vec::new())
        });
        Ok((CpuStorage::F32(out), ll.shape().clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;
    use candle_core::Device;

    #[test]
    fn sinkhorn_matches_the_reference_after_twenty_iterations() {
        let logits = Tensor::new(&[[4.0f32, 0.3, -1.0], [0.0, 2.0, 1.0], [-2.0, 0.5, 4.0]], &Device::Cpu).unwrap();
        // `_sinkhorn` of the reference on the same matrix: not yet exactly doubly stochastic.
        let reference = [
            [0.944_568_6, 0.051_972_55, 0.004_165_919],
            [0.052_010_66, 0.855_285_2, 0.092_541_65],
            [0.003_420_671, 0.092_742_32, 0.903_292_5],
        ];
        for result in [sinkhorn(&logits, 20), sinkhorn_composite(&logits, 20)] {
            let got = result.unwrap().to_vec2::<f32>().unwrap();
            for (row, want) in got.iter().zip(reference) {
                for (g, w) in row.iter().zip(want) {
                    assert!((g - w).abs() < 1e-6, "{g} vs {w}");
                }
            }
        }
    }

    #[test]
    fn fused_sinkhorn_gradient_matches_the_composite_ops() {
        let (logits, probe) = (random(&[2, 3, 4, 4], 31), random(&[2, 3, 4, 4], 32));
        // Logits spread wider than the scaled iterations take: the log-space ones.
        let wide = (&logits * 40.0).unwrap();
        for logits in [logits, wide] {
            let fused = value_and_grad(&logits, &probe, |l| sinkhorn(l, 20).unwrap());
            let composite = value_and_grad(&logits, &probe, |l| sinkhorn_composite(l, 20).unwrap());
            assert_same("sinkhorn", fused, composite);
        }
    }
}
