//! The head's forward, for one head or for several fitted at once.
//!
//! A fit trains several heads on the same rows (one per cross-fitting fold, and the one that
//! ships), each on batches of its own. Every update runs them as one [`HeadStack`]: each parameter
//! gets a leading axis `[H, …]`, so one backward pass and one optimizer update serve them all; the
//! prefix every row shares (an app's tools prompt) is scored by all the heads' probes in one
//! product (for the prefix, `H` heads of `k` probes are one head of `H·k`), each head's own batch
//! of rows is pooled on its own, and the pooled vectors of all heads are mixed and projected
//! together. The heads never mix — head `h`'s logits depend on its own parameters and rows alone —
//! so fitting them together fits what fitting each alone would. One head is a stack of one
//! ([`ConfidenceHead::logits`]).
//!
//! Both generations pool alike here: Needle 3's `k` probes per depth row each take a softmax over
//! that row's tokens; Needle 2's `k` probes each take one over every token × depth cell, which is
//! the same pooling with a single group of `T·R` cells in token-major order (the reference's
//! reshape).

use candle_core::{Tensor, D};

use super::head::{ConfidenceHead, HeadError, ProbeHead, Result};
use crate::model::kernels::frozen_matmul;
use crate::model::norm::rms_unit;

/// Heads of one generation and shape, each parameter stacked along a new leading axis: a
/// [`ConfidenceHead`] whose every tensor is `[H, …]`.
#[derive(Debug, Clone)]
pub struct HeadStack(ConfidenceHead);

impl HeadStack {
    /// `heads` (at least one, all of one generation and shape) stacked.
    pub fn of(heads: &[ConfidenceHead]) -> Result<Self> {
        let Some(first) = heads.first() else {
            return Err(HeadError::Candle(candle_core::Error::Msg("a stack of no confidence heads".into())));
        };
        let tensors: Vec<Vec<Tensor>> = heads.iter().map(ConfidenceHead::tensors).collect();
        let stacked = (0..tensors[0].len())
            .map(|i| Tensor::stack(&tensors.iter().map(|head| &head[i]).collect::<Vec<_>>(), 0))
            .collect::<candle_core::Result<Vec<_>>>()?;
        Ok(Self(first.with_tensors(stacked)))
    }

    /// The stacked parameters, in [`ConfidenceHead::named`]'s order.
    pub fn tensors(&self) -> Vec<Tensor> {
        self.0.tensors()
    }

    /// This stack's kind with `tensors` (stacked, in [`ConfidenceHead::named`]'s order) in place of
    /// its own.
    pub fn with_tensors(&self, tensors: Vec<Tensor>) -> Self {
        Self(self.0.with_tensors(tensors))
    }

    /// The heads, in the order they were stacked.
    pub fn heads(&self) -> Result<Vec<ConfidenceHead>> {
        let tensors = self.tensors();
        (0..tensors[0].dim(0)?)
            .map(|h| {
                let head = tensors.iter().map(|t| t.get(h)).collect::<candle_core::Result<Vec<_>>>()?;
                Ok(self.0.with_tensors(head))
            })
            .collect()
    }

