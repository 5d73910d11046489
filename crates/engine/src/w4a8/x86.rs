//! The group products with x86 SIMD: AVX-512 VNNI (`vpdpbusd`, four u8·i8 products summed into an
//! i32 lane per instruction) and AVX2 (`vpmaddubsw` then `vpmaddwd`). Both look the int8 levels up
//! in a register (`vpshufb` on the masked codes), unpack a group once into a 128-byte buffer in
//! lane order, and then take its product with every activation row: the unpacking is shared by the
//! batch. Each returns the same exact integers as [`super::portable::group_dots`].
//!
//! For two rows and more, [`vnni_tile`] takes [`TILE`] outputs at once instead: their groups
//! unpacked, then transposed (a gather) so that one register holds four weights of each of the
//! 16 outputs, and each `vpdpbusd` against four activation codes broadcast sums four products into
//! every output's lane. A group's 16 products are then whole in one register, with no horizontal
//! sum per output and row (which the group-at-a-time kernel pays, and which dominated a prompt's
//! pass), and the float epilogue runs on 16 outputs at once, in the same order of operations.
//!
//! The instructions multiply an unsigned byte by a signed one. VNNI sums in i32 and cannot
//! overflow, so its weights are offset to `level + 128` (0…255) and `128·Σx` is subtracted after.
//! AVX2's `vpmaddubsw` saturates a pair of products at i16, which `255·127·2` would overflow, so it
//! multiplies `|level|` (≤ 127) by `x` carrying the level's sign (`vpsignb`): `2·127·127` fits.

use std::arch::x86_64::*;

use super::activations::Activations;
use super::layout::Packing;
use super::matrix::CqMatrix;
use crate::quant::GROUP;

/// Outputs [`vnni_tile`] computes together: one per 32-bit lane of a register.
pub const TILE: usize = 16;

/// Four-code steps of a group.
const QUADS: usize = GROUP / 4;

/// A group's weights, unpacked.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Unpacked([u8; GROUP]);

/// A tile's group of weights transposed: quad `k` of output `j` at `[k·TILE + j]`.
#[repr(C, align(64))]
struct Quads([u32; QUADS * TILE]);

/// The 16-entry `table` (one copy in each 128-bit half) looked up by every code of one group's
/// bytes, into `out` in lane order.
#[target_feature(enable = "avx2")]
#[inline]
fn unpack(table: __m256i, packing: Packing, codes: &[u8], out: &mut Unpacked) {
    let codes = &codes[..packing.group_bytes()];
    let mask = _mm256_set1_epi8(packing.mask() as i8);
    for (chunk, bytes) in codes.chunks_exact(32).enumerate() {
        // SAFETY: `bytes` is 32 bytes long.
        let v = unsafe { _mm256_loadu_si256(bytes.as_ptr().cast()) };
        for field in packing.fields() {
            let index = _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(field.shift as i32)), mask);
            let lanes = &mut out.0[field.base + 32 * chunk..][..32];
            // SAFETY: `lanes` is 32 bytes long.
            unsafe { _mm256_storeu_si256(lanes.as_mut_ptr().cast(), _mm256_shuffle_epi8(table, index)) };
        }
    }
}

/// The 16 levels, as a lookup table in both 128-bit halves.
#[target_feature(enable = "avx2")]
#[inline]
fn table(levels: &[u8; 16]) -> __m256i {
    // SAFETY: `levels` is 16 bytes long.
    _mm256_broadcastsi128_si256(unsafe { _mm_loadu_si128(levels.as_ptr().cast()) })
}

/// 32 bytes at `at` of a 128-long slice.
#[target_feature(enable = "avx2")]
#[inline]
fn load32<T>(values: &[T; GROUP], at: usize) -> __m256i {
    assert!(at + 32 <= GROUP && size_of::<T>() == 1);
    // SAFETY: checked just above: 32 one-byte values from `at` are inside the array.
    unsafe { _mm256_loadu_si256(values.as_ptr().add(at).cast()) }
}

/// [`super::portable::group_dots`] with AVX2.
#[target_feature(enable = "avx2")]
#[inline]
pub fn avx2_group_dots(levels: &[i8; 16], packing: Packing, codes: &[u8], x: &Activations, g: usize, acc: &mut [i32]) {
    let mut weights = Unpacked([0; GROUP]);
    unpack(table(&levels.map(|l| l as u8)), packing, codes, &mut weights);
    let mut signed = [[_mm256_setzero_si256(); 2]; GROUP / 32];
    for (i, pair) in signed.iter_mut().enumerate() {
        let w = load32(&weights.0, 32 * i);
        *pair = [w, _mm256_abs_epi8(w)];
    }
    let ones = _mm256_set1_epi16(1);
    for (r, acc) in acc.iter_mut().enumerate() {
        let x: &[i8; GROUP] = x.group(r, g).try_into().expect("GROUP codes");
        let mut sum = _mm256_setzero_si256();
        for (i, [w, magnitude]) in signed.iter().enumerate() {
            let pairs = _mm256_maddubs_epi16(*magnitude, _mm256_sign_epi8(load32(x, 32 * i), *w));
            sum = _mm256_add_epi32(sum, _mm256_madd_epi16(pairs, ones));
        }
        let half = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
        let half = _mm_add_epi32(half, _mm_unpackhi_epi64(half, half));
        *acc = _mm_cvtsi128_si32(_mm_add_epi32(half, _mm_shuffle_epi32(half, 0b01)));
    }
}

