//! Causal attention over a packed batch, flash-style: scores and probabilities exist only for one
//! block of queries at a time (in a per-thread scratch row block), the forward keeps each query's
//! log-sum-exp, and the backward recomputes the block's probabilities from it. Nothing
//! `T × T` outlives a block.
//!
//! Queries of a segment attend to every key of the segment's context (its shared prefix) and to
//! their own segment's keys up to themselves. Buffers are head-major, `[heads, N, head_dim]`, so
//! that one head's rows of one segment are one contiguous slice: tasks own disjoint slices, and
//! the products are plain `gemm` calls on them.

use std::cell::RefCell;
use std::ops::Range;

use rayon::prelude::*;

use super::mat::{matmul, Mat, MatMut, Threads};
use crate::model::kernels::{dot, exp, sum, widest};
use crate::model::packing::{Family, Segment};

/// Queries per block: enough rows for the products to run at speed, few enough that a block's
/// scores stay in cache.
const BLOCK: usize = 64;

thread_local! {
    /// Per-thread scores and probabilities of the block being computed.
    static SCRATCH: RefCell<(Vec<f32>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// The geometry of one attention call.
#[derive(Debug, Clone, Copy)]
pub struct Heads {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Packed tokens.
    pub tokens: usize,
}

impl Heads {
    fn group(&self) -> usize {
        self.heads / self.kv_heads
    }

    fn slab(&self) -> usize {
        self.tokens * self.head_dim
    }

    fn scale(&self) -> f32 {
        1.0 / (self.head_dim as f32).sqrt()
    }
}

/// The query blocks of a segment: consecutive rows, [`BLOCK`] at a time.
fn segment_blocks(seg: &Segment) -> impl Iterator<Item = Range<usize>> {
    let end = seg.start + seg.len;
    (seg.start..end).step_by(BLOCK).map(move |b| b..(b + BLOCK).min(end))
}

/// The query blocks of every segment, in packed order (they partition `0..N`).
fn blocks(segments: &[Segment]) -> Vec<(usize, Range<usize>)> {
    segments.iter().enumerate().flat_map(|(s, seg)| segment_blocks(seg).map(move |rows| (s, rows))).collect()
}

/// `slab` (rows of `width`) cut into the row ranges `ranges`, which start at its first row and
/// follow one another.
fn cut<T>(mut slab: &mut [T], ranges: impl Iterator<Item = Range<usize>>, width: usize) -> Vec<&mut [T]> {
    let mut parts = Vec::new();
    for range in ranges {
        let (part, rest) = std::mem::take(&mut slab).split_at_mut(range.len() * width);
        parts.push(part);
        slab = rest;
    }
    parts
}

/// The keys a block of segment `seg` reads: the context's rows, then its own rows up to the block's
/// end, as (rows of the context, rows of its own) in packed indices.
fn key_rows(segments: &[Segment], seg: usize, rows: &Range<usize>) -> (Range<usize>, Range<usize>) {
    let own = segments[seg];
    let context = own.context.map_or(0..0, |c| segments[c].range());
    (context, own.start..rows.end)
}

/// Keys (or values) a block reads, `rows × hd` each: its context's (a shared prefix, or a
/// decoding cache), then its own segment's up to the block's end.
type Keys<'a> = [Mat<'a>; 2];

/// The rows `range` of one head's slab, as a `rows × hd` matrix.
fn rows_of<'a>(slab: &'a [f32], hd: usize, range: &Range<usize>) -> Mat<'a> {
    Mat::new(&slab[range.start * hd..range.end * hd], range.len(), hd)
}

/// Writes `scale · q_block · keysᵀ` into `scores` (`rows × (context + own)`), row-major.
fn block_scores(q: Mat, keys: &Keys, scale: f32, scores: &mut [f32]) {
    let width = keys[0].rows() + keys[1].rows();
    let mut offset = 0;
    for part in keys.iter().filter(|k| k.rows() > 0) {
        let dst = MatMut::strided(&mut scores[offset..], q.rows(), part.rows(), width);
        matmul(dst, q, part.t(), scale, false, Threads::One);
        offset += part.rows();
    }
}

/// Keys visible to the block's row `r`: all of the context's, and its own segment's up to itself
/// (`rows` are the block's packed rows, `own_start` its segment's first).
fn visible(keys: &Keys, own_start: usize, rows: &Range<usize>, r: usize) -> usize {
    keys[0].rows() + (rows.start + r - own_start + 1)
}

