//! Whole-file evaluation: the token-weighted masked cross-entropy of the answer tokens, batched.

use std::time::Instant;

use candle_core::{Device, Tensor};
use serde::Serialize;

use super::network::Network;
use super::{ModelError, Result};
use crate::dataset::Encoded;
use crate::tokenizer::PAD_ID;

/// What `needle eval --json` prints.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct EvalSummary {
    /// Σ ce over every masked-in token of the file / their count.
    pub loss: f64,
    pub examples: usize,
    /// Masked-in (answer) tokens the loss averages over.
    pub tokens: usize,
    pub seq_len: usize,
    /// Tokens run through the network per second (each batch padded to its own longest row).
    pub tokens_per_s: f64,
}

/// Runs `rows` through `network` `batch_size` at a time and averages the cross-entropy over all
/// masked tokens of all rows — the number the reference gets from one batch of everything, padded
/// to `seq_len`. Padding sits after every row's tokens under a causal mask, so each batch is
/// padded only to its own longest row. `progress(done, total)` is called after each batch.
pub fn evaluate(
    network: &Network,
    rows: impl ExactSizeIterator<Item = Encoded>,
    seq_len: usize,
    batch_size: usize,
    mut progress: impl FnMut(usize, usize),
) -> Result<EvalSummary> {
    if batch_size == 0 {
        return Err(ModelError::InvalidConfig { field: "batch_size", reason: "is 0; use 1 or more".into() });
    }
    let started = Instant::now();
    let total = rows.len();
    let (mut ce_sum, mut tokens, mut done, mut positions) = (0f64, 0f64, 0usize, 0usize);
    let mut rows = rows.peekable();
    while rows.peek().is_some() {
        let batch: Vec<Encoded> = rows.by_ref().take(batch_size).collect();
        let (ids, mask) = batch_tensors(&batch, network.device())?;
        let (sum, count) = network.masked_ce_sum(&ids, &mask, None)?;
        ce_sum += f64::from(sum.to_scalar::<f32>()?);
        tokens += count;
        done += batch.len();
        positions += ids.elem_count();
        progress(done, total);
    }
    let seconds = started.elapsed().as_secs_f64().max(f64::MIN_POSITIVE);
    Ok(EvalSummary {
        loss: ce_sum / tokens.max(1.0),
        examples: total,
        tokens: tokens as usize,
        seq_len,
        tokens_per_s: positions as f64 / seconds,
    })
}

/// `ids` `[B, L]` u32 and `mask` `[B, L]` f32 on `device`, `L` the batch's longest row: shorter
/// rows are padded with PAD and a zero mask (evaluation and training batch the same way).
pub fn batch_tensors(batch: &[Encoded], device: &Device) -> Result<(Tensor, Tensor)> {
    let longest = batch.iter().map(|row| row.ids.len()).max().unwrap_or(0);
    let mut ids = Vec::with_capacity(batch.len() * longest);
    let mut mask = Vec::with_capacity(batch.len() * longest);
    for row in batch {
        ids.extend(row.ids.iter().copied().chain(std::iter::repeat(PAD_ID)).take(longest));
        mask.extend(row.mask.iter().copied().chain(std::iter::repeat(0.0)).take(longest));
    }
    let shape = (batch.len(), longest);
    Ok((Tensor::from_vec(ids, shape, device)?, Tensor::from_vec(mask, shape, device)?))
}
