//! The engram injection ([`crate::model::san::engram::injection`]) of one token, forward and
//! backward by hand: `x1 = u + Σₛ σ(⟨û, k̂ₛ⟩/√d)·vₛ`, every site's gate reading the same `u`. The
//! memories themselves (`k̂ₛ`, `vₛ`) depend on no trainable weight: the candle modules compute them
//! once per pass ([`super::CpuNetwork`]'s sites).

use super::Pass;
use crate::model::kernels::{dot, inverse_rms, logistic};

/// One engram site's memory of a pass, on the host: unit keys and values `[N, d]`.
pub(super) struct Site {
    pub(super) key_unit: Vec<f32>,
    pub(super) value: Vec<f32>,
}

/// The gate of site `site` for token `t` with block input `u` (whose inverse RMS is `r_u`).
#[inline(always)]
fn gate(site: &Site, t: usize, u: &[f32], r_u: f32) -> f32 {
    let d = u.len();
    let scale = 1.0 / (d as f32).sqrt();
    logistic(r_u * dot(u, &site.key_unit[t * d..][..d]) * scale)
}

/// `x1 = u + injection(u)` of token `t` from the sites `sites` of the pass.
#[inline(always)]
pub(super) fn inject(pass: &Pass, sites: &[usize], t: usize, u: &[f32], x1: &mut [f32]) {
    let d = u.len();
    x1.copy_from_slice(u);
    let r_u = inverse_rms(u);
    for &s in sites {
        let site = &pass.sites[s];
        let gate = gate(site, t, u, r_u);
        x1.iter_mut().zip(&site.value[t * d..][..d]).for_each(|(x, v)| *x += gate * v);
    }
}

/// Adds the injection's share of `u`'s gradient to `du`, from `x1`'s gradient `dx1` (which the
/// caller has already added: `x1 = u + …`). `tmp` and `part` are scratch rows.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(super) fn inject_backward(
    pass: &Pass,
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
        let site = &pass.sites[s];
        let (key, value) = (&site.key_unit[t * d..][..d], &site.value[t * d..][..d]);
        let gate = gate(site, t, u, r_u);
        // c = ⟨r·u, k̂⟩/√d: dc = ⟨dx1, v⟩·σ'(c), and through the unit norm of u.
        let coef = dot(dx1, value) * gate * (1.0 - gate) * scale;
        tmp.iter_mut().zip(key).for_each(|(t, k)| *t = coef * k);
        crate::model::kernels::rms_norm_backward_row(u, &pass.ones, tmp, part);
        du.iter_mut().zip(part.iter()).for_each(|(du, p)| *du += p);
    }
}