/// `out = p · values` over the context's and the own rows (`out += …` when `accumulate`).
fn times_values(p: &[f32], values: &Keys, out: &mut [f32], accumulate: bool) {
    let width = values[0].rows() + values[1].rows();
    let (rows, hd) = (p.len() / width, values[1].cols());
    let (mut offset, mut first) = (0, !accumulate);
    for part in values.iter().filter(|v| v.rows() > 0) {
        let p_part = Mat::strided(&p[offset..], rows, part.rows(), width);
        matmul(MatMut::new(out, rows, hd), p_part, *part, 1.0, !first, Threads::One);
        offset += part.rows();
        first = false;
    }
}

/// Keys and values of earlier positions held outside the pass (a decoding cache), head-major
/// `[kv_heads, capacity, hd]` with the first `len` rows of each head filled: the context of every
/// segment that has no shared prefix.
#[derive(Debug, Clone, Copy)]
pub struct Cached<'a> {
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub len: usize,
    pub capacity: usize,
}

impl<'a> Cached<'a> {
    /// Kv head `kv`'s filled rows of `buf` (its keys or its values).
    fn head(&self, buf: &'a [f32], kv: usize, hd: usize) -> Mat<'a> {
        Mat::new(&buf[kv * self.capacity * hd..][..self.len * hd], self.len, hd)
    }
}

/// Forward: `out` `[heads, N, hd]` and `lse` `[heads, N]` from `q` `[heads, N, hd]`, `k` and `v`
/// `[kv_heads, N, hd]`, after the `cached` positions when decoding.
#[allow(clippy::too_many_arguments)]
pub fn forward(
    geometry: Heads,
    segments: &[Segment],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    cached: Option<Cached>,
    out: &mut [f32],
    lse: &mut [f32],
) {
    let Heads { head_dim: hd, tokens, .. } = geometry;
    let (slab, scale, group) = (geometry.slab(), geometry.scale(), geometry.group());
    let blocks = blocks(segments);
    let mut tasks = Vec::new();
    for (h, (out_h, lse_h)) in out.chunks_mut(slab).zip(lse.chunks_mut(tokens)).enumerate() {
        let outs = cut(out_h, blocks.iter().map(|(_, r)| r.clone()), hd);
        let lses = cut(lse_h, blocks.iter().map(|(_, r)| r.clone()), 1);
        tasks.extend(blocks.iter().zip(outs.into_iter().zip(lses)).map(|((s, rows), o)| (h, *s, rows.clone(), o)));
    }
    tasks.into_par_iter().for_each(|(h, seg, rows, (out, lse))| {
        widest(
            #[inline(always)]
            || {
                let kv = h / group;
                let (k, v) = (&k[kv * slab..(kv + 1) * slab], &v[kv * slab..(kv + 1) * slab]);
                let (context, own) = key_rows(segments, seg, &rows);
                let (context_k, context_v) = match cached.filter(|_| context.is_empty()) {
                    Some(cached) => (cached.head(cached.k, kv, hd), cached.head(cached.v, kv, hd)),
                    None => (rows_of(k, hd, &context), rows_of(v, hd, &context)),
                };
                let keys = [context_k, rows_of(k, hd, &own)];
                let values = [context_v, rows_of(v, hd, &own)];
                let width = keys[0].rows() + keys[1].rows();
                SCRATCH.with_borrow_mut(|(scores, _)| {
                    scores.resize(rows.len() * width, 0.0);
                    let q_block = rows_of(&q[h * slab..(h + 1) * slab], hd, &rows);
                    block_scores(q_block, &keys, scale, scores);
                    for (r, row) in scores.chunks_mut(width).enumerate() {
                        let seen = visible(&keys, own.start, &rows, r);
                        let max = row[..seen].iter().copied().fold(f32::NEG_INFINITY, f32::max);
                        row[..seen].iter_mut().for_each(|s| *s = exp(*s - max));
                        let sum = sum(&row[..seen]);
                        let inverse = 1.0 / sum;
                        row[..seen].iter_mut().for_each(|s| *s *= inverse);
                        row[seen..].fill(0.0);
                        lse[r] = max + sum.ln();
                    }
                    times_values(scores, &values, out, false);
                });
            },
        )
    });
}

/// What the backward reads besides the gradient: the forward's inputs, output and log-sum-exp.
pub struct Saved<'a> {
    pub q: &'a [f32],
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub out: &'a [f32],
    pub lse: &'a [f32],
}

