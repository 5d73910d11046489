//! Causal attention over a packed batch, flash-style: scores and probabilities exist only for one
//! block of queries at a time (in a per-thread scratch row block), the forward keeps each query's
//! log-sum-exp, and the backward recomputes the block's probabilities from it. Nothing
//! `T × T` outlives a block.
//!
//! Queries of a segment attend to the keys of the segment's context (its shared prefix) and to
//! their own segment's keys up to themselves; in a windowed layer (Needle 3) only to the last
//! `window` positions, so a block reads only the keys inside its first query's window and the cost
//! grows with `T·W`, not `T²`. Buffers are head-major, `[heads, N, width]`, so that one head's
//! rows of one segment are one contiguous slice: tasks own disjoint slices, and the products are
//! plain `gemm` calls on them. Queries and keys may be narrower than values (Needle 3's heads).

use std::cell::RefCell;
use std::ops::Range;

use rayon::prelude::*;

use super::mat::{matmul, Mat, MatMut, Threads};
use crate::model::packing::{Family, Segment};
use crate::simd::{dot, exp, sum, widest};

/// Queries per block: enough rows for the products to run at speed, few enough that a block's
/// scores stay in cache.
const BLOCK: usize = 64;

thread_local! {
    /// Per-thread scores and probabilities of the block being computed.
    static SCRATCH: RefCell<(Vec<f32>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// Runs `f` on this thread's scratch, compiled for the widest vectors. The closure a thread-local
/// hands its value to is a function of its own, compiled for the baseline CPU whatever its caller
/// was compiled for, so `widest` has to be inside it: outside, the block's exponentials ran four
/// lanes wide.
fn with_scratch<R>(f: impl FnOnce(&mut Vec<f32>, &mut Vec<f32>) -> R) -> R {
    SCRATCH.with_borrow_mut(|(a, b)| {
        widest(
            #[inline(always)]
            || f(a, b),
        )
    })
}

/// The geometry of one attention call.
#[derive(Debug, Clone, Copy)]
pub struct Heads {
    pub heads: usize,
    pub kv_heads: usize,
    /// Width of a query or key head.
    pub qk: usize,
    /// Width of a value head (and of the output's).
    pub v: usize,
    /// Packed tokens.
    pub tokens: usize,
    /// Positions a query sees back to, itself included (`None`: the whole row).
    pub window: Option<usize>,
}

impl Heads {
    fn group(&self) -> usize {
        self.heads / self.kv_heads
    }

    fn scale(&self) -> f32 {
        1.0 / (self.qk as f32).sqrt()
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

/// The keys one block of queries reads, as positions of its row: its context's (a shared prefix or
/// a decoding cache, positions `0..context_len`), then its own segment's, from the first position
/// its first query sees to its last query. Read in that order, a position `p` is column `p − lo`.
#[derive(Debug, Clone)]
struct Span {
    /// The first position read.
    lo: usize,
    /// The context's positions read (its rows, counted from its first).
    context: Range<usize>,
    /// The packed rows of its own segment read.
    own: Range<usize>,
    /// The position of the block's first query.
    first: usize,
    window: Option<usize>,
}

impl Span {
    /// The span of query rows `rows` of segment `seg`, whose context has `context_len` positions.
    fn new(seg: &Segment, context_len: usize, rows: &Range<usize>, window: Option<usize>) -> Self {
        let first = context_len + rows.start - seg.start;
        let lo = first_seen(first, window);
        let own_from = seg.start + lo.max(context_len) - context_len;
        Self { lo, context: lo.min(context_len)..context_len, own: own_from..rows.end, first, window }
    }

    fn width(&self) -> usize {
        self.context.len() + self.own.len()
    }

    /// The columns the block's query `r` sees.
    fn visible(&self, r: usize) -> Range<usize> {
        let position = self.first + r;
        first_seen(position, self.window) - self.lo..position + 1 - self.lo
    }
}

/// The first position a query at `position` sees.
fn first_seen(position: usize, window: Option<usize>) -> usize {
    window.map_or(0, |w| (position + 1).saturating_sub(w))
}

/// The rows `range` of one head's slab, as a `rows × width` matrix.
fn rows_of<'a>(slab: &'a [f32], width: usize, range: &Range<usize>) -> Mat<'a> {
    Mat::new(&slab[range.start * width..range.end * width], range.len(), width)
}

/// Keys (or values) a block reads, its context's then its own segment's: as rows (`positions ×
/// width` each) or, where the scores multiply by them, as columns (`width × positions`).
type Keys<'a> = [Mat<'a>; 2];

/// Head-major rows `[heads, N, width]` as head-major columns `[heads, width, N]`: the keys (or
/// values) that scores multiply by transposed, laid out so that gemm reads them row by row. Through
/// a transposed view of the rows a block's scores ran 13–15 % slower on a Zen 4 core; with the
/// columns, a Needle 3 layer's attention took 8 % less time forward and 6 % less backward.
fn columns(rows: &[f32], tokens: usize, width: usize) -> Vec<f32> {
    let mut columns = vec![0f32; rows.len()];
    let slabs = columns.par_chunks_mut(width * tokens).zip(rows.par_chunks(width * tokens));
    slabs.for_each(|(columns, rows)| {
        for (c, column) in columns.chunks_mut(tokens).enumerate() {
            column.iter_mut().zip(rows[c..].iter().step_by(width)).for_each(|(v, &r)| *v = r);
        }
    });
    columns
}

/// The positions `range` of one head's columns `[width, N]` (`N` = `tokens`), as a `width ×
/// range.len()` matrix.
fn columns_of<'a>(slab: &'a [f32], tokens: usize, range: &Range<usize>) -> Mat<'a> {
    let width = slab.len() / tokens.max(1);
    Mat::strided(&slab[range.start..], width, range.len(), tokens)
}

