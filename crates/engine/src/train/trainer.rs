//! One training step of the reference's `finetune_local`: forward with the factors beside the
//! frozen base, masked loss, gradients of the factors, clipped AdamW.
//!
//! A batch is laid out with shared prompt prefixes ([`Packing`]) and split into passes of at most
//! [`Trainer::tokens_per_pass`] packed tokens whose gradients are summed. A [`Forward`] computes
//! them: on the CPU the hand-written path, elsewhere candle's ops and autograd.

use candle_core::Tensor;

use super::adamw::{AdamW, AdamWConfig};
use super::schedule::Schedule;
use crate::dataset::Encoded;
use crate::lora::Lora;
use crate::model::packing::Packing;
use crate::model::{Forward, Network, Result};

/// The frozen base (built once per run), the trainable adapter and the optimizer state.
#[derive(Debug)]
pub struct Trainer {
    forward: Forward,
    pub lora: Lora,
    pub optimizer: AdamW,
    pub schedule: Schedule,
    /// Keep only the lanes between layers and recompute each layer in the backward pass: less
    /// memory for about a third more time.
    pub recompute: bool,
    /// The most packed tokens one pass holds: a bigger batch is split into passes (one row at
    /// least each) whose gradients are summed, which gives the gradient of the whole batch's loss.
    pub tokens_per_pass: usize,
    /// Lay rows that begin alike out with one copy of their common prefix ([`Packing`]).
    pub share_prefixes: bool,
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
        Ok(Self {
            forward: Forward::new(network)?,
            lora,
            optimizer,
            schedule,
            recompute: false,
            tokens_per_pass: usize::MAX,
            share_prefixes: true,
        })
    }

    pub fn network(&self) -> &Network {
        self.forward.network()
    }

    /// Whether steps run the hand-written CPU path.
    pub fn hand_written(&self) -> bool {
        self.forward.hand_written()
    }

    /// Runs steps on candle's ops and autograd even on the CPU (what CUDA and Metal run), or back
    /// on the hand-written path where the network allows it.
    pub fn use_autograd(&mut self, autograd: bool) -> Result<()> {
        let network = self.network().clone();
        self.forward = Forward::with_autograd(network, autograd)?;
        Ok(())
    }

    /// The passes of a batch: its rows' packings (the whole batch's, when it fits one pass).
    fn passes(&self, rows: &[Encoded]) -> Result<Vec<Packing>> {
        let whole = Packing::new(rows, self.share_prefixes)?;
        let passes = whole.passes(self.tokens_per_pass);
        if passes.len() == 1 {
            return Ok(vec![whole]);
        }
        passes
            .into_iter()
            .map(|pass| {
                let part: Vec<Encoded> = pass.into_iter().map(|r| rows[r].clone()).collect();
                Packing::new(&part, self.share_prefixes)
            })
            .collect()
    }

    /// The loss and the gradient of every factor (in [`Lora::vars`] order; zeros where a factor
    /// does not reach the loss).
    pub fn loss_and_gradients(&mut self, rows: &[Encoded]) -> Result<(f32, Vec<Tensor>)> {
        // The loss averages over the whole batch's scored tokens (mask[t] for t ≥ 1), so each
        // pass's sum is divided by the whole batch's count.
        let scored: f64 = rows.iter().map(|r| r.mask.iter().skip(1).map(|&m| f64::from(m)).sum::<f64>()).sum();
        let passes = self.passes(rows)?;
        let low_rank = self.lora.low_rank();
        let (loss, mut grads) = self.forward.loss_and_grads(&passes, &low_rank, scored.max(1.0), self.recompute)?;
        let device = self.forward.network().device().clone();
        Ok((loss, self.lora.tensors_from(&mut grads, &device)?))
    }

    /// One optimizer update on a batch.
    pub fn step(&mut self, rows: &[Encoded]) -> Result<StepOutcome> {
        let (loss, grads) = self.loss_and_gradients(rows)?;
        let lr = self.schedule.at(self.optimizer.count);
        self.optimizer.step(&self.lora.vars(), &grads, lr)?;
        Ok(StepOutcome { loss, lr })
    }

    /// The loss on a batch without gradients (validation), in the same passes as training so
    /// that it needs no more memory.
    pub fn loss(&mut self, rows: &[Encoded]) -> Result<f32> {
        let low_rank = self.lora.low_rank().detached();
        let (sum, count) = self.forward.masked_ce_sum(&self.passes(rows)?, Some(&low_rank))?;
        Ok((sum / count.max(1.0)) as f32)
    }
}
