//! Activation rows made ready for the integer products: each 128-wide group rotated by the same
//! Walsh–Hadamard transform the weights were quantized in, then rounded to int8 against its own
//! scale, in lane order ([`super::layout`]).
//!
//! Per group, not per row: the weights already carry a float scale per group (their norm), so the
//! product's epilogue multiplies by one scale per group whatever the activations do, and a scale
//! of the activations' own group costs one more multiply there. In return a group of small values
//! (a row's zero padding, a quiet stretch of channels) keeps its resolution instead of sharing the
//! loudest group's step.

use rayon::prelude::*;

use super::error::W4a8Error;
use super::layout::lane;
use crate::quant::{padded_width, GROUP};
use crate::simd::{walsh_row, widest};

/// Values a thread quantizes at the least: below this rayon's hand-off costs more.
const PARALLEL_MIN: usize = 1 << 14;

/// `rows` activation rows of width `in_dim`, rotated and quantized group by group.
#[derive(Debug, Clone)]
pub struct Activations {
    rows: usize,
    in_dim: usize,
    groups: usize,
    /// `[rows, groups, GROUP]`, each group in lane order.
    codes: Vec<i8>,
    /// `[rows, groups]`: a code times its group's scale is the rotated value.
    scales: Vec<f32>,
    /// `[rows, groups]`: the sum of a group's codes (the VNNI kernel's offset correction).
    sums: Vec<i32>,
}

impl Activations {
    /// `x` holds `rows` rows of `in_dim` values, row-major.
    pub fn quantize(x: &[f32], rows: usize, in_dim: usize) -> Result<Self, W4a8Error> {
        if rows.checked_mul(in_dim) != Some(x.len()) {
            return Err(W4a8Error::Rows { len: x.len(), rows, in_dim });
        }
        let groups = padded_width(in_dim) / GROUP;
        let mut codes = vec![0i8; rows * groups * GROUP];
        let (mut scales, mut sums) = (vec![0f32; rows * groups], vec![0i32; rows * groups]);
        if groups > 0 {
            codes
                .par_chunks_mut(groups * GROUP)
                .zip(scales.par_chunks_mut(groups))
                .zip(sums.par_chunks_mut(groups).zip(x.par_chunks(in_dim)))
                .with_min_len(PARALLEL_MIN.div_ceil(in_dim))
                .for_each(|((codes, scales), (sums, x))| {
                    widest(
                        #[inline(always)]
                        || {
                            for (g, x) in x.chunks(GROUP).enumerate() {
                                let group = &mut codes[g * GROUP..][..GROUP];
                                (scales[g], sums[g]) = quantize_group(x, group.try_into().expect("GROUP codes"));
                            }
                        },
                    )
                });
        }
        Ok(Self { rows, in_dim, groups, codes, scales, sums })
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn in_dim(&self) -> usize {
        self.in_dim
    }

    /// The codes of group `g` of row `r`, in lane order.
    #[inline(always)]
    pub fn group(&self, r: usize, g: usize) -> &[i8] {
        &self.codes[(r * self.groups + g) * GROUP..][..GROUP]
    }

    /// The scale of group `g` of row `r` (NaN when the group held a value that is not finite).
    #[inline(always)]
    pub fn scale(&self, r: usize, g: usize) -> f32 {
        self.scales[r * self.groups + g]
    }

    /// The sum of the codes of group `g` of row `r`.
    #[inline(always)]
    pub fn sum(&self, r: usize, g: usize) -> i32 {
        self.sums[r * self.groups + g]
    }
}

/// One group (`x` up to [`GROUP`] values, zero-padded) rotated and rounded to int8 in `codes`:
/// returns its scale and the sum of its codes. Symmetric, the largest |value| mapping to ±127, so
/// `-128` never occurs (the AVX2 kernel negates codes). A group holding a NaN or an infinity gets
/// a NaN scale, so every output it touches is NaN, as an f32 product would be, never a number.
#[inline(always)]
fn quantize_group(x: &[f32], codes: &mut [i8; GROUP]) -> (f32, i32) {
    let mut rotated = [0f32; GROUP];
    rotated[..x.len()].copy_from_slice(x);
    walsh_row(&mut rotated);
    let largest = rotated.iter().fold(0f32, |m, v| m.max(v.abs()));
    if !rotated.iter().all(|v| v.is_finite()) {
        codes.fill(0);
        return (f32::NAN, 0);
    }
    if largest == 0.0 {
        codes.fill(0);
        return (0.0, 0);
    }
    let step = 127.0 / largest;
    let mut sum = 0;
    for (i, v) in rotated.iter().enumerate() {
        let q = (v * step).round_ties_even().clamp(-127.0, 127.0) as i8;
        codes[lane(i)] = q;
        sum += i32::from(q);
    }
    (largest / 127.0, sum)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_is_rotated_then_rounded_within_half_a_step() {
        let x: Vec<f32> = (0..200).map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0).collect();
        let a = Activations::quantize(&x, 1, 200).unwrap();
        for (g, x) in x.chunks(GROUP).enumerate() {
            let mut rotated = [0f32; GROUP];
            rotated[..x.len()].copy_from_slice(x);
            walsh_row(&mut rotated);
            let scale = a.scale(0, g);
            assert_eq!(a.group(0, g).iter().map(|&q| i32::from(q)).sum::<i32>(), a.sum(0, g));
            assert_eq!(a.group(0, g).iter().map(|q| q.unsigned_abs()).max(), Some(127));
            for (i, v) in rotated.iter().enumerate() {
                let back = f32::from(a.group(0, g)[lane(i)]) * scale;
                assert!((back - v).abs() <= 0.5 * scale * 1.0001, "group {g}, value {i}: {back} vs {v}");
            }
        }
    }

    #[test]
    fn zero_and_non_finite_groups_and_bad_shapes() {
        let mut x = vec![0f32; 384];
        x[300] = f32::INFINITY;
        let a = Activations::quantize(&x, 1, 384).unwrap();
        assert_eq!((a.scale(0, 0), a.sum(0, 0)), (0.0, 0));
        assert!(a.scale(0, 2).is_nan());
        let err = Activations::quantize(&x, 2, 384).unwrap_err();
        assert!(err.to_string().contains("384 activation values"), "{err}");
    }
}
