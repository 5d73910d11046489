//! Cactus-Quants (CQ): rotate each 128-wide group of a row with the normalised Walsh-Hadamard
//! transform, store the group's L2 norm as fp16 and each unit-sphere coordinate as the index of the
//! nearest Lloyd-Max level, packed LSB-first.
//!
//! The codebooks are the reference's `_cq_codebook_np(bits, 128)`: Lloyd-Max levels of a seeded
//! Gaussian sample divided by sqrt(128). They are pure constants of the format, so they are kept here
//! as their exact f32 bit patterns (a golden header test proves them) instead of re-running the
//! reference's 200-iteration fit at build time.

use half::f16;
use rayon::prelude::*;

use crate::simd::{walsh_row, widest};

/// Every CQ tensor quantizes along its input axis in groups of this many weights.
pub const GROUP: usize = 128;

const fn f32_levels<const N: usize>(bits: [u32; N]) -> [f32; N] {
    let mut out = [0.0f32; N];
    let mut i = 0;
    while i < N {
        out[i] = f32::from_bits(bits[i]);
        i += 1;
    }
    out
}

/// Lloyd-Max 2-bit levels / sqrt(128).
pub const CODEBOOK_2: [f32; 4] = f32_levels([0xbe085e47, 0xbd237060, 0x3d23fc09, 0x3e08a9db]);
/// Lloyd-Max 3-bit levels / sqrt(128).
pub const CODEBOOK_3: [f32; 8] =
    f32_levels([0xbe41cdbb, 0xbdf16db0, 0xbd87797d, 0xbcac246c, 0x3cb50d39, 0x3d88c69c, 0x3df23363, 0x3e4261c1]);
/// Lloyd-Max 4-bit levels / sqrt(128).
pub const CODEBOOK_4: [f32; 16] = f32_levels([
    0xbe7547c2, 0xbe390b02, 0xbe105747, 0xbddf41f9, 0xbda6f045, 0xbd67898a, 0xbd06eb34, 0xbc25be0a, 0x3c5040f6,
    0x3d124277, 0x3d738a80, 0x3dae086f, 0x3de6e514, 0x3e142b6e, 0x3e3ca926, 0x3e781699,
]);
/// The 3-level centroid of a unit Gaussian, {-c, 0, +c}; analytic, so never stored in a file.
const TERNARY_C: f64 = 1.2240064;

/// The header's shared codebook block: cb2 | cb3 | cb4.
pub fn header_codebooks() -> Vec<f32> {
    [&CODEBOOK_2[..], &CODEBOOK_3[..], &CODEBOOK_4[..]].concat()
}

/// The width the probe heads' matrices (embedding, confidence and router heads) are CQ at, whatever
/// the model's weights are, in quantization-aware training and in the `.cact` alike (3.x's
/// `HEAD_BITS`).
pub const HEAD_BITS: Bits = Bits::Four;

/// A supported CQ width. `Ternary` is the reference's 1.58-bit entry (three levels).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Bits {
    Two,
    Three,
    Four,
    Ternary,
}

impl Bits {
    /// The `bits` field of a directory record (ternary is recorded as 5).
    pub fn record_bits(self) -> u32 {
        match self {
            Bits::Two => 2,
            Bits::Three => 3,
            Bits::Four => 4,
            Bits::Ternary => 5,
        }
    }

    /// Inverse of [`Bits::record_bits`].
    pub fn from_record_bits(bits: u32) -> Option<Self> {
        match bits {
            2 => Some(Bits::Two),
            3 => Some(Bits::Three),
            4 => Some(Bits::Four),
            5 => Some(Bits::Ternary),
            _ => None,
        }
    }

    /// Bits each index occupies in the packed stream (ternary crumbs take 2).
    pub fn packed_bits(self) -> usize {
        match self {
            Bits::Two | Bits::Ternary => 2,
            Bits::Three => 3,
            Bits::Four => 4,
        }
    }