    /// Each head's logit of each of its rows, `[H, B]`: `rows[h] = (cells [B, T, R, d], keep [B, T])`
    /// is head `h`'s batch (f32; `T` its own, `B` every head's), the rows' hidden cells after `prefix
    /// [1, P, R, d]` when every row begins with those `P` ≥ 1 tokens (all kept), and 1 on the tokens
    /// to pool (a row may keep none of its own after a prefix); `depths` (Needle 3 only) keeps the
    /// depth rows of a shallower rung. The inputs are checked by the callers
    /// ([`ConfidenceHead::logits`]; the fit, which builds them).
    pub fn logits(
        &self,
        prefix: Option<&Tensor>,
        rows: &[(Tensor, Tensor)],
        depths: Option<&[bool]>,
    ) -> Result<Tensor> {
        match &self.0 {
            ConfidenceHead::Needle2(_) if depths.is_some() => Err(HeadError::NoLadder),
            ConfidenceHead::Needle2(head) => {
                // One group: every token × depth cell, token-major.
                let grouped = rows
                    .iter()
                    .map(|(cells, keep)| {
                        let (b, t, r, d) = cells.dims4()?;
                        let keep = keep.unsqueeze(2)?.broadcast_as((b, t, r))?.reshape((b, 1, 1, t * r))?;
                        Ok((cells.reshape((b, 1, t * r, d))?, keep))
                    })
                    .collect::<Result<Vec<_>>>()?;
                let prefix = match prefix {
                    Some(prefix) => Some(prefix.reshape((1, (), prefix.dim(3)?))?),
                    None => None,
                };
                let pooled = pool(&head.probes.unsqueeze(1)?, prefix.as_ref(), &grouped)?;
                let (h, b) = (pooled.dim(0)?, pooled.dim(1)?);
                project(&pooled.reshape((h, b, ()))?, &head.kernel, &head.bias)
            }
            ConfidenceHead::Needle3(head) => {
                // A group per depth row: cells by row [B, R, T, d], the prefix [R, P, d].
                let grouped = rows
                    .iter()
                    .map(|(cells, keep)| {
                        let (b, t, _, _) = cells.dims4()?;
                        Ok((cells.permute((0, 2, 1, 3))?.contiguous()?, keep.reshape((b, 1, 1, t))?))
                    })
                    .collect::<Result<Vec<_>>>()?;
                let prefix = match prefix {
                    Some(prefix) => Some(prefix.squeeze(0)?.transpose(0, 1)?.contiguous()?),
                    None => None,
                };
                mix(head, &pool(&head.probes, prefix.as_ref(), &grouped)?, depths)
            }
        }
    }
}

impl ConfidenceHead {
    /// One logit per batch row (before the sigmoid), `[B]`: `cells [B, T, R, d]` (f32) are the
    /// hidden cells of every depth, `keep [B, T]` is 1 on the tokens to pool (0 on PAD), and
    /// `rows` (Needle 3 only) keeps the depth rows of a shallower rung of the depth ladder when the
    /// cells come from the whole network (a rung built on its own has only its rows and needs none).
    pub fn logits(&self, cells: &Tensor, keep: &Tensor, rows: Option<&[bool]>) -> Result<Tensor> {
        let (rows_pooled, d) = self.geometry()?;
        let (cells, keep) = checked_inputs(cells, keep, rows_pooled, d)?;
        let stack = HeadStack::of(std::slice::from_ref(self))?;
        Ok(stack.logits(None, &[(cells, keep)], rows)?.squeeze(0)?)
    }
}

/// Cells `[B, T, R, d]` and keep `[B, T]` as f32, checked against the head's rows (any for a
/// Needle 2 head) and width, every batch row keeping a token.
fn checked_inputs(cells: &Tensor, keep: &Tensor, rows: Option<usize>, d: usize) -> Result<(Tensor, Tensor)> {
    let fits = match (cells.dims(), keep.dims()) {
        (&[b, t, r, width], &[kb, kt]) => b == kb && t == kt && width == d && rows.is_none_or(|rows| rows == r),
        _ => false,
    };
    if !fits {
        return Err(HeadError::Inputs {
            rows: rows.unwrap_or_else(|| cells.dims().get(2).copied().unwrap_or(0)),
            d_model: d,
            cells: cells.dims().to_vec(),
            keep: keep.dims().to_vec(),
        });
    }
    let keep = keep.to_dtype(candle_core::DType::F32)?;
    let kept = keep.gt(0.0)?.to_dtype(candle_core::DType::F32)?.sum(1)?.to_vec1::<f32>()?;
    if let Some(row) = kept.iter().position(|&n| n == 0.0) {
        return Err(HeadError::EmptyRow { row });
    }
    Ok((cells.to_dtype(candle_core::DType::F32)?, keep))
}