/// Backward: `dq` `[heads, N, hd]`, `dk` and `dv` `[kv_heads, N, hd]` (all overwritten) from the
/// output's gradient `dout` `[heads, N, hd]`.
pub fn backward(
    geometry: Heads,
    segments: &[Segment],
    families: &[Family],
    saved: &Saved,
    dout: &[f32],
    dq: &mut [f32],
    dk: &mut [f32],
    dv: &mut [f32],
) {
    let Heads { head_dim: hd, tokens, .. } = geometry;
    let (slab, scale, group) = (geometry.slab(), geometry.scale(), geometry.group());
    // D = rowsum(dO ⊙ O) per query and head: the softmax backward's correction term.
    let correction: Vec<f32> = dout.par_chunks(hd).zip(saved.out.par_chunks(hd)).map(|(g, o)| dot(g, o)).collect();
    dk.fill(0.0);
    dv.fill(0.0);
    // One task per (kv head, family): it owns that kv head's key and value rows of the family and
    // the query rows of the family for every query head of the group.
    let mut tasks = Vec::new();
    let dq_groups = dq.chunks_mut(group * slab);
    for (kv, ((dk_h, dv_h), dq_group)) in dk.chunks_mut(slab).zip(dv.chunks_mut(slab)).zip(dq_groups).enumerate() {
        let ranges = || families.iter().map(|family| family.range.clone());
        let dks = cut(dk_h, ranges(), hd);
        let dvs = cut(dv_h, ranges(), hd);
        let mut dqs: Vec<Vec<&mut [f32]>> = families.iter().map(|_| Vec::new()).collect();
        for dq_h in dq_group.chunks_mut(slab) {
            for (family, part) in cut(dq_h, ranges(), hd).into_iter().enumerate() {
                dqs[family].push(part);
            }
        }
        for ((family, dk_f), (dv_f, dq_f)) in families.iter().zip(dks).zip(dvs.into_iter().zip(dqs)) {
            tasks.push((kv, family, dk_f, dv_f, dq_f));
        }
    }
    tasks.into_par_iter().for_each(|(kv, family, dk_f, dv_f, mut dq_f)| {
        widest(
            #[inline(always)]
            || {
                let base = family.range.start;
                let (k, v) = (&saved.k[kv * slab..(kv + 1) * slab], &saved.v[kv * slab..(kv + 1) * slab]);
                SCRATCH.with_borrow_mut(|(p, ds)| {
                    for (g, dq_h) in dq_f.iter_mut().enumerate() {
                        let h = kv * group + g;
                        let head = h * slab..(h + 1) * slab;
                        let (q, o_grad) = (&saved.q[head.clone()], &dout[head]);
                        for seg in family.segments() {
                            let own = segments[seg];
                            for rows in segment_blocks(&own) {
                                let ranges = key_rows(segments, seg, &rows);
                                let keys = [rows_of(k, hd, &ranges.0), rows_of(k, hd, &ranges.1)];
                                let values = [rows_of(v, hd, &ranges.0), rows_of(v, hd, &ranges.1)];
                                let width = ranges.0.len() + ranges.1.len();
                                let q_block = rows_of(q, hd, &rows);
                                let g_block = rows_of(o_grad, hd, &rows);
                                // P from the saved log-sum-exp, then dP = dO·Vᵀ.
                                p.resize(rows.len() * width, 0.0);
                                ds.resize(rows.len() * width, 0.0);
                                block_scores(q_block, &keys, scale, p);
                                for (r, row) in p.chunks_mut(width).enumerate() {
                                    let seen = visible(&keys, own.start, &rows, r);
                                    let lse = saved.lse[h * tokens + rows.start + r];
                                    row[..seen].iter_mut().for_each(|s| *s = exp(*s - lse));
                                    row[seen..].fill(0.0);
                                }
                                block_scores(g_block, &values, 1.0, ds);
                                // dS = P ⊙ (dP − D) · scale.
                                for (r, (ds_row, p_row)) in ds.chunks_mut(width).zip(p.chunks(width)).enumerate() {
                                    let d = correction[h * tokens + rows.start + r];
                                    ds_row.iter_mut().zip(p_row).for_each(|(ds, p)| *ds = p * (*ds - d) * scale);
                                }
                                // dQ = dS·K, written for the block's rows.
                                let dq_rows = &mut dq_h[(rows.start - base) * hd..(rows.end - base) * hd];
                                times_values(ds, &keys, dq_rows, false);
                                // dK += dSᵀ·Q and dV += Pᵀ·dO over the keys the block read.
                                for (offset, range) in [(0, &ranges.0), (ranges.0.len(), &ranges.1)] {
                                    if range.is_empty() {
                                        continue;
                                    }
                                    let at = (range.start - base) * hd..(range.end - base) * hd;
                                    let ds_part = Mat::strided(&ds[offset..], rows.len(), range.len(), width).t();
                                    let p_part = Mat::strided(&p[offset..], rows.len(), range.len(), width).t();
                                    matmul(
                                        MatMut::new(&mut dk_f[at.clone()], range.len(), hd),
                                        ds_part,
                                        q_block,
                                        1.0,
                                        true,
                                        Threads::One,
                                    );
                                    matmul(
                                        MatMut::new(&mut dv_f[at], range.len(), hd),
                                        p_part,
                                        g_block,
                                        1.0,
                                        true,
                                        Threads::One,
                                    );
                                }
                            }
                        }
                    }
                });
            },
        )
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataset::Encoded;
    use crate::model::packing::Packing;

    /// Plain attention of one row (`[T, hd]` per head), by the definition.
    fn naive(q: &[Vec<f32>], k: &[Vec<f32>], v: &[Vec<f32>], scale: f32) -> Vec<Vec<f32>> {
        q.iter()
            .enumerate()
            .map(|(t, qt)| {
                let scores: Vec<f32> = (0..=t).map(|j| scale * dot(qt, &k[j])).collect();
                let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let e: Vec<f32> = scores.iter().map(|s| (s - max).exp()).collect();
                let sum: f32 = e.iter().sum();
                (0..qt.len()).map(|c| (0..=t).map(|j| e[j] / sum * v[j][c]).sum()).collect()
            })
            .collect()
    }

    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| ((i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) % 1000) as f32 / 500.0 - 1.0)
            .collect()
    }

    #[test]
    fn shared_prefix_attention_is_each_rows_own_causal_attention() {
        // Rows of 150 and 90 tokens sharing 70 (blocks cross the prefix and tail boundaries), plus a
        // row sharing nothing; 4 query heads over 2 kv heads.
        let rows: Vec<Encoded> = [(150usize, 1000u32), (90, 2000), (40, 3000)]
            .iter()
            .enumerate()
            .map(|(r, &(len, tail))| {
                let ids: Vec<u32> = (0..len as u32).map(|t| if r < 2 && t < 70 { t + 1 } else { tail + t }).collect();
                Encoded { mask: vec![1.0; len], ids, truncated: false }
            })
            .collect();
        let packing = Packing::new(&rows, true).unwrap();
        assert_eq!(packing.len(), 70 + 80 + 20 + 40);
        let geometry = Heads { heads: 4, kv_heads: 2, head_dim: 8, tokens: packing.len() };
        let (n, hd) = (packing.len(), 8);
        let (q, k, v) = (values(4 * n * hd, 1), values(2 * n * hd, 2), values(2 * n * hd, 3));
        let (mut out, mut lse) = (vec![0f32; 4 * n * hd], vec![0f32; 4 * n]);
        forward(geometry, packing.segments(), &q, &k, &v, None, &mut out, &mut lse);
        let at = |buf: &[f32], h: usize, i: usize| buf[(h * n + i) * hd..(h * n + i + 1) * hd].to_vec();
        for (r, row) in rows.iter().enumerate() {
            let len = row.ids.len();
            for h in 0..4 {
                let index = |t| packing.index(r, t);
                let gather = |buf: &[f32], head| (0..len).map(|t| at(buf, head, index(t))).collect::<Vec<_>>();
                let want = naive(&gather(&q, h), &gather(&k, h / 2), &gather(&v, h / 2), geometry.scale());
                for t in 0..len {
                    let got = at(&out, h, index(t));
                    let diff = got.iter().zip(&want[t]).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
                    assert!(diff < 1e-5, "row {r} head {h} t {t}: off by {diff}");
                }
            }
        }

        // The backward against finite differences of Σ out·probe, on a few coordinates of each input.
        let probe = values(4 * n * hd, 4);
        let objective = |q: &[f32], k: &[f32], v: &[f32]| -> f64 {
            let (mut out, mut lse) = (vec![0f32; 4 * n * hd], vec![0f32; 4 * n]);
            forward(geometry, packing.segments(), q, k, v, None, &mut out, &mut lse);
            out.iter().zip(&probe).map(|(o, p)| f64::from(o * p)).sum()
        };
        let (mut dq, mut dk, mut dv) = (vec![0f32; q.len()], vec![0f32; k.len()], vec![0f32; v.len()]);
        let saved = Saved { q: &q, k: &k, v: &v, out: &out, lse: &lse };
        backward(geometry, packing.segments(), &packing.families(), &saved, &probe, &mut dq, &mut dk, &mut dv);
        let step = 1e-2f32;
        for (which, grad) in [(0, &dq), (1, &dk), (2, &dv)] {
            for index in [0, 5 * hd + 3, 69 * hd + 1, 75 * hd + 2, 171 * hd + 7, grad.len() - 1] {
                let nudged = |delta: f32| {
                    let mut inputs = [q.clone(), k.clone(), v.clone()];
                    inputs[which][index] += delta;
                    objective(&inputs[0], &inputs[1], &inputs[2])
                };
                let numeric = (nudged(step) - nudged(-step)) / (2.0 * f64::from(step));
                let analytic = f64::from(grad[index]);
                assert!(
                    (numeric - analytic).abs() < 2e-3 * (1.0 + analytic.abs()),
                    "input {which}[{index}]: {analytic} vs {numeric}"
                );
            }
        }
    }
}