    /// The sorted unit-sphere levels this width rounds to.
    pub fn codebook(self) -> Vec<f32> {
        match self {
            Bits::Two => CODEBOOK_2.to_vec(),
            Bits::Three => CODEBOOK_3.to_vec(),
            Bits::Four => CODEBOOK_4.to_vec(),
            Bits::Ternary => {
                // The reference divides the float64 centroids by sqrt(128) in float64, then rounds to f32.
                let c = (TERNARY_C / (GROUP as f64).sqrt()) as f32;
                vec![-c, 0.0, c]
            }
        }
    }
}

impl std::fmt::Display for Bits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Bits::Ternary => f.write_str("1.58"),
            other => write!(f, "{}", other.record_bits()),
        }
    }
}

/// Input width rounded up to whole groups.
pub fn padded_width(in_dim: usize) -> usize {
    in_dim.div_ceil(GROUP) * GROUP
}

/// Bytes of packed indices per row.
pub fn packed_row_bytes(in_pad: usize, bits: Bits) -> usize {
    in_pad * bits.packed_bits() / 8
}

/// Total blob size of a CQ `[out, in_dim]` matrix: packed indices, then one fp16 norm per group.
/// `None` when it does not fit a usize: the dimensions may come from a file.
pub fn cq_blob_len(out: usize, in_dim: usize, bits: Bits) -> Option<usize> {
    // Below this width the padded row times its at most 4 bits per index cannot wrap, so the row
    // helpers are exact; only the row count multiplies freely.
    if in_dim > usize::MAX / 8 {
        return None;
    }
    let in_pad = padded_width(in_dim);
    out.checked_mul(packed_row_bytes(in_pad, bits) + in_pad / GROUP * 2)
}

/// Sum of squares exactly as numpy reduces 128 contiguous f32: eight interleaved partial sums,
/// combined pairwise. Matching the order keeps our fp16 norms bit-identical to the reference's.
#[inline(always)]
fn sum_of_squares(x: &[f32; GROUP]) -> f32 {
    let mut r = [0.0f32; 8];
    for chunk in x.chunks_exact(8) {
        for (acc, v) in r.iter_mut().zip(chunk) {
            *acc += v * v;
        }
    }
    ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]))
}

/// Per element: `np.searchsorted` (left) clipped to `[1, n-1]`, then the closer neighbour, ties to
/// the lower level. A NaN sorts past every level, as numpy sorts it, and lands on the last one.
/// The search is a count of smaller levels, done level by level across the whole group so it
/// vectorises: this is the build's hot loop.
fn nearest_indices(unit: &[f32; GROUP], cb: &[f32], out: &mut [u8; GROUP]) {
    let mut below = [0u8; GROUP];
    for &c in cb {
        for (n, &x) in below.iter_mut().zip(unit) {
            *n += u8::from(c < x);
        }
    }
    let last = cb.len() - 1;
    for ((o, &n), &x) in out.iter_mut().zip(&below).zip(unit) {
        let pos = if x.is_nan() { last } else { usize::from(n).clamp(1, last) };
        let (left, right) = (cb[pos - 1], cb[pos]);
        *o = if (x - left).abs() <= (x - right).abs() { (pos - 1) as u8 } else { pos as u8 };
    }
}

/// Ternary indices 0, 1, 2 are stored as crumbs 3, 0, 1 so that sign-extending a crumb yields -1, 0, +1.
fn ternary_crumb(index: u8) -> u8 {
    if index == 0 {
        3
    } else {
        index - 1
    }
}

/// Inverse of [`ternary_crumb`]; crumb 2 encodes no level.
fn crumb_to_ternary(crumb: u8) -> Option<u8> {
    match crumb {
        3 => Some(0),
        0 | 1 => Some(crumb + 1),
        _ => None,
    }
}

/// Appends `indices` (a multiple of 8 of them) as one LSB-first bitstream of `bits`-wide fields.
fn pack_lsb(indices: &[u8], bits: usize, out: &mut Vec<u8>) {
    for chunk in indices.chunks_exact(8) {
        let word = chunk.iter().enumerate().fold(0u64, |w, (i, &idx)| w | (u64::from(idx) << (i * bits)));
        out.extend_from_slice(&word.to_le_bytes()[..bits]);
    }
}