/// Each head's probes' softmax-weighted sums of its rows' cells, `[H, B, G, k, d]`: `probes [H, G,
/// k, d]` (`G` groups of cells, each pooled on its own), `rows[h] = (cells [B, G, T, d], keep [B,
/// 1, 1, T])` head `h`'s batch, after the `prefix [G, P, d]` every row begins with, if any. The
/// prefix is scored by every head at once; each head's rows are scored on their own, so that no
/// update copies every head's rows into one buffer (at the demo's sizes, tens of megabytes the
/// allocator maps fresh, and the kernel zeroes, each time). The cells are frozen (the reference's
/// `stop_gradient`): every product with them is a [`frozen_matmul`], so a fit's backward forms no
/// gradient the size of the cells.
fn pool(probes: &Tensor, prefix: Option<&Tensor>, rows: &[(Tensor, Tensor)]) -> Result<Tensor> {
    let (h, g, k, d) = probes.dims4()?;
    let scale = (d as f64).sqrt();
    let prefix = match prefix {
        Some(prefix) => Some(Prefix::of(probes, prefix)?),
        None => None,
    };
    let pooled = rows
        .iter()
        .enumerate()
        .map(|(head, (cells, keep))| {
            let (b, _, t, _) = cells.dims4()?;
            let probes = probes.get(head)?.unsqueeze(0)?.broadcast_as((b, g, k, d))?.contiguous()?;
            let scores = (frozen_matmul(&probes, &cells.transpose(2, 3)?)? / scale)?;
            match &prefix {
                None => Ok(frozen_matmul(&masked_softmax(&scores, keep)?, cells)?),
                Some(prefix) => prefix.merge(head, &scores, &keep.gt(0.0)?.broadcast_as((b, g, k, t))?, cells),
            }
        })
        .collect::<Result<Vec<_>>>()?;
    debug_assert_eq!(pooled.len(), h);
    Ok(Tensor::stack(&pooled, 0)?)
}

/// The prefix every row shares, pooled by every head's probes: its scores' maximum `[H, G, k, 1]`,
/// the sum of their exponentials shifted by it, and the cells summed under those `[H, G, k, d]` —
/// the same for every row.
struct Prefix {
    max: Tensor,
    sum: Tensor,
    pooled: Tensor,
}

impl Prefix {
    /// `prefix [G, P, d]` scored by `probes [H, G, k, d]` in one product (for the prefix, `H` heads
    /// of `k` probes are one head of `H·k`).
    fn of(probes: &Tensor, prefix: &Tensor) -> Result<Self> {
        let (h, g, k, d) = probes.dims4()?;
        let every = probes.transpose(0, 1)?.contiguous()?.reshape((g, h * k, d))?;
        let scores = (frozen_matmul(&every, &prefix.transpose(1, 2)?)? / (d as f64).sqrt())?;
        // The shift keeps `exp` in range and cancels in the quotient, so no gradient flows through it.
        let max = scores.max_keepdim(D::Minus1)?.detach();
        let exp = scores.broadcast_sub(&max)?.exp()?;
        // [G, H·k, x] as each head's [H, G, k, x].
        let per_head = |x: &Tensor| x.reshape((g, h, k, ()))?.transpose(0, 1);
        Ok(Self {
            max: per_head(&max)?,
            sum: per_head(&exp.sum_keepdim(D::Minus1)?)?,
            pooled: per_head(&frozen_matmul(&exp, prefix)?)?,
        })
    }

    /// Head `head`'s pooled cells `[B, G, k, d]` of rows that continue the prefix with their own
    /// `cells [B, G, T, d]`, scored `scores [B, G, k, T]`, where `kept`: one softmax over both
    /// parts, each row rescaling the prefix's part to the maximum over both and adding its own
    /// tokens, as flash attention merges blocks.
    fn merge(&self, head: usize, scores: &Tensor, kept: &Tensor, cells: &Tensor) -> Result<Tensor> {
        let (max, sum, pooled) = (self.max.get(head)?, self.sum.get(head)?, self.pooled.get(head)?);
        let masked = kept.where_cond(scores, &Tensor::full(f32::NEG_INFINITY, scores.shape(), scores.device())?)?;
        let shift = masked.max_keepdim(D::Minus1)?.broadcast_maximum(&max)?.detach();
        let own_exp = masked.broadcast_sub(&shift)?.exp()?;
        let rescale = max.broadcast_sub(&shift)?.exp()?;
        let total = (own_exp.sum_keepdim(D::Minus1)? + rescale.broadcast_mul(&sum)?)?;
        let pooled = (frozen_matmul(&own_exp, cells)? + rescale.broadcast_mul(&pooled)?)?;
        Ok(pooled.broadcast_div(&total)?)
    }
}

