//! Needle 3's causal depthwise convolution on the Q, K and V projections
//! ([`crate::model::san::conv`]), forward and backward by hand: `out[t] = Σ_j taps[j] ⊙ x[t − j]`
//! along each row, a position before the row's start reading zeros. Like rope and the engram
//! n-grams, a tail's taps reach back across its start into its shared prefix
//! ([`Packing::earlier`]): the backward gathers, for each token, the gradients of every token that
//! read it, so a prefix token collects those of every row that continues it.

use rayon::prelude::*;

use crate::model::packing::Packing;
use crate::simd::widest;

/// Tokens per rayon task: enough to amortise the hand-off.
const TOKENS_PER_TASK: usize = 16;

/// Which earlier packed token each tap after the first reads, for every token of a pass, and the
/// converse: the (token, tap) pairs that read each token.
#[derive(Debug, Clone, Default)]
pub(super) struct Reads {
    taps: usize,
    /// `[N, taps − 1]`: the token tap `j` of token `i` reads, or [`NONE`] before its row's start.
    from: Vec<u32>,
    /// The readers of token `s` are `readers[starts[s]..starts[s + 1]]`, as `(token, tap)`.
    starts: Vec<u32>,
    readers: Vec<(u32, u32)>,
}

/// No earlier token: a position before the row's start.
const NONE: u32 = u32::MAX;

impl Reads {
    /// Over the packed tokens of `packing`.
    pub(super) fn new(packing: &Packing, taps: usize) -> Self {
        Self::reading(packing.len(), taps, |i, back| packing.earlier(i, back))
    }

    fn reading(tokens: usize, taps: usize, earlier: impl Fn(usize, usize) -> Option<usize>) -> Self {
        let back = taps.saturating_sub(1);
        let from: Vec<u32> = (0..tokens)
            .flat_map(|i| (1..taps).map(|j| earlier(i, j).map_or(NONE, |s| s as u32)).collect::<Vec<_>>())
            .collect();
        let mut counts = vec![0u32; tokens + 1];
        from.iter().filter(|&&s| s != NONE).for_each(|&s| counts[s as usize + 1] += 1);
        let starts: Vec<u32> = counts
            .iter()
            .scan(0u32, |total, &c| {
                *total += c;
                Some(*total)
            })
            .collect();
        let mut next = starts.clone();
        let mut readers = vec![(0u32, 0u32); from.iter().filter(|&&s| s != NONE).count()];
        for (k, &s) in from.iter().enumerate() {
            if s != NONE {
                readers[next[s as usize] as usize] = ((k / back.max(1)) as u32, (k % back.max(1) + 1) as u32);
                next[s as usize] += 1;
            }
        }
        Self { taps, from, starts, readers }
    }
}

/// The taps of one layer's Q, K and V, side by side: `[taps, q + k + v]`.
#[derive(Debug, Clone)]
pub(super) struct Conv {
    taps: Vec<f32>,
    width: usize,
}

impl Conv {
    pub(super) fn new(taps: &[candle_core::Tensor; 3]) -> crate::model::Result<Self> {
        let count = taps[0].dim(0)?;
        let parts = taps.iter().map(|t| t.to_vec2::<f32>()).collect::<candle_core::Result<Vec<_>>>()?;
        let width = parts.iter().map(|p| p[0].len()).sum();
        let taps = (0..count).flat_map(|j| parts.iter().flat_map(move |p| p[j].iter().copied())).collect();
        Ok(Self { taps, width })
    }

    /// `out` (rows `out_stride` apart, the first `width` columns written) from `x` (rows of
    /// `width`), each token reading the earlier tokens `reads` names.
    pub(super) fn forward(&self, reads: &Reads, x: &[f32], out: &mut [f32], out_stride: usize) {
        let (w, back) = (self.width, reads.taps - 1);
        out.par_chunks_mut(out_stride).enumerate().with_min_len(TOKENS_PER_TASK).for_each(|(i, row)| {
            widest(
                #[inline(always)]
                || {
                    let row = &mut row[..w];
                    row.iter_mut().zip(x[i * w..][..w].iter().zip(&self.taps[..w])).for_each(|(o, (x, t))| *o = t * x);
                    for (j, &s) in reads.from[i * back..][..back].iter().enumerate() {
                        if s != NONE {
                            let (x, taps) = (&x[s as usize * w..][..w], &self.taps[(j + 1) * w..][..w]);
                            row.iter_mut().zip(x.iter().zip(taps)).for_each(|(o, (x, t))| *o += t * x);
                        }
                    }
                },
            )
        });
    }

