//! A CQ weight matrix as the `.cact` ships it: its codes, its fp16 group norms and its codebook,
//! and no f32 copy of the weights.

use half::f16;

use super::layout::{lane, Packing};
use crate::quant::{cq_blob_len, cq_split, packed_row_bytes, padded_width, Bits, CqBlobError, GROUP};
use crate::simd::walsh_row;

/// The codebook as the kernels multiply it: each level as an int8 multiple of one scale.
#[derive(Debug, Clone, PartialEq)]
pub struct Levels {
    /// `round(level / scale)` by code (a width with fewer than 16 levels leaves the rest 0).
    pub int8: [i8; 16],
    /// `max |level| / 127`: the largest level is ±127 exactly.
    pub scale: f32,
    /// The levels themselves by code, for rows dequantized exactly ([`CqMatrix::row`]).
    exact: [f32; 16],
}

impl Levels {
    fn of(bits: Bits) -> Self {
        let codebook = bits.codebook();
        let largest = codebook.iter().fold(0f32, |m, l| m.max(l.abs()));
        let scale = largest / 127.0;
        let (mut int8, mut exact) = ([0i8; 16], [0f32; 16]);
        for ((q, e), &level) in int8.iter_mut().zip(&mut exact).zip(&codebook) {
            *q = (level / scale).round_ties_even().clamp(-127.0, 127.0) as i8;
            *e = level;
        }
        Self { int8, scale, exact }
    }
}

/// A CQ matrix `[out, in_dim]` (the `.cact`'s `[out, in]`: the network's `x·W` is `x·Mᵀ`), held as
/// its codes packed for the kernels ([`Packing`]: the file's own bytes at 4 bits, repacked once at
/// 3, 2 and 1.58 bits), one fp16 norm per group as the file stores it, and the codebook.
#[derive(Debug, Clone)]
pub struct CqMatrix {
    out: usize,
    in_dim: usize,
    bits: Bits,
    packing: Packing,
    /// `[out, groups, group_bytes]`.
    codes: Vec<u8>,
    /// `[out, groups]`.
    norms: Vec<f16>,
    levels: Levels,
}

impl CqMatrix {
    /// A CQ blob (as [`crate::quant::cq_encode`] writes it) of an `[out, in_dim]` matrix.
    pub fn from_blob(blob: &[u8], out: usize, in_dim: usize, bits: Bits) -> Result<Self, CqBlobError> {
        let packing = Packing::of(bits);
        let (codes, norms) = match bits {
            // The file's own bytes, as they are.
            Bits::Four => {
                let expected = cq_blob_len(out, in_dim, bits);
                if expected != Some(blob.len()) {
                    return Err(CqBlobError::Length { found: blob.len(), expected, out, in_dim, bits });
                }
                let (codes, norms) = blob.split_at(out * packed_row_bytes(padded_width(in_dim), bits));
                (codes.to_vec(), norms.chunks_exact(2).map(|b| f16::from_le_bytes([b[0], b[1]])).collect())
            }
            // One code a byte for a moment (the split also checks the ternary crumbs), then packed.
            Bits::Three | Bits::Two | Bits::Ternary => {
                let parts = cq_split(blob, out, in_dim, bits)?;
                let mut codes = Vec::with_capacity(parts.indices.len() / GROUP * packing.group_bytes());
                parts.indices.chunks_exact(GROUP).for_each(|group| packing.pack(group, &mut codes));
                (codes, parts.norms)
            }
        };
        Ok(Self { out, in_dim, bits, packing, codes, norms, levels: Levels::of(bits) })
    }

    /// Rows `rows` of this matrix, as a matrix of their own (their codes and norms copied): one
    /// layer's share of a tensor that stacks every layer's rows.
    pub fn rows(&self, rows: std::ops::Range<usize>) -> Self {
        let (code_bytes, groups) = (self.groups() * self.packing.group_bytes(), self.groups());
        Self {
            out: rows.len(),
            codes: self.codes[rows.start * code_bytes..rows.end * code_bytes].to_vec(),
            norms: self.norms[rows.start * groups..rows.end * groups].to_vec(),
            levels: self.levels.clone(),
            ..*self
        }
    }

    /// Output rows.
    pub fn out(&self) -> usize {
        self.out
    }

    /// Input width (before padding to whole groups).
    pub fn in_dim(&self) -> usize {
        self.in_dim
    }

    pub fn bits(&self) -> Bits {
        self.bits
    }

    /// Groups of a row.
    pub fn groups(&self) -> usize {
        padded_width(self.in_dim) / GROUP
    }

    /// Bytes held: codes and norms (what replaces the f32 matrix's `4·out·in_dim`).
    pub fn bytes(&self) -> usize {
        self.codes.len() + 2 * self.norms.len()
    }