/// [`super::portable::group_dots`] with AVX-512 VNNI.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
#[inline]
pub fn vnni_group_dots(levels: &[i8; 16], packing: Packing, codes: &[u8], x: &Activations, g: usize, acc: &mut [i32]) {
    let mut weights = Unpacked([0; GROUP]);
    unpack(table(&levels.map(|l| (l as u8) ^ 0x80)), packing, codes, &mut weights);
    // SAFETY: the buffer is 128 bytes, two 64-byte loads.
    let w = unsafe { [0, 64].map(|at| _mm512_loadu_si512(weights.0.as_ptr().add(at).cast())) };
    for (r, acc) in acc.iter_mut().enumerate() {
        let xs = x.group(r, g);
        // SAFETY: a group is 128 codes, two 64-byte loads.
        let [x0, x1] = unsafe { [0, 64].map(|at| _mm512_loadu_si512(xs.as_ptr().add(at).cast())) };
        let sum = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), w[0], x0), w[1], x1);
        *acc = _mm512_reduce_add_epi32(sum) - 128 * x.sum(r, g);
    }
}

/// Outputs `first .. first + count` (`count ≤ TILE`) of `x·Mᵀ` for every row of `x`, into `y`
/// (output-major, `y[(o − first)·rows + r]`): the same values, bit for bit, as the group products
/// of [`super::portable::group_dots`] summed by the product's epilogue.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub fn vnni_tile(m: &CqMatrix, x: &Activations, first: usize, count: usize, y: &mut [f32]) {
    assert!(count <= TILE && y.len() >= count * x.rows());
    let (rows, packing) = (x.rows(), m.packing());
    let table = table(&m.levels().int8.map(|l| (l as u8) ^ 0x80));
    // Outputs past `count` keep the offset of level 0: their lanes are computed and dropped.
    let mut unpacked = [Unpacked([0x80; GROUP]); TILE];
    let mut quads = Quads([0; QUADS * TILE]);
    // The byte offset of each output's unpacked group: the gather's indices.
    let offsets =
        _mm512_setr_epi32(0, 128, 256, 384, 512, 640, 768, 896, 1024, 1152, 1280, 1408, 1536, 1664, 1792, 1920);
    let mut sums = vec![_mm512_setzero_ps(); rows];
    for g in 0..m.groups() {
        let mut weight_scales = [0f32; TILE];
        for (j, (weights, scale)) in unpacked.iter_mut().zip(&mut weight_scales).take(count).enumerate() {
            unpack(table, packing, m.group_codes(first + j, g), weights);
            *scale = m.norm(first + j, g) * m.levels().scale;
        }
        let base = unpacked.as_ptr().cast::<u8>();
        for (k, quad) in quads.0.chunks_exact_mut(TILE).enumerate() {
            // SAFETY: every offset plus `4·k + 4` stays inside the `TILE` unpacked groups, and
            // `quad` is `TILE` u32s.
            unsafe {
                let gathered = _mm512_i32gather_epi32::<1>(offsets, base.add(4 * k).cast());
                _mm512_storeu_si512(quad.as_mut_ptr().cast(), gathered);
            }
        }
        // SAFETY: `weight_scales` is `TILE` f32s.
        let weight_scales = unsafe { _mm512_loadu_ps(weight_scales.as_ptr()) };
        for (r, sum) in sums.iter_mut().enumerate() {
            let codes = x.group(r, g).as_ptr();
            let mut acc = _mm512_setzero_si512();
            for (k, quad) in quads.0.chunks_exact(TILE).enumerate() {
                // SAFETY: a group is `GROUP` codes, read four at `4·k < GROUP`; `quad` is `TILE` u32s.
                let (w, four) = unsafe {
                    (_mm512_loadu_si512(quad.as_ptr().cast()), codes.add(4 * k).cast::<i32>().read_unaligned())
                };
                acc = _mm512_dpbusd_epi32(acc, w, _mm512_set1_epi32(four));
            }
            let exact = _mm512_sub_epi32(acc, _mm512_set1_epi32(128 * x.sum(r, g)));
            let scaled =
                _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(exact), weight_scales), _mm512_set1_ps(x.scale(r, g)));
            *sum = _mm512_add_ps(*sum, scaled);
        }
    }
    let mut lanes = [0f32; TILE];
    for (r, sum) in sums.iter().enumerate() {
        // SAFETY: `lanes` is `TILE` f32s.
        unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), *sum) };
        for (j, &v) in lanes[..count].iter().enumerate() {
            y[j * rows + r] = v;
        }
    }
}