/// Writes `scale · q_block · keysᵀ` into `scores` (`rows × (context + own)`), row-major, from the
/// keys as columns (`qk × positions` each: the context's, then the own segment's).
fn block_scores(q: Mat, key_columns: &Keys, scale: f32, scores: &mut [f32]) {
    let width = key_columns[0].cols() + key_columns[1].cols();
    let mut offset = 0;
    for part in key_columns.iter().filter(|k| k.cols() > 0) {
        let dst = MatMut::strided(&mut scores[offset..], q.rows(), part.cols(), width);
        matmul(dst, q, *part, scale, false, Threads::One);
        offset += part.cols();
    }
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
/// `[kv_heads, capacity, width]`, each head's first `len − first` rows holding the positions
/// `first..len` (a windowed layer's cache drops the positions no later query sees): the context
/// of every segment that has no shared prefix.
#[derive(Debug, Clone, Copy)]
pub struct Cached<'a> {
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub first: usize,
    pub len: usize,
    pub capacity: usize,
}

impl<'a> Cached<'a> {
    /// Kv head `kv`'s positions `range` of `buf` (its keys or its values), rows of `width`.
    fn rows(&self, buf: &'a [f32], kv: usize, width: usize, range: &Range<usize>) -> Mat<'a> {
        let held = range.start - self.first..range.end - self.first;
        rows_of(&buf[kv * self.capacity * width..][..(self.len - self.first) * width], width, &held)
    }
}

/// Forward: `out` `[heads, N, v]` and `lse` `[heads, N]` from `q` `[heads, N, qk]`, `k`
/// `[kv_heads, N, qk]` and `v` `[kv_heads, N, v]`; when decoding, segment `s` follows the positions
/// `cached[s]` holds (a batch of decoding runs, a segment each; empty outside decoding).
#[allow(clippy::too_many_arguments)]
pub fn forward(
    geometry: Heads,
    segments: &[Segment],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    cached: &[Cached],
    out: &mut [f32],
    lse: &mut [f32],
) {
    let Heads { qk, v: vd, tokens, window, .. } = geometry;
    let (scale, group) = (geometry.scale(), geometry.group());
    let k_columns = columns(k, tokens, qk);
    let blocks = blocks(segments);
    let mut tasks = Vec::new();
    for (h, (out_h, lse_h)) in out.chunks_mut(tokens * vd).zip(lse.chunks_mut(tokens)).enumerate() {
        let outs = cut(out_h, blocks.iter().map(|(_, r)| r.clone()), vd);
        let lses = cut(lse_h, blocks.iter().map(|(_, r)| r.clone()), 1);
        tasks.extend(blocks.iter().zip(outs.into_iter().zip(lses)).map(|((s, rows), o)| (h, *s, rows.clone(), o)));
    }
    tasks.into_par_iter().for_each(|(h, seg, rows, (out, lse))| {
        let kv = h / group;
        let (k, v) = (&k_columns[kv * tokens * qk..][..tokens * qk], &v[kv * tokens * vd..][..tokens * vd]);
        // `k` is this kv head's keys as columns, `v` its values as rows.
        let own = segments[seg];
        let (keys, values, span) = match (own.context, cached.get(seg)) {
            (None, Some(cached)) => {
                let span = Span::new(&own, cached.len, &rows, window);
                let keys = [cached.rows(cached.k, kv, qk, &span.context).t(), columns_of(k, tokens, &span.own)];
                let values = [cached.rows(cached.v, kv, vd, &span.context), rows_of(v, vd, &span.own)];
                (keys, values, span)
            }
            (context, _) => {
                let context = context.map(|c| segments[c]);
                let span = Span::new(&own, context.map_or(0, |c| c.len), &rows, window);
                let from = context.map_or(0, |c| c.start);
                let context_rows = from + span.context.start..from + span.context.end;
                let keys = [columns_of(k, tokens, &context_rows), columns_of(k, tokens, &span.own)];
                let values = [rows_of(v, vd, &context_rows), rows_of(v, vd, &span.own)];
                (keys, values, span)
            }
        };
        let width = span.width();
        with_scratch(
            #[inline(always)]
            |scores, _| {
                scores.resize(rows.len() * width, 0.0);
                let q_block = rows_of(&q[h * tokens * qk..][..tokens * qk], qk, &rows);
                block_scores(q_block, &keys, scale, scores);
                for (r, row) in scores.chunks_mut(width).enumerate() {
                    let seen = span.visible(r);
                    let part = &mut row[seen.clone()];
                    let max = part.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    part.iter_mut().for_each(|s| *s = exp(*s - max));
                    let sum = sum(part);
                    let inverse = 1.0 / sum;
                    part.iter_mut().for_each(|s| *s *= inverse);
                    row[..seen.start].fill(0.0);
                    row[seen.end..].fill(0.0);
                    lse[r] = max + sum.ln();
                }
                times_values(scores, &values, out, false);
            },
        );
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

/// Gradients of the forward's inputs, all overwritten: `q` `[heads, N, qk]`, `k` `[kv_heads, N,
/// qk]` and `v` `[kv_heads, N, v]`.
pub struct Grads<'a> {
    pub q: &'a mut [f32],
    pub k: &'a mut [f32],
    pub v: &'a mut [f32],
}

/// Backward: the inputs' gradients from the output's gradient `dout` `[heads, N, v]`.
pub fn backward(geometry: Heads, segments: &[Segment], families: &[Family], saved: &Saved, dout: &[f32], grads: Grads) {
    let Heads { qk, v: vd, tokens, .. } = geometry;
    let group = geometry.group();
    // D = rowsum(dO ⊙ O) per query and head: the softmax backward's correction term.
    let correction: Vec<f32> = dout.par_chunks(vd).zip(saved.out.par_chunks(vd)).map(|(g, o)| dot(g, o)).collect();
    grads.k.fill(0.0);
    grads.v.fill(0.0);
    // One task per (kv head, family): it owns that kv head's key and value rows of the family and
    // the query rows of the family for every query head of the group.
    let mut tasks = Vec::new();
    let dk_heads = grads.k.chunks_mut(tokens * qk);
    let dv_heads = grads.v.chunks_mut(tokens * vd);
    for (kv, ((dk_h, dv_h), dq_group)) in
        dk_heads.zip(dv_heads).zip(grads.q.chunks_mut(group * tokens * qk)).enumerate()
    {
        let ranges = || families.iter().map(|family| family.range.clone());
        let dks = cut(dk_h, ranges(), qk);
        let dvs = cut(dv_h, ranges(), vd);
        let mut dqs: Vec<Vec<&mut [f32]>> = families.iter().map(|_| Vec::new()).collect();
        for dq_h in dq_group.chunks_mut(tokens * qk) {
            for (family, part) in cut(dq_h, ranges(), qk).into_iter().enumerate() {
                dqs[family].push(part);
            }
        }
        for ((family, dk), (dv, dq)) in families.iter().zip(dks).zip(dvs.into_iter().zip(dqs)) {
            tasks.push((kv, family, FamilyGrads { dk, dv, dq }));
        }
    }
    let (k_columns, v_columns) = (columns(saved.k, tokens, qk), columns(saved.v, tokens, vd));
    let columns = [k_columns.as_slice(), v_columns.as_slice()];
    tasks.into_par_iter().for_each(|(kv, family, mut grads)| {
        let task = FamilyTask { geometry, segments, saved, columns, dout, correction: &correction, kv, family };
        for g in 0..group {
            task.head(g, &mut grads);
        }
    });
}

/// One task's share of the gradients: a kv head's key and value rows of a family, and the family's
/// query rows of each query head of the group.
struct FamilyGrads<'a> {
    dk: &'a mut [f32],
    dv: &'a mut [f32],
    dq: Vec<&'a mut [f32]>,
}

/// What a backward task reads.
struct FamilyTask<'a> {
    geometry: Heads,
    segments: &'a [Segment],
    saved: &'a Saved<'a>,
    /// The saved keys and values as head-major columns ([`columns`]).
    columns: [&'a [f32]; 2],
    dout: &'a [f32],
    correction: &'a [f32],
    kv: usize,
    family: &'a Family,
}

impl FamilyTask<'_> {
    /// The gradients of query head `g` of the group over every block of the family.
    #[inline(always)]
    fn head(&self, g: usize, grads: &mut FamilyGrads) {
        let Heads { qk, v: vd, tokens, window, .. } = self.geometry;
        let (kv, base, scale) = (self.kv, self.family.range.start, self.geometry.scale());
        let h = kv * self.geometry.group() + g;
        let saved = self.saved;
        let k = &saved.k[kv * tokens * qk..][..tokens * qk];
        let [k_columns, v_columns] = self.columns;
        let (k_columns, v_columns) =
            (&k_columns[kv * tokens * qk..][..tokens * qk], &v_columns[kv * tokens * vd..][..tokens * vd]);
        let (q, o_grad) = (&saved.q[h * tokens * qk..][..tokens * qk], &self.dout[h * tokens * vd..][..tokens * vd]);
        with_scratch(
            #[inline(always)]
            |p, ds| {
                for seg in self.family.segments() {
                    let own = self.segments[seg];
                    let context = own.context.map(|c| self.segments[c]);
                    for rows in segment_blocks(&own) {
                        let span = Span::new(&own, context.map_or(0, |c| c.len), &rows, window);
                        let from = context.map_or(0, |c| c.start);
                        let ranges = [from + span.context.start..from + span.context.end, span.own.clone()];
                        let keys = [rows_of(k, qk, &ranges[0]), rows_of(k, qk, &ranges[1])];
                        let key_columns =
                            [columns_of(k_columns, tokens, &ranges[0]), columns_of(k_columns, tokens, &ranges[1])];
                        let value_columns =
                            [columns_of(v_columns, tokens, &ranges[0]), columns_of(v_columns, tokens, &ranges[1])];
                        let width = span.width();
                        let (q_block, g_block) = (rows_of(q, qk, &rows), rows_of(o_grad, vd, &rows));
                        // P from the saved log-sum-exp, then dP = dO·Vᵀ.
                        p.resize(rows.len() * width, 0.0);
                        ds.resize(rows.len() * width, 0.0);
                        block_scores(q_block, &key_columns, scale, p);
                        for (r, row) in p.chunks_mut(width).enumerate() {
                            let seen = span.visible(r);
                            let lse = saved.lse[h * tokens + rows.start + r];
                            row[seen.clone()].iter_mut().for_each(|s| *s = exp(*s - lse));
                            row[..seen.start].fill(0.0);
                            row[seen.end..].fill(0.0);
                        }
                        block_scores(g_block, &value_columns, 1.0, ds);
                        // dS = P ⊙ (dP − D) · scale.
                        for (r, (ds_row, p_row)) in ds.chunks_mut(width).zip(p.chunks(width)).enumerate() {
                            let d = self.correction[h * tokens + rows.start + r];
                            ds_row.iter_mut().zip(p_row).for_each(|(ds, p)| *ds = p * (*ds - d) * scale);
                        }
                        // dQ = dS·K, written for the block's rows.
                        let dq_rows = &mut grads.dq[g][(rows.start - base) * qk..(rows.end - base) * qk];
                        times_values(ds, &keys, dq_rows, false);
                        // dK += dSᵀ·Q and dV += Pᵀ·dO over the keys the block read.
                        let mut offset = 0;
                        for range in ranges.iter().filter(|r| !r.is_empty()) {
                            let (n, at) = (range.len(), range.start - base);
                            let ds_part = Mat::strided(&ds[offset..], rows.len(), n, width).t();
                            let p_part = Mat::strided(&p[offset..], rows.len(), n, width).t();
                            let dk = MatMut::new(&mut grads.dk[at * qk..(at + n) * qk], n, qk);
                            matmul(dk, ds_part, q_block, 1.0, true, Threads::One);
                            let dv = MatMut::new(&mut grads.dv[at * vd..(at + n) * vd], n, vd);
                            matmul(dv, p_part, g_block, 1.0, true, Threads::One);
                            offset += n;
                        }
                    }
                }
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataset::Encoded;
    use crate::model::packing::Packing;

    /// Plain attention of one row (`[T, width]` per head), by the definition: query t sees keys
    /// `t − window < j ≤ t`.
    fn naive(q: &[Vec<f32>], k: &[Vec<f32>], v: &[Vec<f32>], scale: f32, window: Option<usize>) -> Vec<Vec<f32>> {
        q.iter()
            .enumerate()
            .map(|(t, qt)| {
                let seen = first_seen(t, window)..t + 1;
                let scores: Vec<f32> = seen.clone().map(|j| scale * dot(qt, &k[j])).collect();
                let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let e: Vec<f32> = scores.iter().map(|s| (s - max).exp()).collect();
                let sum: f32 = e.iter().sum();
                (0..v[0].len()).map(|c| seen.clone().zip(&e).map(|(j, e)| e / sum * v[j][c]).sum()).collect()
            })
            .collect()
    }

    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| ((i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) % 1000) as f32 / 500.0 - 1.0)
            .collect()
    }

    /// Rows of 150 and 90 tokens sharing 70 (blocks cross the prefix and tail boundaries), plus a
    /// row sharing nothing; 4 query heads over 2 kv heads, keys narrower than values; with and
    /// without a window shorter than the prefix and than a block.
    #[test]
    fn shared_prefix_attention_is_each_rows_own_causal_attention() {
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
        for window in [None, Some(50), Some(9)] {
            check_against_naive(&rows, &packing, window);
        }
    }

    fn check_against_naive(rows: &[Encoded], packing: &Packing, window: Option<usize>) {
        let (n, qk, vd) = (packing.len(), 8, 6);
        let geometry = Heads { heads: 4, kv_heads: 2, qk, v: vd, tokens: n, window };
        let (q, k, v) = (values(4 * n * qk, 1), values(2 * n * qk, 2), values(2 * n * vd, 3));
        let (mut out, mut lse) = (vec![0f32; 4 * n * vd], vec![0f32; 4 * n]);
        forward(geometry, packing.segments(), &q, &k, &v, &[], &mut out, &mut lse);
        let at = |buf: &[f32], width: usize, h: usize, i: usize| buf[(h * n + i) * width..][..width].to_vec();
        for (r, row) in rows.iter().enumerate() {
            let len = row.ids.len();
            for h in 0..4 {
                let index = |t| packing.index(r, t);
                let gather =
                    |buf: &[f32], width, head| (0..len).map(|t| at(buf, width, head, index(t))).collect::<Vec<_>>();
                let want =
                    naive(&gather(&q, qk, h), &gather(&k, qk, h / 2), &gather(&v, vd, h / 2), geometry.scale(), window);
                for (t, want) in want.iter().enumerate() {
                    let got = at(&out, vd, h, index(t));
                    let diff = got.iter().zip(want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
                    assert!(diff < 1e-5, "window {window:?}, row {r} head {h} t {t}: off by {diff}");
                }
            }
        }

        // The backward against finite differences of Σ out·probe, on a few coordinates of each input.
        let probe = values(4 * n * vd, 4);
        let objective = |q: &[f32], k: &[f32], v: &[f32]| -> f64 {
            let (mut out, mut lse) = (vec![0f32; 4 * n * vd], vec![0f32; 4 * n]);
            forward(geometry, packing.segments(), q, k, v, &[], &mut out, &mut lse);
            out.iter().zip(&probe).map(|(o, p)| f64::from(o * p)).sum()
        };
        let (mut dq, mut dk, mut dv) = (vec![0f32; q.len()], vec![0f32; k.len()], vec![0f32; v.len()]);
        let saved = Saved { q: &q, k: &k, v: &v, out: &out, lse: &lse };
        let grads = Grads { q: &mut dq, k: &mut dk, v: &mut dv };
        backward(geometry, packing.segments(), &packing.families(), &saved, &probe, grads);
        let step = 1e-2f32;
        for (which, grad, width) in [(0, &dq, qk), (1, &dk, qk), (2, &dv, vd)] {
            for index in [0, 5 * width + 3, 69 * width + 1, 75 * width + 2, 171 * width + 5, grad.len() - 1] {
                let nudged = |delta: f32| {
                    let mut inputs = [q.clone(), k.clone(), v.clone()];
                    inputs[which][index] += delta;
                    objective(&inputs[0], &inputs[1], &inputs[2])
                };
                let numeric = (nudged(step) - nudged(-step)) / (2.0 * f64::from(step));
                let analytic = f64::from(grad[index]);
                assert!(
                    (numeric - analytic).abs() < 2e-3 * (1.0 + analytic.abs()),
                    "window {window:?}, input {which}[{index}]: {analytic} vs {numeric}"
                );
            }
        }
    }
}