/// Inverse of [`pack_lsb`] for one row of `packed` bytes.
fn unpack_lsb(packed: &[u8], bits: usize) -> Vec<u8> {
    let mask = (1u64 << bits) - 1;
    let mut indices = Vec::with_capacity(packed.len() * 8 / bits);
    for chunk in packed.chunks_exact(bits) {
        let mut le = [0u8; 8];
        le[..bits].copy_from_slice(chunk);
        let word = u64::from_le_bytes(le);
        indices.extend((0..8).map(|i| ((word >> (i * bits)) & mask) as u8));
    }
    indices
}

/// Packed indices and fp16 norms of one row of a CQ matrix.
struct QuantizedRow {
    packed: Vec<u8>,
    norms: Vec<f16>,
}

fn quantize_row(row: &[f32], bits: Bits, cb: &[f32]) -> QuantizedRow {
    let in_pad = padded_width(row.len());
    let mut indices = vec![0u8; in_pad];
    let mut norms = Vec::with_capacity(in_pad / GROUP);
    for (start, out) in (0..in_pad).step_by(GROUP).zip(indices.chunks_exact_mut(GROUP)) {
        let mut group = [0.0f32; GROUP];
        let end = row.len().min(start + GROUP);
        group[..end - start].copy_from_slice(&row[start..end]);
        walsh_row(&mut group);
        let norm = sum_of_squares(&group).sqrt();
        let divisor = norm.max(1e-12);
        group.iter_mut().for_each(|v| *v /= divisor);
        let out: &mut [u8; GROUP] = out.try_into().expect("chunks_exact yields GROUP-long chunks");
        nearest_indices(&group, cb, out);
        norms.push(f16::from_f32(norm));
    }
    if bits == Bits::Ternary {
        indices.iter_mut().for_each(|i| *i = ternary_crumb(*i));
    }
    let mut packed = Vec::with_capacity(packed_row_bytes(in_pad, bits));
    pack_lsb(&indices, bits.packed_bits(), &mut packed);
    QuantizedRow { packed, norms }
}

/// CQ-encodes a row-major `[out, in_dim]` matrix (`weights.len() == out * in_dim`) into the blob the
/// `.cact` directory points at: all rows' packed indices, then all rows' fp16 norms.
/// Rows are independent, so they are quantized in parallel.
pub fn cq_encode(weights: &[f32], in_dim: usize, bits: Bits) -> Vec<u8> {
    let cb = bits.codebook();
    let rows: Vec<QuantizedRow> = if in_dim == 0 {
        Vec::new()
    } else {
        weights.par_chunks(in_dim).map(|row| quantize_row(row, bits, &cb)).collect()
    };
    // Only a capacity hint: the rows exist, so their blob fits.
    let mut blob = Vec::with_capacity(cq_blob_len(rows.len(), in_dim, bits).unwrap_or(0));
    rows.iter().for_each(|r| blob.extend_from_slice(&r.packed));
    rows.iter().flat_map(|r| &r.norms).for_each(|n| blob.extend_from_slice(&n.to_le_bytes()));
    blob
}

/// A row-major `[out, in_dim]` matrix as its CQ encoding decodes: the weights a `.cact` ships, which
/// quantization-aware training computes with (the reference's `cq_quantize`). The values of
/// `cq_decode(cq_encode(…))` bit for bit, computed group by group without the blob: the same
/// rotation, norm and nearest level, the norm through fp16 and the rotation back. Training merges
/// and quantizes its adapted kernels every step, so this runs on tens of millions of weights a step.
pub fn cq_round_trip(weights: &[f32], in_dim: usize, bits: Bits) -> Vec<f32> {
    let mut out = vec![0f32; weights.len()];
    if in_dim == 0 {
        return out;
    }
    let cb = bits.codebook();
    out.par_chunks_mut(in_dim).zip(weights.par_chunks(in_dim)).for_each(|(out, row)| {
        widest(
            #[inline(always)]
            || round_trip_row(row, &cb, out),
        )
    });
    out
}

