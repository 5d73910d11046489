//! Whole-file evaluation: the token-weighted masked cross-entropy of the answer tokens, batched.

use candle_core::{Device, Tensor};
use serde::Serialize;

use super::loss::masked_ce_sum;
use super::network::Network;
use super::{ModelError, Result};
use crate::dataset::Encoded;

/// What `needle eval --json` prints.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct EvalSummary {
    /// Σ ce over every masked-in token of the file / their count.
    pub loss: f64,
    pub examples: usize,
    /// Masked-in (answer) tokens the loss averages over.
    pub tokens: usize,
    pub seq_len: usize,
}

/// Runs `rows` (all `seq_len` long) through `network` `batch_size` at a time and averages the
/// cross-entropy over all masked tokens of all rows — the number the reference gets from one batch
/// of everything. `progress(done, total)` is called after each batch.
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
    let total = rows.len();
    let (mut ce_sum, mut tokens, mut done) = (0f64, 0f64, 0usize);
    let mut rows = rows.peekable();
    while rows.peek().is_some() {
        let batch: Vec<Encoded> = rows.by_ref().take(batch_size).collect();
        let (ids, mask) = batch_tensors(&batch, seq_len, network.device())?;
        let (sum, count) = masked_ce_sum(&network.forward(&ids)?, &ids, &mask)?;
        ce_sum += f64::from(sum.to_scalar::<f32>()?);
        tokens += f64::from(count.to_scalar::<f32>()?);
        done += batch.len();
        progress(done, total);
    }
    Ok(EvalSummary { loss: ce_sum / tokens.max(1.0), examples: total, tokens: tokens as usize, seq_len })
}

/// `ids` `[B, seq_len]` u32 and `mask` `[B, seq_len]` f32 on `device` (evaluation and training
/// batch the same way).
pub fn batch_tensors(batch: &[Encoded], seq_len: usize, device: &Device) -> Result<(Tensor, Tensor)> {
    let ids: Vec<u32> = batch.iter().flat_map(|row| row.ids.iter().copied()).collect();
    let mask: Vec<f32> = batch.iter().flat_map(|row| row.mask.iter().copied()).collect();
    let shape = (batch.len(), seq_len);
    Ok((Tensor::from_vec(ids, shape, device)?, Tensor::from_vec(mask, shape, device)?))
}
