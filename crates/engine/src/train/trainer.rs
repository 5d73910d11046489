//! One training step of the reference's `finetune_local`: merge the factors into the frozen base,
//! forward, masked loss, gradients of the factors, clipped AdamW.

use candle_core::Tensor;

use super::adamw::{AdamW, AdamWConfig};
use super::schedule::Schedule;
use crate::config::ModelConfig;
use crate::lora::Lora;
use crate::model::{masked_loss, Network, Params, Result};

/// The frozen base, the trainable adapter and the optimizer state.
#[derive(Debug)]
pub struct Trainer {
    cfg: ModelConfig,
    params: Params,
    pub lora: Lora,
    pub optimizer: AdamW,
    pub schedule: Schedule,
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
    pub fn new(cfg: ModelConfig, params: Params, lora: Lora, schedule: Schedule) -> Result<Self> {
        let optimizer = AdamW::new(AdamWConfig::default(), &lora.vars())?;
        Ok(Self { cfg, params, lora, optimizer, schedule })
    }

    /// The loss on `ids`/`mask` with the current factors, tracked for gradients.
    fn tracked_loss(&mut self, ids: &Tensor, mask: &Tensor) -> Result<Tensor> {
        self.lora.apply(&mut self.params)?;
        let network = Network::load(&self.cfg, &self.params)?;
        masked_loss(&network.forward(ids)?, ids, mask)
    }

    /// The loss and the gradient of every factor (in [`Lora::vars`] order; zeros where a factor
    /// does not reach the loss).
    pub fn loss_and_gradients(&mut self, ids: &Tensor, mask: &Tensor) -> Result<(f32, Vec<Tensor>)> {
        let loss = self.tracked_loss(ids, mask)?;
        let grads = loss.backward()?;
        let per_var = self
            .lora
            .vars()
            .iter()
            .map(|v| match grads.get(v.as_tensor()) {
                Some(g) => Ok(g.clone()),
                None => Ok(v.zeros_like()?),
            })
            .collect::<Result<_>>()?;
        Ok((loss.to_scalar()?, per_var))
    }

    /// One optimizer update on a batch.
    pub fn step(&mut self, ids: &Tensor, mask: &Tensor) -> Result<StepOutcome> {
        let (loss, grads) = self.loss_and_gradients(ids, mask)?;
        let lr = self.schedule.at(self.optimizer.count);
        self.optimizer.step(&self.lora.vars(), &grads, lr)?;
        Ok(StepOutcome { loss, lr })
    }

    /// The loss on a batch without building a gradient graph (validation).
    pub fn loss(&mut self, ids: &Tensor, mask: &Tensor) -> Result<f32> {
        self.lora.apply_frozen(&mut self.params)?;
        let network = Network::load(&self.cfg, &self.params)?;
        Ok(masked_loss(&network.forward(ids)?, ids, mask)?.to_scalar()?)
    }
}
