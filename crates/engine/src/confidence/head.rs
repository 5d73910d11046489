//! The head's forward: its parameters as a checkpoint names them, and the logit of each row of
//! hidden cells.

use candle_core::{DType, Tensor, D};

use crate::config::ModelConfig;
use crate::generation::Generation;
use crate::model::kernels::sigmoid;
use crate::model::norm::rms_unit;
use crate::model::{ModelError, ParamPath, Params};
use crate::quant::{cq_round_trip, cq_round_trip_columns, HEAD_BITS};

/// The checkpoint key both generations store the head under.
pub const KEY: &str = "confidence_head";

/// What can go wrong reading the head or running it.
#[derive(Debug, thiserror::Error)]
pub enum HeadError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(
        "the confidence head reads cells [batch, tokens, {rows}, {d_model}] (the embedding and each of the \
         model's blocks, d_model wide) with a keep mask [batch, tokens]; it was given cells {cells:?} and a \
         mask {keep:?} — collect one cell per depth from the network the head belongs to"
    )]
    Inputs { rows: usize, d_model: usize, cells: Vec<usize>, keep: Vec<usize> },
    #[error(
        "batch row {row} keeps no token (every position is PAD), so the head has nothing to pool; drop \
         empty rows before asking for a confidence"
    )]
    EmptyRow { row: usize },
    #[error(
        "the depth-row mask has {given} entries but the head pools {rows} rows, and keeps {kept} of them; \
         give one entry per row (the embedding, then each block) and keep at least one"
    )]
    RowMask { given: usize, rows: usize, kept: usize },
    #[error(
        "a Needle 2 head has no depth ladder, so it takes no depth-row mask; run it on the cells of the \
         whole network"
    )]
    NoLadder,
    #[error("confidence head computation failed: {0}")]
    Candle(#[from] candle_core::Error),
}

pub type Result<T> = std::result::Result<T, HeadError>;

/// A checkpoint's confidence head, in its generation's form.
#[derive(Debug, Clone)]
pub enum ConfidenceHead {
    Needle2(PooledHead),
    Needle3(ProbeHead),
}

/// 2.0.8's head: `probes [k, d]` over every token × depth cell, then `proj` (`kernel [k·d, 1]`,
/// `bias [1]`).
#[derive(Debug, Clone)]
pub struct PooledHead {
    probes: Tensor,
    kernel: Tensor,
    bias: Tensor,
}

/// 3.2.8's head: `probes [R, k, d]` and `gain [R, k]` per depth row, `query [q, d]` with
/// `row_bias [q, R, k]` over the rows' pooled probes, then `proj` (`kernel [q·d, 1]`, `bias [1]`).
#[derive(Debug, Clone)]
pub struct ProbeHead {
    probes: Tensor,
    gain: Tensor,
    query: Tensor,
    row_bias: Tensor,
    kernel: Tensor,
    bias: Tensor,
}

impl ConfidenceHead {
    /// The head `params` carry for a model of `cfg`, or `None` when they carry none (a base
    /// without one, or a build that dropped it). Probe and query counts are the head's own.
    pub fn load(cfg: &ModelConfig, params: &Params) -> Result<Option<Self>> {
        if !params.has_prefix(KEY) {
            return Ok(None);
        }
        let head = params.root().pp(KEY);
        let d = cfg.d_model;
        // A size read off an array, which the `get` of its full shape then checks.
        let size = |name: &str, axis: usize| head.dims(name).and_then(|dims| dims.get(axis).copied()).unwrap_or(0);
        let loaded = match cfg.generation {
            Generation::Needle2 => {
                let k = size("probes", 0);
                let (kernel, bias) = projection(&head, k * d)?;
                Self::Needle2(PooledHead { probes: head.get(&[k, d], "probes")?, kernel, bias })
            }
            Generation::Needle3 => {
                let (rows, k, q) = (cfg.num_layers + 1, size("probes", 1), size("query", 0));
                let (kernel, bias) = projection(&head, q * d)?;
                Self::Needle3(ProbeHead {
                    probes: head.get(&[rows, k, d], "probes")?,
                    gain: head.get(&[rows, k], "gain")?,
                    query: head.get(&[q, d], "query")?,
                    row_bias: head.get(&[q, rows, k], "row_bias")?,
                    kernel,
                    bias,
                })
            }
        };
        Ok(Some(loaded))
    }

    /// The head's parameters as the checkpoint names them under [`KEY`], in a fixed order.
    pub fn named(&self) -> Vec<(&'static str, &Tensor)> {
        match self {
            Self::Needle2(head) => {
                vec![("probes", &head.probes), ("proj/kernel", &head.kernel), ("proj/bias", &head.bias)]
            }
            Self::Needle3(head) => vec![
                ("probes", &head.probes),
                ("gain", &head.gain),
                ("query", &head.query),
                ("row_bias", &head.row_bias),
                ("proj/kernel", &head.kernel),
                ("proj/bias", &head.bias),
            ],
        }
    }

