//! The engram memories of a pass ([`crate::model::san::engram::Engram`]), and the injection
//! ([`crate::model::san::engram::injection`]) of one token, forward and backward by hand:
//! `x1 = u + Σₛ σ(⟨û, k̂ₛ⟩/√d)·vₛ`, every site's gate reading the same `u`. The memories (`k̂ₛ`,
//! `vₛ`) depend on no trainable weight: they are computed once per pass, forward only.

use candle_core::Tensor;
use rayon::prelude::*;

use super::mat::{matmul, Mat, MatMut, Threads};
use crate::config::ENGRAM_CONV_TAPS;
use crate::model::host::host;
use crate::model::kernels::{fake_quant_row, inverse_rms};
use crate::model::packing::Packing;
use crate::model::weights::engram::{engram_rows, Engram};
use crate::model::{Network, Result};
use crate::simd::{dot, logistic, widest};
use crate::w4a8::{Activations, CqMatrix};

/// One engram site's memory of a pass, on the host: unit keys and values `[N, d]`.
pub(super) struct Site {
    pub(super) key_unit: Vec<f32>,
    pub(super) value: Vec<f32>,
}

impl Site {
    /// This memory followed by `more`'s tokens: the memories of a batched decoding step's runs,
    /// each computed from its own history, as the memories of the step's packed tokens.
    pub(super) fn extend(&mut self, more: Site) {
        self.key_unit.extend(more.key_unit);
        self.value.extend(more.value);
    }
}

/// Every engram site's memory of the packed tokens `from..`: each token's table rows at its n-gram
/// hashes (zeros for an n-gram that would reach before its row's start), under QAT at the
/// activations' bits, through the key projection (then to unit RMS) and through the value
/// projection and the dilated causal taps — which, like the n-grams, reach back across a tail's
/// start into its shared prefix. Earlier tokens are read, never written: a decoding step passes
/// the history its memories reach back to before `from`.
pub(super) fn memories(network: &Network, packing: &Packing, from: usize) -> Result<Vec<Site>> {
    let Some((geometry, engrams)) = network.engrams() else { return Ok(Vec::new()) };
    let (tokens, d) = (packing.len(), network.config().d_model);
    let (count, (tables, sub, width)) =
        (tokens - from, (geometry.dims.tables, geometry.dims.sub_dim, geometry.dims.width()));
    let rows = engram_rows(packing, geometry);
    // The token each value tap after the first reads, for every token from `from`.
    let back = ENGRAM_CONV_TAPS - 1;
    let reads: Vec<Option<usize>> = (from..tokens)
        .flat_map(|i| (1..ENGRAM_CONV_TAPS).map(move |j| packing.earlier(i, j * geometry.dims.dilation)))
        .collect();
    let mut entries = vec![0f32; tokens * width];
    // `Network::with_codes` checked that there are codes for every site.
    let codes = network.codes().map(|codes| codes.engrams());
    engrams
        .iter()
        .enumerate()
        .map(|(s, engram)| -> Result<Site> {
            let codes = codes.map(|codes| &codes[s]);
            look_up(engram, codes.map(|c| &c.tables), &rows, tables, sub, &mut entries)?;
            let mut key_unit = match codes {
                Some(codes) => integer_product(&codes.key, &entries[from * width..], count, width)?,
                None => float_product(&engram.key_proj, &entries[from * width..], count, width, d)?,
            };
            key_unit.par_chunks_mut(d).for_each(|key| {
                widest(
                    #[inline(always)]
                    || {
                        let r = inverse_rms(key);
                        key.iter_mut().for_each(|k| *k *= r);
                    },
                )
            });
            let projected = match codes {
                Some(codes) => integer_product(&codes.value, &entries, tokens, width)?,
                None => float_product(&engram.value_proj, &entries, tokens, width, d)?,
            };
            let taps = host(&engram.taps)?;
            let mut value = vec![0f32; count * d];
            value.par_chunks_mut(d).zip(reads.par_chunks(back)).enumerate().for_each(|(c, (value, reads))| {
                widest(
                    #[inline(always)]
                    || {
                        let own = &projected[(from + c) * d..][..d];
                        value.iter_mut().zip(own.iter().zip(&taps[..d])).for_each(|(v, (p, w))| *v = p * w);
                        for (j, read) in reads.iter().enumerate() {
                            if let Some(s) = *read {
                                let (earlier, tap) = (&projected[s * d..][..d], &taps[(j + 1) * d..][..d]);
                                value.iter_mut().zip(earlier.iter().zip(tap)).for_each(|(v, (p, w))| *v += p * w);
                            }
                        }
                    },
                )
            });
            Ok(Site { key_unit, value })
        })
        .collect()
}