/// Each head's logit `[H, B]` of its rows' pooled inputs `[H, B, x]`: `kernel [H, x, 1]`, `bias [H, 1]`.
fn project(pooled: &Tensor, kernel: &Tensor, bias: &Tensor) -> Result<Tensor> {
    let h = bias.dim(0)?;
    Ok(pooled.matmul(kernel)?.broadcast_add(&bias.reshape((h, 1, 1))?)?.squeeze(2)?)
}

/// Needle 3's logits `[H, B]` of the probes' pooled cells `[H, B, R, k, d]`: RMS-normalised and
/// scaled by their row's gains, then mixed by each head's queries and projected.
fn mix(head: &ProbeHead, pooled: &Tensor, rows: Option<&[bool]>) -> Result<Tensor> {
    let (h, b, r, k, d) = pooled.dims5()?;
    let q = head.query.dim(1)?;
    let scale = (d as f64).sqrt();
    let pooled = rms_unit(pooled)?.broadcast_mul(&head.gain.reshape((h, 1, r, k, 1))?)?;
    // Each query over all R·k pooled vectors, with its bias per row and probe: [H, B, q, R·k].
    let scores = pooled.reshape((h, b * r * k, d))?.matmul(&head.query.transpose(1, 2)?)?;
    let scores = (scores.reshape((h, b, r * k, q))?.transpose(2, 3)? / scale)?;
    let scores = scores.broadcast_add(&head.row_bias.reshape((h, 1, q, r * k))?)?;
    let weights = match rows {
        None => softmax(&scores)?,
        Some(rows) => masked_softmax(&scores, &row_mask(rows, r, k, scores.device())?)?,
    };
    let mixed = weights.reshape((h * b, q, r * k))?.matmul(&pooled.reshape((h * b, r * k, d))?)?;
    project(&mixed.reshape((h, b, q * d))?, &head.kernel, &head.bias)
}

/// `[1, 1, R·k]`: 1 on the pooled vectors of the kept depth rows.
fn row_mask(rows: &[bool], r: usize, k: usize, device: &candle_core::Device) -> Result<Tensor> {
    let kept = rows.iter().filter(|&&keep| keep).count();
    if rows.len() != r || kept == 0 {
        return Err(HeadError::RowMask { given: rows.len(), rows: r, kept });
    }
    let mask: Vec<f32> = rows.iter().flat_map(|&keep| std::iter::repeat_n(f32::from(u8::from(keep)), k)).collect();
    Ok(Tensor::from_vec(mask, (1, 1, r * k), device)?)
}

/// Softmax over the last axis.
fn softmax(scores: &Tensor) -> Result<Tensor> {
    // The shift only keeps `exp` in range; the result does not depend on it, so no gradient flows
    // through it.
    let shifted = scores.broadcast_sub(&scores.max_keepdim(D::Minus1)?.detach())?.exp()?;
    Ok(shifted.broadcast_div(&shifted.sum_keepdim(D::Minus1)?)?)
}

/// Softmax over the last axis of the entries where `keep` (broadcast to `scores`) is above 0; the
/// others get weight 0, as the reference's `-inf` scores do. Every slice keeps an entry (the
/// callers check it).
fn masked_softmax(scores: &Tensor, keep: &Tensor) -> Result<Tensor> {
    let kept = keep.gt(0.0)?.broadcast_as(scores.shape())?;
    let masked = kept.where_cond(scores, &Tensor::full(f32::NEG_INFINITY, scores.shape(), scores.device())?)?;
    softmax(&masked)
}
