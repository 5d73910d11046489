//! The fine-tuning objective: next-token cross-entropy over the answer tokens only.
//!
//! Only positions whose successor is scored reach the vocabulary projection: in a tool-call row
//! the prompt (tools, query) is most of the tokens and none of the loss, and the projection to
//! the vocabulary is the widest matrix of the network.

use candle_core::{DType, Tensor};

use super::kernels::cross_entropy;
use super::Result;

/// The positions of a batch whose next token the loss scores: logits at t predict `ids[t + 1]`,
/// weighted by `mask[t + 1]`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Scored {
    /// `row · T + t` for each scored position, in row-major order.
    pub positions: Vec<u32>,
    pub targets: Vec<u32>,
    pub weights: Vec<f32>,
}

impl Scored {
    /// The scored positions of rows `ids` / `mask` (all of one length T).
    pub fn new(ids: &[Vec<u32>], mask: &[Vec<f32>]) -> Self {
        let mut scored = Self { positions: Vec::new(), targets: Vec::new(), weights: Vec::new() };
        for (row, (ids, mask)) in ids.iter().zip(mask).enumerate() {
            for t in 1..ids.len().min(mask.len()) {
                if mask[t] != 0.0 {
                    scored.positions.push((row * ids.len() + t - 1) as u32);
                    scored.targets.push(ids[t]);
                    scored.weights.push(mask[t]);
                }
            }
        }
        scored
    }

    /// `Σ mask` over the scored positions: what the loss is averaged over.
    pub fn weight_sum(&self) -> f64 {
        self.weights.iter().map(|&w| f64::from(w)).sum()
    }

    /// `Σ ce·mask` from `rows` `[B·T, …]` of all positions, projected to logits by `project`
    /// (applied to the scored rows only). A zero scalar when nothing is scored.
    pub fn ce_sum(&self, rows: &Tensor, project: impl FnOnce(&Tensor) -> Result<Tensor>) -> Result<Tensor> {
        let device = rows.device();
        if self.positions.is_empty() {
            return Ok(Tensor::zeros((), DType::F32, device)?);
        }
        let positions = Tensor::from_slice(&self.positions, self.positions.len(), device)?;
        let logits = project(&rows.index_select(&positions, 0)?)?;
        let ce = cross_entropy(&logits, &self.targets)?;
        let weights = Tensor::from_slice(&self.weights, self.weights.len(), device)?;
        Ok((ce * weights)?.sum_all()?)
    }
}

/// `(Σ ce·mask, Σ mask)` over shifted positions of full logits: summing both over batches gives
/// the token-weighted loss of a whole file.
///
/// `logits` `[B, T, V]` f32, `ids` `[B, T]` integer, `mask` `[B, T]` f32.
pub fn masked_ce_sum(logits: &Tensor, ids: &Tensor, mask: &Tensor) -> Result<(Tensor, f64)> {
    let (b, t, v) = logits.dims3()?;
    let scored = Scored::new(&ids.to_dtype(DType::U32)?.to_vec2()?, &mask.to_vec2()?);
    let sum = scored.ce_sum(&logits.reshape((b * t, v))?, |rows| Ok(rows.clone()))?;
    Ok((sum, scored.weight_sum()))
}

/// `Σ ce·mask / max(Σ mask, 1)`: the reference's `loss_fn` (a scalar tensor, differentiable).
pub fn masked_loss(logits: &Tensor, ids: &Tensor, mask: &Tensor) -> Result<Tensor> {
    let (sum, count) = masked_ce_sum(logits, ids, mask)?;
    Ok((sum / count.max(1.0))?)
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

    #[test]
    fn scored_positions_are_the_predecessors_of_masked_tokens() {
        let scored = Scored::new(&[vec![2, 7, 9, 0], vec![2, 5, 6, 1]], &[vec![0., 0., 1., 0.], vec![0., 1., 1., 1.]]);
        assert_eq!(scored.positions, [1, 4, 5, 6]);
        assert_eq!(scored.targets, [9, 5, 6, 1]);
        assert_eq!(scored.weight_sum(), 4.0);
    }
}
