//! The group products in plain Rust: every CPU's fallback, and the reference the SIMD kernels are
//! tested against. Compiled inside [`crate::simd::widest`], its loops vectorize as well as
//! the compiler manages (on aarch64, NEON's widening multiplies).

use super::activations::Activations;
use super::layout::Packing;
use crate::quant::GROUP;

/// For each activation row `r`, `acc[r] = Σ level(code) · x` over group `g`: the exact integer
/// product of one group of a weight row (`codes`, packed as `packing`) with row `r`'s group `g`.
#[inline(always)]
pub fn group_dots(levels: &[i8; 16], packing: Packing, codes: &[u8], x: &Activations, g: usize, acc: &mut [i32]) {
    let mut lanes = [0u8; GROUP];
    packing.unpack(codes, &mut lanes);
    let weights = lanes.map(|c| levels[usize::from(c)]);
    for (r, acc) in acc.iter_mut().enumerate() {
        *acc = weights.iter().zip(x.group(r, g)).map(|(&w, &x)| i32::from(w) * i32::from(x)).sum();
    }
}