/// [`cq_round_trip`] of each matrix's transpose, in place and in the matrix's own layout: `weights`
/// a row-major stack of `[in_dim, out]` matrices (kernels as stored), whose CQ groups run down the
/// columns. Groups are independent, so each matrix is cut into stripes of [`GROUP`] rows (one group
/// of every column) that run in parallel, and a stripe's columns are gathered a tile at a time: the
/// stack is read and written once, with no transposed copy and no second buffer (training runs this
/// on every adapted kernel it merges each step).
pub fn cq_round_trip_columns(weights: &mut [f32], in_dim: usize, out: usize, bits: Bits) {
    if in_dim == 0 || out == 0 {
        return;
    }
    let cb = bits.codebook();
    weights.par_chunks_mut(in_dim * out).for_each(|matrix| {
        matrix.par_chunks_mut(GROUP * out).for_each(|stripe| {
            widest(
                #[inline(always)]
                || round_trip_stripe(stripe, out, &cb),
            )
        })
    });
}

/// One stripe of [`cq_round_trip_columns`]: up to [`GROUP`] rows of `out` columns, each column's
/// slice of them one group, rounded in place (a tile of columns is copied out before it is written
/// back).
#[inline(always)]
fn round_trip_stripe(stripe: &mut [f32], out: usize, cb: &[f32]) {
    let rows = stripe.len() / out;
    let (mut columns, mut rounded) = ([[0f32; GROUP]; COLUMNS], [[0f32; GROUP]; COLUMNS]);
    for first in (0..out).step_by(COLUMNS) {
        let width = COLUMNS.min(out - first);
        // A column at a time, strided on the stack's side: copied a row at a time, the tile's
        // stores and loads vectorised into AVX-512 scatters and gathers, slow on Zen 4 (half of
        // this function's samples).
        for (c, column) in columns.iter_mut().enumerate().take(width) {
            column[..rows].iter_mut().zip(stripe[first + c..].iter().step_by(out)).for_each(|(v, &w)| *v = w);
        }
        for (column, rounded) in columns.iter().zip(rounded.iter_mut()).take(width) {
            round_trip_row(&column[..rows], cb, &mut rounded[..rows]);
        }
        for (c, rounded) in rounded.iter().enumerate().take(width) {
            stripe[first + c..].iter_mut().step_by(out).zip(&rounded[..rows]).for_each(|(w, &r)| *w = r);
        }
    }
}

/// Columns a stripe of [`cq_round_trip_columns`] gathers together: a cache line of each row.
const COLUMNS: usize = 16;

/// One row of [`cq_round_trip`].
#[inline(always)]
fn round_trip_row(row: &[f32], cb: &[f32], out: &mut [f32]) {
    for (row, out) in row.chunks(GROUP).zip(out.chunks_mut(GROUP)) {
        let mut group = [0.0f32; GROUP];
        group[..row.len()].copy_from_slice(row);
        walsh_row(&mut group);
        let norm = sum_of_squares(&group).sqrt();
        let divisor = norm.max(1e-12);
        group.iter_mut().for_each(|v| *v /= divisor);
        // In the parity tests, the levels are logged, and on the path under test may follow the
        // reference's.
        #[cfg(test)]
        let inputs = group;
        nearest_levels(&mut group, cb);
        #[cfg(test)]
        crate::level_log::observe(crate::level_log::Quantizer::Cq, &inputs, &mut group);
        let norm = f16::from_f32(norm).to_f32();
        group.iter_mut().for_each(|v| *v *= norm);
        walsh_row(&mut group);
        out.copy_from_slice(&group[..out.len()]);
    }
}

/// Each element replaced by the level [`nearest_indices`] picks for it. The two neighbours it
/// compares, `cb[pos − 1]` and `cb[pos]`, are found by sweeping the levels across the group
/// (selects, which vectorise) rather than by indexing with each element's count: the levels are
/// sorted, so the last level below `x` is the left one and the first not below it the right one,
/// both clipped as the search is. A NaN finds neither and so lands on the last level, as there.
#[inline(always)]
fn nearest_levels(unit: &mut [f32; GROUP], cb: &[f32]) {
    let last = cb.len() - 1;
    let (mut left, mut right) = ([cb[0]; GROUP], [cb[last]; GROUP]);
    for &c in &cb[1..last] {
        left.iter_mut().zip(unit.iter()).for_each(|(l, &x)| *l = if c < x { c } else { *l });
    }
    for &c in cb[1..last].iter().rev() {
        right.iter_mut().zip(unit.iter()).for_each(|(r, &x)| *r = if c < x { *r } else { c });
    }
    for ((x, l), r) in unit.iter_mut().zip(left).zip(right) {
        *x = if (*x - l).abs() <= (*x - r).abs() { l } else { r };
    }
}

