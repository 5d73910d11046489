//! One training step of the reference's `finetune_local`: forward with the factors beside the
//! frozen base, masked loss, gradients of the factors, clipped AdamW.

use candle_core::{DType, Tensor};

use super::adamw::{AdamW, AdamWConfig};
use super::schedule::Schedule;
use crate::lora::Lora;
use crate::model::{LowRank, Network, Result};
use crate::tokenizer::PAD_ID;

/// The frozen base (built once per run), the trainable adapter and the optimizer state.
#[derive(Debug)]
pub struct Trainer {
    network: Network,
    pub lora: Lora,
    pub optimizer: AdamW,
    pub schedule: Schedule,
    /// Keep one layer's activations at a time and recompute them in the backward pass
    /// ([`Network::loss_and_grads_by_layer`]): less memory for about a third more time.
    pub recompute: bool,
    /// Rows per forward and backward pass: a larger batch is split and its gradients summed,
    /// which gives the gradient of the whole batch's loss.
    pub micro_batch: usize,
}

/// What one update did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepOutcome {
    /// The loss before the update.
    pub loss: f32,
    /// The learning rate the update used.
    pub lr: f32,
}

impl Trainer {
    pub fn new(network: Network, lora: Lora, schedule: Schedule) -> Result<Self> {
        let optimizer = AdamW::new(AdamWConfig::default(), &lora.vars())?;
        Ok(Self { network, lora, optimizer, schedule, recompute: false, micro_batch: usize::MAX })
    }

    pub fn network(&self) -> &Network {
        &self.network
    }

    /// `Σ ce·mask / normalizer` on `ids`/`mask` with the factors `low_rank`.
    fn batch_loss(&self, ids: &Tensor, mask: &Tensor, low_rank: &LowRank, normalizer: f64) -> Result<Tensor> {
        let (sum, _) = self.network.masked_ce_sum(ids, mask, Some(low_rank))?;
        Ok((sum / normalizer)?)
    }

    /// The loss and the gradient of every factor (in [`Lora::vars`] order; zeros where a factor
    /// does not reach the loss). The gradients are detached: candle's gradient of `A` in `x·A`
    /// is `xᵀ·dY`, which would otherwise keep the whole forward graph alive through the moments.
    pub fn loss_and_gradients(&mut self, ids: &Tensor, mask: &Tensor) -> Result<(f32, Vec<Tensor>)> {
        let low_rank = self.lora.low_rank();
        let vars = self.lora.vars();
        // The loss averages over the whole batch's scored tokens (mask[t] for t ≥ 1), so each
        // micro-batch's sum is divided by the whole batch's count.
        let (rows, positions) = ids.dims2()?;
        let normalizer = match positions {
            0 | 1 => 1.0,
            _ => f64::from(mask.narrow(1, 1, positions - 1)?.sum_all()?.to_scalar::<f32>()?).max(1.0),
        };
        let mut loss = 0f32;
        let mut per_var: Vec<Option<Tensor>> = vec![None; vars.len()];
        let chunk = self.micro_batch.clamp(1, rows.max(1));
        for start in (0..rows).step_by(chunk) {
            let (ids, mask) = trimmed_rows(ids, mask, start, chunk.min(rows - start))?;
            let (part, grads) = if self.recompute {
                self.network.loss_and_grads_by_layer(&ids, &mask, &low_rank, normalizer)?
            } else {
                let part = self.batch_loss(&ids, &mask, &low_rank, normalizer)?;
                (part.to_scalar()?, part.backward()?)
            };
            loss += part;
            for (total, var) in per_var.iter_mut().zip(&vars) {
                if let Some(grad) = grads.get(var.as_tensor()) {
                    *total = Some(match total.take() {
                        Some(earlier) => (earlier + grad)?.detach(),
                        None => grad.detach(),
                    });
                }
            }
        }
        let per_var = per_var
            .into_iter()
            .zip(&vars)
            .map(|(grad, var)| grad.map_or_else(|| Ok(var.zeros_like()?), Ok))
            .collect::<Result<_>>()?;
        Ok((loss, per_var))
    }

    /// One optimizer update on a batch.
    pub fn step(&mut self, ids: &Tensor, mask: &Tensor) -> Result<StepOutcome> {
        let (loss, grads) = self.loss_and_gradients(ids, mask)?;
        let lr = self.schedule.at(self.optimizer.count);
        self.optimizer.step(&self.lora.vars(), &grads, lr)?;
        Ok(StepOutcome { loss, lr })
    }

    /// The loss on a batch without building a gradient graph (validation), in the same
    /// micro-batches as training so that it needs no more memory.
    pub fn loss(&self, ids: &Tensor, mask: &Tensor) -> Result<f32> {
        let low_rank = self.lora.low_rank().detached();
        let rows = ids.dim(0)?;
        let (mut sum, mut count) = (0f64, 0f64);
        let chunk = self.micro_batch.clamp(1, rows.max(1));
        for start in (0..rows).step_by(chunk) {
            let (ids, mask) = trimmed_rows(ids, mask, start, chunk.min(rows - start))?;
            let (part, weight) = self.network.masked_ce_sum(&ids, &mask, Some(&low_rank))?;
            sum += f64::from(part.to_scalar::<f32>()?);
            count += weight;
        }
        Ok((sum / count.max(1.0)) as f32)
    }
}

/// Rows `start..start + count` of a batch without the columns that are padding in all of them
/// (PAD with a zero mask at the end): padding after every scored token changes no loss.
fn trimmed_rows(ids: &Tensor, mask: &Tensor, start: usize, count: usize) -> Result<(Tensor, Tensor)> {
    let (ids, mask) = (ids.narrow(0, start, count)?, mask.narrow(0, start, count)?);
    let (id_rows, mask_rows) = (ids.to_dtype(DType::U32)?.to_vec2::<u32>()?, mask.to_vec2::<f32>()?);
    let used = id_rows
        .iter()
        .zip(&mask_rows)
        .map(|(ids, mask)| ids.iter().zip(mask).rposition(|(&id, &m)| id != PAD_ID || m != 0.0).map_or(0, |p| p + 1))
        .max()
        .unwrap_or(0)
        .max(1);
    Ok((ids.narrow(1, 0, used)?, mask.narrow(1, 0, used)?))
}