    /// The parameters in [`ConfidenceHead::named`]'s order.
    pub fn tensors(&self) -> Vec<Tensor> {
        self.named().into_iter().map(|(_, tensor)| tensor.clone()).collect()
    }

    /// A head of `generation` from its parameters in [`ConfidenceHead::named`]'s order.
    pub(super) fn from_tensors(generation: Generation, tensors: Vec<Tensor>) -> Self {
        let mut tensors = tensors.into_iter();
        let mut next = || tensors.next().expect("a tensor per parameter of the head");
        match generation {
            Generation::Needle2 => Self::Needle2(PooledHead { probes: next(), kernel: next(), bias: next() }),
            Generation::Needle3 => Self::Needle3(ProbeHead {
                probes: next(),
                gain: next(),
                query: next(),
                row_bias: next(),
                kernel: next(),
                bias: next(),
            }),
        }
    }

    /// This head's kind with `tensors` (in [`ConfidenceHead::named`]'s order) in place of its own.
    pub fn with_tensors(&self, tensors: Vec<Tensor>) -> Self {
        Self::from_tensors(self.generation(), tensors)
    }

    pub fn generation(&self) -> Generation {
        match self {
            Self::Needle2(_) => Generation::Needle2,
            Self::Needle3(_) => Generation::Needle3,
        }
    }

    /// The head as quantization-aware training and the `.cact` compute it (the reference's
    /// `quant=True`): Needle 3's probes, queries and projection through CQ at 4 bits and back, the
    /// projection's groups running along its input. 2.0.8 quantizes no head weight (its `.cact`
    /// stores the head in FP16), so a Needle 2 head is returned as it is.
    pub fn through_cq(self) -> Result<Self> {
        Ok(match self {
            Self::Needle2(head) => Self::Needle2(head),
            Self::Needle3(head) => Self::Needle3(ProbeHead {
                probes: cq_rows(&head.probes)?,
                query: cq_rows(&head.query)?,
                kernel: cq_columns(&head.kernel)?,
                ..head
            }),
        })
    }

    /// The depth rows the head pools (the embedding, then one per block; any number for a Needle 2
    /// head, which pools all cells alike) and the cells' width.
    fn geometry(&self) -> Result<(Option<usize>, usize)> {
        Ok(match self {
            Self::Needle2(head) => (None, head.probes.dim(1)?),
            Self::Needle3(head) => (Some(head.probes.dim(0)?), head.probes.dim(2)?),
        })
    }

    /// One logit per batch row (before the sigmoid), `[B]`: `cells [B, T, R, d]` (f32) are the
    /// hidden cells of every depth, `keep [B, T]` is 1 on the tokens to pool (0 on PAD), and
    /// `rows` (Needle 3 only) keeps the depth rows of a shallower rung of the depth ladder when the
    /// cells come from the whole network (a rung built on its own has only its rows and needs none).
    pub fn logits(&self, cells: &Tensor, keep: &Tensor, rows: Option<&[bool]>) -> Result<Tensor> {
        let (rows_pooled, d) = self.geometry()?;
        let (cells, keep) = checked_inputs(cells, keep, rows_pooled, d)?;
        match self {
            Self::Needle2(_) if rows.is_some() => Err(HeadError::NoLadder),
            Self::Needle2(head) => head.logits(&cells, &keep),
            Self::Needle3(head) => head.logits(&cells, &keep, rows),
        }
    }

    /// [`ConfidenceHead::logits`] of rows that all begin with the same tokens, `prefix [1, P, R, d]`
    /// (every token kept, `P` ≥ 1), then continue with their own `cells [B, S, R, d]` under `keep
    /// [B, S]` (a row may keep none of its own). The prefix's scores, and its cells summed under
    /// them, are the same for every row, so they are computed once and each row's softmax is
    /// completed with its own tokens (the merge flash attention makes): the logits are those of the
    /// whole rows up to rounding, at the cost of the rows' own tokens. Fitting runs every step
    /// so, over rows that share an app's tools prompt.
    pub fn logits_after(&self, prefix: &Tensor, cells: &Tensor, keep: &Tensor) -> Result<Tensor> {
        let (rows_pooled, d) = self.geometry()?;
        let fits = match (prefix.dims(), cells.dims(), keep.dims()) {
            (&[1, p, pr, pd], &[b, t, r, width], &[kb, kt]) => {
                p > 0 && pr == r && pd == d && b == kb && t == kt && width == d && rows_pooled.is_none_or(|n| n == r)
            }
            _ => false,
        };
        if !fits {
            return Err(HeadError::Inputs {
                rows: rows_pooled.unwrap_or_else(|| cells.dims().get(2).copied().unwrap_or(0)),
                d_model: d,
                cells: [prefix.dims(), cells.dims()].concat(),
                keep: keep.dims().to_vec(),
            });
        }
        let (prefix, cells, keep) =
            (prefix.to_dtype(DType::F32)?, cells.to_dtype(DType::F32)?, keep.to_dtype(DType::F32)?);
        match self {
            Self::Needle2(head) => head.logits_after(&prefix, &cells, &keep),
            Self::Needle3(head) => head.logits_after(&prefix, &cells, &keep),
        }
    }
}