/// A CQ blob that cannot be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CqBlobError {
    #[error("blob is {found} bytes but a [{out}, {in_dim}] matrix at {bits} bits needs {}",
            expected.map_or_else(|| "more bytes than a usize counts".to_string(), |n| n.to_string()))]
    Length { found: usize, expected: Option<usize>, out: usize, in_dim: usize, bits: Bits },
    #[error("ternary crumb at index position {position} is 2, which encodes no level (valid crumbs: 3, 0, 1)")]
    BadCrumb { position: usize },
}

/// The level indices (row-major, padded width) and fp16 norms (row-major, one per group) of a CQ blob.
pub struct CqParts {
    pub indices: Vec<u8>,
    pub norms: Vec<f16>,
}

/// Splits a CQ blob of an `[out, in_dim]` matrix into level indices and norms.
pub fn cq_split(blob: &[u8], out: usize, in_dim: usize, bits: Bits) -> Result<CqParts, CqBlobError> {
    let expected = cq_blob_len(out, in_dim, bits);
    if expected != Some(blob.len()) {
        return Err(CqBlobError::Length { found: blob.len(), expected, out, in_dim, bits });
    }
    let in_pad = padded_width(in_dim);
    let row_bytes = packed_row_bytes(in_pad, bits);
    let (packed, norm_bytes) = blob.split_at(out * row_bytes);
    let mut indices = Vec::with_capacity(out * in_pad);
    if row_bytes > 0 {
        for row in packed.chunks_exact(row_bytes) {
            indices.extend(unpack_lsb(row, bits.packed_bits()));
        }
    }
    if bits == Bits::Ternary {
        for (position, i) in indices.iter_mut().enumerate() {
            *i = crumb_to_ternary(*i).ok_or(CqBlobError::BadCrumb { position })?;
        }
    }
    let norms = norm_bytes.chunks_exact(2).map(|b| f16::from_le_bytes([b[0], b[1]])).collect();
    Ok(CqParts { indices, norms })
}

