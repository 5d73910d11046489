//! Cross-entropy of the scored rows, without a log-softmax of the whole logit matrix.

use candle_core::{bail, CpuStorage, CustomOp1, CustomOp2, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

use super::rows::{f32s, fused, map_rows};
use crate::simd::exp;

/// `−log softmax(logits)[target]` per row of `logits` `[N, V]`: `[N]`. The backward is
/// `(softmax − onehot)·dce`, formed without keeping a log-softmax of the whole matrix.
pub fn cross_entropy(logits: &Tensor, targets: &[u32]) -> Result<Tensor> {
    if fused(logits) {
        return logits.contiguous()?.apply_op1(CrossEntropy { targets: targets.to_vec() });
    }
    cross_entropy_composite(logits, targets)
}

fn cross_entropy_composite(logits: &Tensor, targets: &[u32]) -> Result<Tensor> {
    let targets = Tensor::from_slice(targets, targets.len(), logits.device())?.unsqueeze(1)?;
    let log_probs = logits.broadcast_sub(&logits.log_sum_exp(1)?.unsqueeze(1)?)?;
    log_probs.gather(&targets, 1)?.squeeze(1)?.neg()
}

struct CrossEntropy {
    targets: Vec<u32>,
}

#[inline(always)]
pub(crate) fn log_sum_exp(x: &[f32]) -> f32 {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut acc = [0f32; 16];
    let chunks = x.chunks_exact(16);
    let tail: f32 = chunks.remainder().iter().map(|v| exp(v - max)).sum();
    for c in chunks {
        for i in 0..16 {
            acc[i] += exp(c[i] - max);
        }
    }
    max + (acc.iter().sum::<f32>() + tail).ln()
}

impl CustomOp1 for CrossEntropy {
    fn name(&self) -> &'static str {
        "cross-entropy"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let (n, v) = layout.shape().dims2()?;
        let logits = f32s(storage, layout)?;
        if self.targets.len() != n || self.targets.iter().any(|&t| t as usize >= v) {
            bail!("cross-entropy: {} targets for {n} rows of {v} classes", self.targets.len());
        }
        let ce = (0..n)
            .into_par_iter()
            .map(|i| {
                let row = &logits[i * v..(i + 1) * v];
                log_sum_exp(row) - row[self.targets[i] as usize]
            })
            .collect();
        Ok((CpuStorage::F32(ce), Shape::from(n)))
    }

    fn bwd(&self, logits: &Tensor, _ce: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        let backward = CrossEntropyBackward { targets: self.targets.clone() };
        Ok(Some(logits.apply_op2_no_bwd(&grad.contiguous()?, &backward)?))
    }
}

struct CrossEntropyBackward {
    targets: Vec<u32>,
}

impl CustomOp2 for CrossEntropyBackward {
    fn name(&self) -> &'static str {
        "cross-entropy-backward"
    }

    fn cpu_fwd(&self, ls: &CpuStorage, ll: &Layout, gs: &CpuStorage, gl: &Layout) -> Result<(CpuStorage, Shape)> {
        let (_, v) = ll.shape().dims2()?;
        let grad = f32s(gs, gl)?;
        let out = map_rows(f32s(ls, ll)?, v, |i, row, o| {
            let lse = log_sum_exp(row);
            o.iter_mut().zip(row).for_each(|(o, x)| *o = exp(x - lse) * grad[i]);
            o[self.targets[i] as usize] -= grad[i];
        });
        Ok((CpuStorage::F32(out), ll.shape().clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;

    #[test]
    fn fused_cross_entropy_matches_the_composite_ops() {
        let (logits, probe, targets) = (random(&[4, 9], 12), random(&[4], 13), [0u32, 8, 3, 3]);
        let fused = value_and_grad(&logits, &probe, |l| cross_entropy(l, &targets).unwrap());
        let composite = value_and_grad(&logits, &probe, |l| cross_entropy_composite(l, &targets).unwrap());
        assert_same("cross-entropy", fused, composite);
    }
}