/// The uncalibrated confidence of each logit: its sigmoid.
pub fn confidence(logits: &Tensor) -> Result<Tensor> {
    Ok(sigmoid(logits)?)
}

/// `proj/kernel [inputs, 1]` and `proj/bias [1]`.
fn projection(head: &ParamPath, inputs: usize) -> Result<(Tensor, Tensor)> {
    let proj = head.pp("proj");
    Ok((proj.get(&[inputs, 1], "kernel")?, proj.get(&[1], "bias")?))
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
    let keep = keep.to_dtype(DType::F32)?;
    let kept = keep.gt(0.0)?.to_dtype(DType::F32)?.sum(1)?.to_vec1::<f32>()?;
    if let Some(row) = kept.iter().position(|&n| n == 0.0) {
        return Err(HeadError::EmptyRow { row });
    }
    Ok((cells.to_dtype(DType::F32)?, keep))
}

impl PooledHead {
    fn logits(&self, cells: &Tensor, keep: &Tensor) -> Result<Tensor> {
        let (cells, keep) = token_major(cells, keep)?;
        let weights = masked_softmax(&self.scores(&cells)?, &keep.unsqueeze(1)?)?;
        self.project(&weights.matmul(&cells)?)
    }

    fn logits_after(&self, prefix: &Tensor, cells: &Tensor, keep: &Tensor) -> Result<Tensor> {
        let (cells, keep) = token_major(cells, keep)?;
        let prefix = prefix.reshape((1, (), prefix.dim(3)?))?;
        let pooled = pool_after(
            &Pooling { scores: self.scores(&prefix)?, cells: prefix },
            &Pooling { scores: self.scores(&cells)?, cells },
            &keep.unsqueeze(1)?,
        )?;
        self.project(&pooled)
    }

    /// Each probe's score of every cell, `[B, k, T·R]`, from token-major cells `[B, T·R, d]`.
    fn scores(&self, cells: &Tensor) -> Result<Tensor> {
        let d = cells.dim(2)?;
        Ok((cells.broadcast_matmul(&self.probes.t()?)?.transpose(1, 2)? / (d as f64).sqrt())?)
    }

    /// The logit of the probes' pooled cells `[B, k, d]`.
    fn project(&self, pooled: &Tensor) -> Result<Tensor> {
        let pooled = pooled.reshape((pooled.dim(0)?, ()))?;
        Ok(pooled.matmul(&self.kernel)?.broadcast_add(&self.bias)?.squeeze(1)?)
    }
}

/// Token-major cells `[B, T·R, d]` (every depth of token 0, then of token 1, …: the reference's
/// reshape) and their keep mask `[B, T·R]`.
fn token_major(cells: &Tensor, keep: &Tensor) -> Result<(Tensor, Tensor)> {
    let (b, t, r, d) = cells.dims4()?;
    let keep = keep.unsqueeze(2)?.broadcast_as((b, t, r))?.reshape((b, t * r))?;
    Ok((cells.reshape((b, t * r, d))?, keep))
}

impl ProbeHead {
    fn logits(&self, cells: &Tensor, keep: &Tensor, rows: Option<&[bool]>) -> Result<Tensor> {
        // Per depth row l: scores [B, R, k, T] of its k probes over the row's tokens, pooled to
        // [B, R, k, d].
        let by_row = cells.permute((0, 2, 1, 3))?.contiguous()?;
        let weights = masked_softmax(&self.scores(&by_row)?, &keep.unsqueeze(1)?.unsqueeze(1)?)?;
        self.mix(&weights.contiguous()?.matmul(&by_row)?, rows)
    }

    fn logits_after(&self, prefix: &Tensor, cells: &Tensor, keep: &Tensor) -> Result<Tensor> {
        let prefix = prefix.permute((0, 2, 1, 3))?.contiguous()?;
        let by_row = cells.permute((0, 2, 1, 3))?.contiguous()?;
        let pooled = pool_after(
            &Pooling { scores: self.scores(&prefix)?, cells: prefix },
            &Pooling { scores: self.scores(&by_row)?, cells: by_row },
            &keep.unsqueeze(1)?.unsqueeze(1)?,
        )?;
        self.mix(&pooled, None)
    }

