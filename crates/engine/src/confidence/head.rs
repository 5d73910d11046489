//! The head's parameters as a checkpoint names them: loaded from one, and put through CQ as the
//! `.cact` runs them. Its forward is [`super::forward`]'s, its fit [`super::fit`]'s.

use candle_core::{Tensor, D};

use crate::config::ModelConfig;
use crate::generation::Generation;
use crate::model::kernels::sigmoid;
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
    pub(super) probes: Tensor,
    pub(super) kernel: Tensor,
    pub(super) bias: Tensor,
}

/// 3.2.8's head: `probes [R, k, d]` and `gain [R, k]` per depth row, `query [q, d]` with
/// `row_bias [q, R, k]` over the rows' pooled probes, then `proj` (`kernel [q·d, 1]`, `bias [1]`).
#[derive(Debug, Clone)]
pub struct ProbeHead {
    pub(super) probes: Tensor,
    pub(super) gain: Tensor,
    pub(super) query: Tensor,
    pub(super) row_bias: Tensor,
    pub(super) kernel: Tensor,
    pub(super) bias: Tensor,
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
    pub(super) fn geometry(&self) -> Result<(Option<usize>, usize)> {
        Ok(match self {
            Self::Needle2(head) => (None, head.probes.dim(1)?),
            Self::Needle3(head) => (Some(head.probes.dim(0)?), head.probes.dim(2)?),
        })
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
