//! The fine-tuning objective: next-token cross-entropy over the answer tokens only.

use candle_core::{DType, Tensor};

use super::ops::log_softmax_last;
use super::Result;

/// `(Σ ce·mask, Σ mask)` over shifted positions: logits at t predict `ids[t + 1]`, weighted by
/// `mask[t + 1]`. Both are scalars; summing them over batches gives the token-weighted loss of a
/// whole file.
///
/// `logits` `[B, T, V]` f32, `ids` `[B, T]` integer, `mask` `[B, T]` f32.
pub fn masked_ce_sum(logits: &Tensor, ids: &Tensor, mask: &Tensor) -> Result<(Tensor, Tensor)> {
    let (_, t, _) = logits.dims3()?;
    if t < 2 {
        let zero = Tensor::zeros((), DType::F32, logits.device())?;
        return Ok((zero.clone(), zero));
    }
    let predicted = logits.narrow(1, 0, t - 1)?;
    let targets = ids.narrow(1, 1, t - 1)?.to_dtype(DType::U32)?.contiguous()?.unsqueeze(2)?;
    let weights = mask.narrow(1, 1, t - 1)?;
    let ce = log_softmax_last(&predicted)?.gather(&targets, 2)?.squeeze(2)?.neg()?;
    Ok(((ce * &weights)?.sum_all()?, weights.sum_all()?))
}

/// `Σ ce·mask / max(Σ mask, 1)`: the reference's `loss_fn` (a scalar tensor, differentiable).
pub fn masked_loss(logits: &Tensor, ids: &Tensor, mask: &Tensor) -> Result<Tensor> {
    let (sum, count) = masked_ce_sum(logits, ids, mask)?;
    Ok((sum / count.maximum(1.0)?)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn loss_averages_the_shifted_masked_cross_entropy() {
        // Two positions predict ids[1] = 1 and ids[2] = 0; only the last is masked in.
        let logits = Tensor::new(&[[[0f32, 0.0], [2.0, 0.0], [5.0, 5.0]]], &Device::Cpu).unwrap();
        let ids = Tensor::new(&[[0u32, 1, 0]], &Device::Cpu).unwrap();
        let mask = Tensor::new(&[[1f32, 0.0, 1.0]], &Device::Cpu).unwrap();
        let loss = masked_loss(&logits, &ids, &mask).unwrap().to_scalar::<f32>().unwrap();
        let expected = (1.0f32 + (-2.0f32).exp()).ln(); // −log softmax([2, 0])[0]
        assert!((loss - expected).abs() < 1e-6, "{loss} vs {expected}");
        let none = Tensor::zeros((1, 3), DType::F32, &Device::Cpu).unwrap();
        assert_eq!(masked_loss(&logits, &ids, &none).unwrap().to_scalar::<f32>().unwrap(), 0.0);
    }
}
