//! Engram memory: hashed n-gram lookups into learned tables, projected to keys and values once per
//! sequence and injected into the residual stream at the configured layers through a gate that
//! compares each memory's key with the current state.

use candle_core::{Device, Tensor, D};

use super::conv::CausalTaps;
use crate::config::ENGRAM_CONV_TAPS;
use crate::model::kernels::{fake_quant_rows, sigmoid};
use crate::model::norm::rms_unit;
use crate::model::packing::Packing;
use crate::model::weights::engram::{engram_rows, Engram, EngramGeometry};
use crate::model::Result;

/// The table lookups of one packed batch, shared by every engram site.
#[derive(Debug, Clone)]
pub struct EngramLookup {
    /// `table · slots + slot` per (token, table), flattened.
    flat_slots: Tensor,
    /// `[N, tables, 1]`: 1 where the n-gram of that table's order fits in the causal window
    /// (the reference's `_mask_diag(causal, order − 1)`), else 0.
    ngram_ok: Tensor,
    /// The value convolution's taps, `dilation` positions apart.
    taps: CausalTaps,
    tokens: usize,
}

impl EngramLookup {
    pub fn new(packing: &Packing, geometry: &EngramGeometry, device: &Device) -> Result<Self> {
        let (tokens, tables) = (packing.len(), geometry.dims.tables);
        let rows = engram_rows(packing, geometry);
        // A masked lookup reads row 0, then is multiplied by 0.
        let flat: Vec<u32> = rows.iter().map(|row| row.unwrap_or(0)).collect();
        let ok: Vec<f32> = rows.iter().map(|row| if row.is_some() { 1.0 } else { 0.0 }).collect();
        let taps = CausalTaps::new(packing, ENGRAM_CONV_TAPS, geometry.dims.dilation, device)?;
        Ok(Self {
            flat_slots: Tensor::from_vec(flat, tokens * tables, device)?,
            ngram_ok: Tensor::from_vec(ok, (tokens, tables, 1), device)?,
            taps,
            tokens,
        })
    }
}

/// One site's memory for a packed batch: keys and values `[N, d_model]`.
#[derive(Debug, Clone)]
pub struct EngramKv {
    pub(in crate::model) key: Tensor,
    pub(in crate::model) value: Tensor,
}

impl EngramKv {
    /// The memories of packed tokens `from..from + len`.
    pub fn positions(&self, from: usize, len: usize) -> Result<Self> {
        Ok(Self { key: self.key.narrow(0, from, len)?, value: self.value.narrow(0, from, len)? })
    }
}

/// `Σₛ σ(⟨x̂, k̂ₛ⟩ / √d) · vₛ` with x̂, k̂ RMS-normalised, every site's gate read from the same `x`
/// (the reference's injection): what a block adds to its input.
pub fn injection(x: &Tensor, memories: &[&EngramKv]) -> Result<Option<Tensor>> {
    let d = x.dim(D::Minus1)? as f64;
    let unit = rms_unit(x)?;
    let mut total: Option<Tensor> = None;
    for memory in memories {
        let score = (&unit * rms_unit(&memory.key)?)?.sum_keepdim(D::Minus1)?;
        let added = memory.value.broadcast_mul(&sigmoid(&(score / d.sqrt())?)?)?;
        total = Some(match total {
            Some(sum) => (sum + added)?,
            None => added,
        });
    }
    Ok(total)
}

impl Engram {
    pub fn forward(&self, lookup: &EngramLookup) -> Result<EngramKv> {
        let (n, g) = (lookup.tokens, &self.geometry);
        let (tables, sub_dim) = (g.dims.tables, g.dims.sub_dim);
        let rows = self.embedding.reshape((tables * g.slots, sub_dim))?;
        let fetched = rows.index_select(&lookup.flat_slots, 0)?.reshape((n, tables, sub_dim))?;
        let e = fetched.broadcast_mul(&lookup.ngram_ok)?.reshape((n, g.dims.width()))?;
        let e = match self.qat {
            Some(qat) => fake_quant_rows(&e, qat.act_bits)?,
            None => e,
        };
        let key = e.matmul(&self.key_proj)?;
        let value = lookup.taps.apply(&e.matmul(&self.value_proj)?, &self.taps)?;
        Ok(EngramKv { key, value })
    }
}