/// Reconstructs the row-major `[out, in_dim]` matrix: per group `(codebook[idx] * norm) @ H`.
pub fn cq_decode(blob: &[u8], out: usize, in_dim: usize, bits: Bits) -> Result<Vec<f32>, CqBlobError> {
    let parts = cq_split(blob, out, in_dim, bits)?;
    if in_dim == 0 {
        return Ok(Vec::new());
    }
    let cb = bits.codebook();
    let in_pad = padded_width(in_dim);
    let mut weights = Vec::with_capacity(out * in_dim);
    for (row_idx, row_norms) in parts.indices.chunks_exact(in_pad).zip(parts.norms.chunks_exact(in_pad / GROUP)) {
        let mut row = Vec::with_capacity(in_pad);
        for (group_idx, norm) in row_idx.chunks_exact(GROUP).zip(row_norms) {
            let mut group = [0.0f32; GROUP];
            for (g, &i) in group.iter_mut().zip(group_idx) {
                *g = cb[usize::from(i)] * norm.to_f32();
            }
            walsh_row(&mut group);
            row.extend_from_slice(&group);
        }
        weights.extend_from_slice(&row[..in_dim]);
    }
    Ok(weights)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dense_hadamard(x: &[f32; GROUP]) -> Vec<f64> {
        // Sylvester entry (i, j) is (-1)^popcount(i & j).
        let scale = 1.0 / (GROUP as f64).sqrt();
        (0..GROUP)
            .map(|j| {
                (0..GROUP)
                    .map(|i| {
                        let sign = if (i & j).count_ones() % 2 == 0 { 1.0 } else { -1.0 };
                        sign * f64::from(x[i])
                    })
                    .sum::<f64>()
                    * scale
            })
            .collect()
    }

    /// The round trip is the decoded encoding bit for bit, at every width, for rows that pad a
    /// group, rows of zeros, huge and tiny values, values on the levels and NaN.
    #[test]
    fn round_trip_is_the_decoded_encoding_bit_for_bit() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        for bits in [Bits::Two, Bits::Three, Bits::Four, Bits::Ternary] {
            for in_dim in [128, 200, 768] {
                let mut weights: Vec<f32> = (0..5 * in_dim).map(|_| rng.random_range(-0.1f32..0.1)).collect();
                weights[in_dim..2 * in_dim].fill(0.0);
                weights[2 * in_dim..3 * in_dim].iter_mut().for_each(|w| *w *= 1e30);
                weights[3 * in_dim..4 * in_dim].iter_mut().for_each(|w| *w *= 1e-30);
                let levels = bits.codebook();
                weights[4 * in_dim..][..levels.len()].copy_from_slice(&levels);
                weights[4 * in_dim + 100] = f32::NAN;
                let want = cq_decode(&cq_encode(&weights, in_dim, bits), 5, in_dim, bits).unwrap();
                let got = cq_round_trip(&weights, in_dim, bits);
                assert_eq!(got.len(), want.len());
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(g.to_bits(), w.to_bits(), "{bits} bits, width {in_dim}, weight {i}: {g} vs {w}");
                }
            }
        }
    }

    /// Down the columns of a stack of matrices, the round trip is the transposed stack's, bit for bit,
    /// for column counts that fill a tile, leave part of one, and fall short of one, and for columns
    /// of one group, of two, and of one and a ragged one.
    #[test]
    fn round_trip_down_columns_is_the_round_trip_of_the_transpose() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        for (stack, in_dim, out) in [(3, 200, 32), (2, 256, 37), (1, 128, 5)] {
            let weights: Vec<f32> = (0..stack * in_dim * out).map(|_| rng.random_range(-0.1f32..0.1)).collect();
            let transpose = |m: &[f32], rows: usize, cols: usize| -> Vec<f32> {
                m.chunks(rows * cols)
                    .flat_map(|m| (0..cols).flat_map(move |c| (0..rows).map(move |r| m[r * cols + c])))
                    .collect()
            };
            let want = transpose(&cq_round_trip(&transpose(&weights, in_dim, out), in_dim, Bits::Four), out, in_dim);
            let mut got = weights.clone();
            cq_round_trip_columns(&mut got, in_dim, out, Bits::Four);
            assert_eq!(got.len(), want.len());
            assert!(got.iter().zip(&want).all(|(g, w)| g.to_bits() == w.to_bits()), "[{stack}, {in_dim}, {out}]");
        }
    }

    #[test]
    fn butterfly_matches_the_dense_normalised_hadamard_product() {
        let mut x = [0.0f32; GROUP];
        x.iter_mut().enumerate().for_each(|(i, v)| *v = ((i * 37 % 101) as f32 - 50.0) / 17.0);
        let expected = dense_hadamard(&x);
        walsh_row(&mut x);
        for (got, want) in x.iter().zip(expected) {
            assert!((f64::from(*got) - want).abs() < 1e-5, "{got} vs {want}");
        }
    }

    #[test]
    fn nearest_index_breaks_ties_to_the_lower_level_and_clips_the_ends() {
        let cb = [-1.0f32, 0.0, 1.0];
        let mut unit = [0.0f32; GROUP];
        unit[..7].copy_from_slice(&[-0.5, 0.5, 0.5001, -7.0, 7.0, f32::NAN, 1.0]);
        let mut out = [9u8; GROUP];
        nearest_indices(&unit, &cb, &mut out);
        assert_eq!(out[..8], [0, 1, 2, 0, 2, 2, 2, 1]);
    }

    #[test]
    fn four_bit_packing_is_the_classic_nibble_layout() {
        let mut out = Vec::new();
        pack_lsb(&[1, 2, 3, 4, 5, 6, 7, 15], 4, &mut out);
        assert_eq!(out, vec![0x21, 0x43, 0x65, 0xF7]);
        assert_eq!(unpack_lsb(&out, 4), vec![1, 2, 3, 4, 5, 6, 7, 15]);
    }

    #[test]
    fn three_bit_packing_is_one_lsb_first_bitstream() {
        let mut out = Vec::new();
        pack_lsb(&[7, 0, 0, 0, 0, 0, 0, 1], 3, &mut out);
        // index 0 fills bits 0..3, index 7 fills bits 21..24.
        assert_eq!(out, vec![0x07, 0x00, 0x20]);
        assert_eq!(unpack_lsb(&out, 3), vec![7, 0, 0, 0, 0, 0, 0, 1]);
    }

    #[test]
    fn ternary_crumbs_sign_extend_to_minus_one_zero_plus_one() {
        assert_eq!([0u8, 1, 2].map(ternary_crumb), [3, 0, 1]);
        assert_eq!([3u8, 0, 1, 2].map(crumb_to_ternary), [Some(0), Some(1), Some(2), None]);
        // One row of 128 weights: 32 crumb bytes, then one fp16 norm; 0xAA is four crumbs of 2.
        let mut blob = vec![0xAAu8; 32];
        blob.extend_from_slice(&f16::ONE.to_le_bytes());
        assert_eq!(cq_decode(&blob, 1, 128, Bits::Ternary), Err(CqBlobError::BadCrumb { position: 0 }));
    }

    /// Deterministic standard-normal weights: Box-Muller over a 64-bit LCG.
    fn gaussianish(n: usize) -> Vec<f32> {
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut uniform = move || {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((state >> 11) as f64 + 0.5) / (1u64 << 53) as f64
        };
        (0..n)
            .map(|_| {
                let (u1, u2) = (uniform(), uniform());
                ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
            })
            .collect()
    }

    #[test]
    fn encode_then_decode_has_the_lloyd_max_distortion_of_each_width() {
        // Gaussian-source distortions: W4 0.0095, W3 0.035, W2 0.118, ternary 0.19 (plus slack).
        let (out, in_dim) = (16, 256);
        let w = gaussianish(out * in_dim);
        for (bits, limit) in [(Bits::Four, 0.013), (Bits::Three, 0.045), (Bits::Two, 0.15), (Bits::Ternary, 0.25)] {
            let blob = cq_encode(&w, in_dim, bits);
            assert_eq!(Some(blob.len()), cq_blob_len(out, in_dim, bits));
            let back = cq_decode(&blob, out, in_dim, bits).unwrap();
            let err: f32 = w.iter().zip(&back).map(|(a, b)| (a - b).powi(2)).sum();
            let energy: f32 = w.iter().map(|a| a * a).sum();
            assert!(err / energy < limit, "{bits}: relative error {}", err / energy);
        }
    }

    #[test]
    fn sizes_from_a_file_never_overflow() {
        assert_eq!(cq_blob_len(usize::MAX, 128, Bits::Four), None);
        assert_eq!(cq_blob_len(1, usize::MAX, Bits::Two), None);
        assert_eq!(cq_blob_len(usize::MAX, 0, Bits::Three), Some(0), "no columns, no bytes");
        let err = cq_split(&[0; 64], usize::MAX, usize::MAX, Bits::Four).err().expect("no such blob");
        assert!(matches!(err, CqBlobError::Length { expected: None, .. }), "{err}");
    }

    #[test]
    fn a_ragged_input_width_is_zero_padded_to_whole_groups() {
        let (out, in_dim) = (2, 200);
        let w = gaussianish(out * in_dim);
        let blob = cq_encode(&w, in_dim, Bits::Four);
        assert_eq!(blob.len(), out * (256 / 2) + out * 2 * 2);
        assert_eq!(cq_decode(&blob, out, in_dim, Bits::Four).unwrap().len(), out * in_dim);
        let mut padded = w[..in_dim].to_vec();
        padded.resize(256, 0.0);
        let first_row_alone = cq_encode(&padded, 256, Bits::Four);
        assert_eq!(blob[..128], first_row_alone[..128]);
    }

    #[test]
    fn ternary_codebook_is_the_scaled_analytic_centroid() {
        assert_eq!(Bits::Ternary.codebook()[2].to_bits(), 0.10818791f32.to_bits());
    }
}
