//! One training step of the reference's `finetune_local`: forward with the factors beside the
//! frozen base, masked loss, gradients of the factors, clipped AdamW.

use candle_core::Tensor;

use super::adamw::{AdamW, AdamWConfig};
use super::schedule::Schedule;
use crate::lora::Lora;
use crate::model::{LowRank, Network, Result};

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
        Ok(Self { network, lora, optimizer, schedule, recompute: false })
    }

    pub fn network(&self) -> &Network {
        &self.network
    }

    /// `Σ ce·mask / max(Σ mask, 1)` on `ids`/`mask` with the factors `low_rank`.
    fn batch_loss(&self, ids: &Tensor, mask: &Tensor, low_rank: &LowRank) -> Result<Tensor> {
        let (sum, count) = self.network.masked_ce_sum(ids, mask, Some(low_rank))?;
        Ok((sum / count.max(1.0))?)
    }

    /// The loss and the gradient of every factor (in [`Lora::vars`] order; zeros where a factor
    /// does not reach the loss). The gradients are detached: candle's gradient of `A` in `x·A`
    /// is `xᵀ·dY`, which would otherwise keep the whole forward graph alive through the moments.
    pub fn loss_and_gradients(&mut self, ids: &Tensor, mask: &Tensor) -> Result<(f32, Vec<Tensor>)> {
        let low_rank = self.lora.low_rank();
        let (loss, grads) = if self.recompute {
            self.network.loss_and_grads_by_layer(ids, mask, &low_rank)?
        } else {
            let loss = self.batch_loss(ids, mask, &low_rank)?;
            (loss.to_scalar()?, loss.backward()?)
        };
        let per_var = self
            .lora
            .vars()
            .iter()
            .map(|v| match grads.get(v.as_tensor()) {
                Some(g) => Ok(g.detach()),
                None => Ok(v.zeros_like()?),
            })
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

    /// The loss on a batch without building a gradient graph (validation).
    pub fn loss(&self, ids: &Tensor, mask: &Tensor) -> Result<f32> {
        Ok(self.batch_loss(ids, mask, &self.lora.low_rank().detached())?.to_scalar()?)
    }
}
