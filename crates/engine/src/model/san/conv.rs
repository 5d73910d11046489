//! Causal depthwise convolution along each row of a packed batch: `out[t] = Σ_j taps[j] ⊙ x[t − j·step]`,
//! a position before its row's start reading zeros. The engram values use it with the longest
//! n-gram order as the step; Needle 3's Q, K and V with a step of one.

use candle_core::{Device, Tensor};

use crate::model::packing::Packing;
use crate::model::Result;

/// For each tap after the first, the packed index each token reads (`N`, one past the last token,
/// for a position before its row's start): a prefix token's history is the prefix, a tail's walks
/// back into its prefix ([`Packing::earlier`]).
#[derive(Debug, Clone)]
pub struct CausalTaps {
    from: Vec<Tensor>,
}

impl CausalTaps {
    /// Over the packed tokens of `packing`.
    pub fn new(packing: &Packing, taps: usize, step: usize, device: &Device) -> Result<Self> {
        Self::reading(packing.len(), taps, step, |i, back| packing.earlier(i, back), device)
    }

    /// Over one row of `len` positions, its first the row's start.
    pub fn row(len: usize, taps: usize, step: usize, device: &Device) -> Result<Self> {
        Self::reading(len, taps, step, usize::checked_sub, device)
    }

    /// `earlier(i, back)`: the index of the token `back` positions before token `i` in its row.
    fn reading(
        tokens: usize,
        taps: usize,
        step: usize,
        earlier: impl Fn(usize, usize) -> Option<usize>,
        device: &Device,
    ) -> Result<Self> {
        let from = (1..taps)
            .map(|j| {
                let from: Vec<u32> = (0..tokens).map(|i| earlier(i, j * step).unwrap_or(tokens) as u32).collect();
                Tensor::from_vec(from, tokens, device)
            })
            .collect::<candle_core::Result<_>>()?;
        Ok(Self { from })
    }

    /// `x` `[N, width]` convolved with `taps` `[taps, width]`.
    pub fn apply(&self, x: &Tensor, taps: &Tensor) -> Result<Tensor> {
        // A zero row at index N stands for every position before a row's start.
        let padded = Tensor::cat(&[x, &x.narrow(0, 0, 1)?.zeros_like()?], 0)?;
        let mut out = x.broadcast_mul(&taps.get(0)?)?;
        for (j, from) in self.from.iter().enumerate() {
            out = (out + padded.index_select(from, 0)?.broadcast_mul(&taps.get(j + 1)?)?)?;
        }
        Ok(out)
    }
}