    /// A decoding step's `out` (as [`Conv::forward`]) from its new tokens' `x`, the taps that reach
    /// before them reading `recent`, the last inputs before the step (oldest first; zeros before
    /// the row's start).
    pub(super) fn forward_after(&self, recent: &[f32], x: &[f32], out: &mut [f32], out_stride: usize) {
        let (w, taps) = (self.width, self.taps.len() / self.width);
        let before = recent.len() / w;
        for (i, row) in out.chunks_mut(out_stride).enumerate().take(x.len() / w) {
            let row = &mut row[..w];
            row.fill(0.0);
            for j in 0..taps {
                let source = match i.checked_sub(j) {
                    Some(s) => &x[s * w..][..w],
                    None if j - i <= before => &recent[(before - (j - i)) * w..][..w],
                    None => continue,
                };
                let taps = &self.taps[j * w..][..w];
                row.iter_mut().zip(source.iter().zip(taps)).for_each(|(o, (x, t))| *o += t * x);
            }
        }
    }

    /// The last inputs a decoding step leaves for the next: `recent` then the step's `x`, the last
    /// `taps − 1` of them.
    pub(super) fn keep_recent(&self, recent: &mut Vec<f32>, x: &[f32]) {
        let keep = (self.taps.len() / self.width - 1) * self.width;
        recent.extend_from_slice(x);
        let excess = recent.len().saturating_sub(keep);
        recent.drain(..excess);
    }

    /// `dx` (rows of `width`, overwritten) from the output's gradient `dout` (rows `dout_stride`
    /// apart, its first `width` columns).
    pub(super) fn backward(&self, reads: &Reads, dout: &[f32], dout_stride: usize, dx: &mut [f32]) {
        let w = self.width;
        dx.par_chunks_mut(w).enumerate().with_min_len(TOKENS_PER_TASK).for_each(|(s, row)| {
            widest(
                #[inline(always)]
                || {
                    let own = &dout[s * dout_stride..][..w];
                    row.iter_mut().zip(own.iter().zip(&self.taps[..w])).for_each(|(d, (g, t))| *d = t * g);
                    let readers = &reads.readers[reads.starts[s] as usize..reads.starts[s + 1] as usize];
                    for &(i, j) in readers {
                        let (g, taps) = (&dout[i as usize * dout_stride..][..w], &self.taps[j as usize * w..][..w]);
                        row.iter_mut().zip(g.iter().zip(taps)).for_each(|(d, (g, t))| *d += t * g);
                    }
                },
            )
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataset::Encoded;

    /// Against the definition on each row unshared, with rows that share a prefix (tails whose
    /// taps reach into it), and the backward as the forward's transpose: `⟨conv(x), g⟩ = ⟨x, convᵀ(g)⟩`.
    #[test]
    fn shared_prefix_taps_read_each_rows_own_history_and_the_backward_is_the_transpose() {
        let rows: Vec<Encoded> = [(30usize, 100u32), (25, 200), (7, 300)]
            .iter()
            .enumerate()
            .map(|(r, &(len, tail))| {
                let ids: Vec<u32> = (0..len as u32).map(|t| if r < 2 && t < 20 { t + 1 } else { tail + t }).collect();
                Encoded { mask: vec![1.0; len], ids, truncated: false }
            })
            .collect();
        let packing = Packing::new(&rows, true).unwrap();
        assert_eq!(packing.len(), 20 + 10 + 5 + 7);
        let (taps, w, n) = (3, 5, packing.len());
        let tap_values: Vec<Vec<f32>> =
            (0..taps).map(|j| (0..w).map(|c| 0.3 + j as f32 - 0.2 * c as f32).collect()).collect();
        let conv = Conv { taps: tap_values.concat(), width: w };
        let reads = Reads::new(&packing, taps);
        let x: Vec<f32> = (0..n * w).map(|i| ((i * 37 % 23) as f32 - 11.0) / 7.0).collect();
        let mut out = vec![0f32; n * w];
        conv.forward(&reads, &x, &mut out, w);
        for (r, row) in rows.iter().enumerate() {
            for t in 0..row.ids.len() {
                for c in 0..w {
                    let want: f32 = (0..taps)
                        .filter(|&j| j <= t)
                        .map(|j| tap_values[j][c] * x[packing.index(r, t - j) * w + c])
                        .sum();
                    let got = out[packing.index(r, t) * w + c];
                    assert!((got - want).abs() < 1e-5, "row {r} position {t} column {c}: {got} vs {want}");
                }
            }
        }
        // The last row decoded a token at a time, each step after the inputs before it.
        let (last, mut recent) = (&rows[2], Vec::new());
        for t in 0..last.ids.len() {
            let i = packing.index(2, t);
            let mut step = vec![0f32; w];
            conv.forward_after(&recent, &x[i * w..][..w], &mut step, w);
            assert_eq!(step, out[i * w..][..w], "decoding position {t}");
            conv.keep_recent(&mut recent, &x[i * w..][..w]);
        }
        let g: Vec<f32> = (0..n * w).map(|i| ((i * 11 % 17) as f32 - 8.0) / 5.0).collect();
        let mut dx = vec![0f32; n * w];
        conv.backward(&reads, &g, w, &mut dx);
        let forward: f64 = out.iter().zip(&g).map(|(a, b)| f64::from(a * b)).sum();
        let backward: f64 = x.iter().zip(&dx).map(|(a, b)| f64::from(a * b)).sum();
        assert!((forward - backward).abs() < 1e-3, "{forward} vs {backward}");
    }
}