    /// Each depth row's probes' scores of its tokens, `[B, R, k, T]`, from cells by row `[B, R, T, d]`.
    fn scores(&self, by_row: &Tensor) -> Result<Tensor> {
        let scale = (by_row.dim(3)? as f64).sqrt();
        Ok((by_row.broadcast_matmul(&self.probes.transpose(1, 2)?)?.transpose(2, 3)? / scale)?)
    }

    /// The logit of the probes' pooled cells `[B, R, k, d]`: RMS-normalised and scaled by their
    /// row's gains, then mixed by the queries and projected.
    fn mix(&self, pooled: &Tensor, rows: Option<&[bool]>) -> Result<Tensor> {
        let (b, r, k, d) = pooled.dims4()?;
        let q = self.query.dim(0)?;
        let scale = (d as f64).sqrt();
        let pooled = rms_unit(pooled)?;
        let pooled = pooled.broadcast_mul(&self.gain.unsqueeze(2)?)?.reshape((b, r * k, d))?;
        // Each query over all R·k pooled vectors, with its bias per row and probe.
        let scores = (pooled.broadcast_matmul(&self.query.t()?)?.transpose(1, 2)? / scale)?;
        let scores = scores.broadcast_add(&self.row_bias.reshape((q, r * k))?)?;
        let weights = match rows {
            None => softmax(&scores)?,
            Some(rows) => masked_softmax(&scores, &row_mask(rows, r, k, scores.device())?)?,
        };
        let mixed = weights.contiguous()?.matmul(&pooled)?.reshape((b, q * d))?;
        Ok(mixed.matmul(&self.kernel)?.broadcast_add(&self.bias)?.squeeze(1)?)
    }
}

/// Scores `[…, n]` of cells `[…, n, d]`: a shared prefix's (batch 1) or the rows' own.
struct Pooling {
    scores: Tensor,
    cells: Tensor,
}

/// The softmax-weighted sum `[B, …, d]` of the prefix's cells and each row's own (where `keep`,
/// broadcast to the rows' scores, is above 0), as one softmax over both would give it. The
/// prefix's exponentials, shifted by its own maximum, and its cells summed under them are the
/// same for every row; each row rescales them to the maximum over both parts and adds its own.
fn pool_after(prefix: &Pooling, own: &Pooling, keep: &Tensor) -> Result<Tensor> {
    // The shifts keep `exp` in range and cancel in the quotient, so no gradient flows through them.
    let prefix_max = prefix.scores.max_keepdim(D::Minus1)?.detach();
    let prefix_exp = prefix.scores.broadcast_sub(&prefix_max)?.exp()?;
    let prefix_sum = prefix_exp.sum_keepdim(D::Minus1)?;
    let prefix_pooled = prefix_exp.contiguous()?.matmul(&prefix.cells)?;
    let kept = keep.gt(0.0)?.broadcast_as(own.scores.shape())?;
    let masked =
        kept.where_cond(&own.scores, &Tensor::full(f32::NEG_INFINITY, own.scores.shape(), own.scores.device())?)?;
    let shift = masked.max_keepdim(D::Minus1)?.broadcast_maximum(&prefix_max)?.detach();
    let own_exp = masked.broadcast_sub(&shift)?.exp()?;
    let rescale = prefix_max.broadcast_sub(&shift)?.exp()?;
    let total = (own_exp.sum_keepdim(D::Minus1)? + rescale.broadcast_mul(&prefix_sum)?)?;
    let pooled = (own_exp.contiguous()?.matmul(&own.cells)? + rescale.broadcast_mul(&prefix_pooled)?)?;
    Ok(pooled.broadcast_div(&total)?)
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

/// A matrix `[…, in]` through CQ at [`HEAD_BITS`] and back, its groups along the last axis.
fn cq_rows(weight: &Tensor) -> Result<Tensor> {
    let width = weight.dim(D::Minus1)?;
    let values = weight.flatten_all()?.to_vec1::<f32>()?;
    Ok(Tensor::from_vec(cq_round_trip(&values, width, HEAD_BITS), weight.shape(), weight.device())?)
}

/// A kernel `[in, out]` through CQ at [`HEAD_BITS`] and back, its groups down the columns.
fn cq_columns(kernel: &Tensor) -> Result<Tensor> {
    let (inputs, outputs) = kernel.dims2()?;
    let mut values = kernel.flatten_all()?.to_vec1::<f32>()?;
    cq_round_trip_columns(&mut values, inputs, outputs, HEAD_BITS);
    Ok(Tensor::from_vec(values, (inputs, outputs), kernel.device())?)
}