    pub fn packing(&self) -> Packing {
        self.packing
    }

    pub fn levels(&self) -> &Levels {
        &self.levels
    }

    /// The code bytes of group `g` of row `o`.
    #[inline(always)]
    pub fn group_codes(&self, o: usize, g: usize) -> &[u8] {
        let bytes = self.packing.group_bytes();
        &self.codes[(o * self.groups() + g) * bytes..][..bytes]
    }

    /// The norm of group `g` of row `o`.
    #[inline(always)]
    pub fn norm(&self, o: usize, g: usize) -> f32 {
        self.norms[o * self.groups() + g].to_f32()
    }

    /// Row `o` dequantized into `row` (`in_dim` values), exactly as the simulated path's
    /// [`crate::quant::cq_decode`] reconstructs it: an embedding row looked up, one at a time.
    pub fn row(&self, o: usize, row: &mut [f32]) {
        let mut lanes = [0u8; GROUP];
        for (g, chunk) in row[..self.in_dim].chunks_mut(GROUP).enumerate() {
            self.packing.unpack(self.group_codes(o, g), &mut lanes);
            let norm = self.norm(o, g);
            let mut group = [0f32; GROUP];
            for (i, v) in group.iter_mut().enumerate() {
                *v = self.levels.exact[usize::from(lanes[lane(i)])] * norm;
            }
            walsh_row(&mut group);
            chunk.copy_from_slice(&group[..chunk.len()]);
        }
    }
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};

    use super::*;
    use crate::quant::{cq_decode, cq_encode};

    pub(crate) const WIDTHS: [Bits; 4] = [Bits::Four, Bits::Three, Bits::Two, Bits::Ternary];

    fn random(n: usize, seed: u64) -> Vec<f32> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect()
    }

    #[test]
    fn four_bit_codes_are_the_files_bytes_and_rows_decode_as_the_simulated_path() {
        for bits in WIDTHS {
            let (out, in_dim) = (5, 200);
            let blob = cq_encode(&random(out * in_dim, 1), in_dim, bits);
            let m = CqMatrix::from_blob(&blob, out, in_dim, bits).unwrap();
            if bits == Bits::Four {
                assert_eq!(m.codes, blob[..m.codes.len()]);
                assert_eq!(m.bytes(), blob.len());
            }
            let want = cq_decode(&blob, out, in_dim, bits).unwrap();
            let mut row = vec![0f32; in_dim];
            for (o, want) in want.chunks_exact(in_dim).enumerate() {
                m.row(o, &mut row);
                assert!(row.iter().zip(want).all(|(a, b)| a.to_bits() == b.to_bits()), "{bits} bits, row {o}");
            }
        }
    }

    #[test]
    fn a_run_of_rows_is_those_rows_of_the_matrix() {
        for bits in WIDTHS {
            let (out, in_dim) = (6, 300);
            let blob = cq_encode(&random(out * in_dim, 3), in_dim, bits);
            let m = CqMatrix::from_blob(&blob, out, in_dim, bits).unwrap();
            let part = m.rows(2..5);
            assert_eq!((part.out(), part.in_dim(), part.groups()), (3, in_dim, m.groups()));
            let (mut want, mut got) = (vec![0f32; in_dim], vec![0f32; in_dim]);
            for o in 0..3 {
                m.row(2 + o, &mut want);
                part.row(o, &mut got);
                assert_eq!(got, want, "{bits} bits, row {o}");
            }
        }
    }

    #[test]
    fn the_largest_level_is_127_and_ternary_is_exact() {
        for bits in WIDTHS {
            let levels = Levels::of(bits);
            assert_eq!(levels.int8.iter().map(|q| q.unsigned_abs()).max(), Some(127), "{bits}");
        }
        assert_eq!(Levels::of(Bits::Ternary).int8[..3], [-127, 0, 127]);
    }

    #[test]
    fn a_bad_blob_is_an_error_not_a_panic() {
        for bits in WIDTHS {
            let blob = cq_encode(&random(2 * 128, 2), 128, bits);
            let err = CqMatrix::from_blob(&blob[1..], 2, 128, bits).unwrap_err();
            assert!(matches!(err, CqBlobError::Length { .. }), "{bits}: {err}");
        }
        // Crumb 2 encodes no ternary level.
        let mut blob = vec![0xAAu8; 32];
        blob.extend_from_slice(&f16::ONE.to_le_bytes());
        assert_eq!(
            CqMatrix::from_blob(&blob, 1, 128, Bits::Ternary).unwrap_err(),
            CqBlobError::BadCrumb { position: 0 }
        );
    }
}