/// Each token's table rows at its n-gram hashes `rows` (zeros for an n-gram that would reach
/// before its row's start) into `entries` `[N, tables·sub]`: from the table's codes under W4A8
/// (each row decoded exactly as the simulated path's float table holds it), else from the float
/// table, then under QAT at the activations' bits (W4A8's products quantize their inputs
/// themselves).
fn look_up(
    engram: &Engram,
    codes: Option<&CqMatrix>,
    rows: &[Option<u32>],
    tables: usize,
    sub: usize,
    entries: &mut [f32],
) -> Result<()> {
    /// Where the rows are read.
    enum Table<'a, V> {
        Codes(&'a CqMatrix),
        Float(V),
    }
    let table = match codes {
        Some(codes) => Table::Codes(codes),
        None => Table::Float(host(&engram.embedding)?),
    };
    let qat = engram.qat.filter(|_| codes.is_none());
    entries.par_chunks_mut(tables * sub).enumerate().for_each(|(i, row)| {
        widest(
            #[inline(always)]
            || {
                for (part, read) in row.chunks_mut(sub).zip(&rows[i * tables..][..tables]) {
                    match (read, &table) {
                        (None, _) => part.fill(0.0),
                        (Some(r), Table::Codes(codes)) => codes.row(*r as usize, part),
                        (Some(r), Table::Float(table)) => part.copy_from_slice(&table[*r as usize * sub..][..sub]),
                    }
                }
                if let Some(qat) = qat {
                    fake_quant_row(row, qat.act_bits);
                }
            },
        )
    });
    Ok(())
}

/// `x·W` of `rows` rows of `x` (of `width`) with a float kernel `W` `[width, d]`.
fn float_product(kernel: &Tensor, x: &[f32], rows: usize, width: usize, d: usize) -> Result<Vec<f32>> {
    let mut y = vec![0f32; rows * d];
    let kernel = host(kernel)?;
    let x = Mat::new(&x[..rows * width], rows, width);
    matmul(MatMut::new(&mut y, rows, d), x, Mat::new(&kernel, width, d), 1.0, false, Threads::All);
    Ok(y)
}

/// `x·Mᵀ` of `rows` rows of `x` (of `width`) with a projection's CQ codes `M` `[d, width]`, on
/// the integer kernels.
fn integer_product(m: &CqMatrix, x: &[f32], rows: usize, width: usize) -> Result<Vec<f32>> {
    let x = Activations::quantize(&x[..rows * width], rows, width).map_err(candle_core::Error::wrap)?;
    Ok(m.product(&x).map_err(candle_core::Error::wrap)?)
}

/// The gate of site `site` for token `t` with block input `u` (whose inverse RMS is `r_u`).
#[inline(always)]
fn gate(site: &Site, t: usize, u: &[f32], r_u: f32) -> f32 {
    let d = u.len();
    let scale = 1.0 / (d as f32).sqrt();
    logistic(r_u * dot(u, &site.key_unit[t * d..][..d]) * scale)
}

/// `x1 = u + injection(u)` of token `t` from the sites `sites` of the pass's `memories`.
#[inline(always)]
pub(super) fn inject(memories: &[Site], sites: &[usize], t: usize, u: &[f32], x1: &mut [f32]) {
    let d = u.len();
    x1.copy_from_slice(u);
    let r_u = inverse_rms(u);
    for &s in sites {
        let site = &memories[s];
        let gate = gate(site, t, u, r_u);
        x1.iter_mut().zip(&site.value[t * d..][..d]).for_each(|(x, v)| *x += gate * v);
    }
}

/// Adds the injection's share of `u`'s gradient to `du`, from `x1`'s gradient `dx1` (which the
/// caller has already added: `x1 = u + …`). `ones` is a unit gain; `tmp` and `part` are scratch rows.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(super) fn inject_backward(
    memories: &[Site],
    ones: &[f32],
    sites: &[usize],
    t: usize,
    u: &[f32],
    dx1: &[f32],
    du: &mut [f32],
    tmp: &mut [f32],
    part: &mut [f32],
) {
    let d = u.len();
    let (scale, r_u) = (1.0 / (d as f32).sqrt(), inverse_rms(u));
    for &s in sites {
        let site = &memories[s];
        let (key, value) = (&site.key_unit[t * d..][..d], &site.value[t * d..][..d]);
        let gate = gate(site, t, u, r_u);
        // c = ⟨r·u, k̂⟩/√d: dc = ⟨dx1, v⟩·σ'(c), and through the unit norm of u.
        let coef = dot(dx1, value) * gate * (1.0 - gate) * scale;
        tmp.iter_mut().zip(key).for_each(|(t, k)| *t = coef * k);
        crate::model::kernels::rms_norm_backward_row(u, ones, tmp, part);
        du.iter_mut().zip(part.iter()).for_each(|(du, p)| *du += p);
    }
}
