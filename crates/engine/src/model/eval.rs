//! Whole-file evaluation: the token-weighted masked cross-entropy of the answer tokens, batched.

use std::time::Instant;

use serde::Serialize;

use super::packing::Packing;
use super::{Forward, Network};
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
    /// Tokens of the rows (without padding) scored per second.
    pub tokens_per_s: f64,
}

/// Runs `rows` through `network` `batch_size` at a time and averages the cross-entropy over all
/// masked tokens of all rows — the number the reference gets from one batch of everything, padded
/// to `seq_len`. Padding sits after every row's tokens under a causal mask, so no batch is padded,
/// and rows that begin alike share their prefix ([`Packing`]). `progress(done, total)` is called
/// after each batch.
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
    let mut forward = Forward::new(network.clone())?;
    let (mut ce_sum, mut tokens, mut done, mut positions) = (0f64, 0f64, 0usize, 0usize);
    let mut rows = rows.peekable();
    while rows.peek().is_some() {
        let batch: Vec<Encoded> = rows.by_ref().take(batch_size).collect();
        let packing = Packing::new(&batch, true)?;
        let (sum, count) = forward.masked_ce_sum(std::slice::from_ref(&packing), None)?;
        ce_sum += sum;
        tokens += count;
        done += batch.len();
        positions += packing.unshared_len();
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
