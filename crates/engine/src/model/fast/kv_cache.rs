//! One layer's key/value cache of a decoding run on the CPU path. A windowed layer (Needle 3) keeps
//! only the positions a later query can see — the last `window − 1` — as the `.cact`'s KV budget
//! does; a global layer keeps every position.

use std::ops::Range;

use rayon::prelude::*;

use super::flash::Cached;

/// Keys and values of the positions `first..len` decoded so far, head-major: rows
/// `0..len − first` of each head's slab of `capacity` rows, `[kv_heads, capacity, qk]` and
/// `[kv_heads, capacity, v]`. Under Needle 3's Q/K/V convolution, also the last inputs its taps
/// reach.
#[derive(Debug, Clone, Default)]
pub(super) struct LayerCache {
    k: Vec<f32>,
    v: Vec<f32>,
    /// The first position held.
    first: usize,
    capacity: usize,
    /// `[taps − 1, q + k + v]` at most, oldest first.
    pub(super) recent: Vec<f32>,
}

/// The cache's geometry: kv heads, the key and value head widths, and the layer's window.
#[derive(Debug, Clone, Copy)]
pub(super) struct Shape {
    pub(super) kv_heads: usize,
    pub(super) widths: [usize; 2],
    pub(super) window: Option<usize>,
}

impl LayerCache {
    /// The positions `..len` as attention reads them.
    pub(super) fn cached(&self, len: usize) -> Cached<'_> {
        Cached { k: &self.k, v: &self.v, first: self.first, len, capacity: self.capacity }
    }

    /// Room for `count` positions after the `len` held: a windowed layer first drops those no
    /// later query sees, then each head's rows move to a wider slab if they must (doubling, so
    /// that a run of steps copies each row a bounded number of times).
    pub(super) fn reserve(&mut self, len: usize, count: usize, shape: Shape) {
        let held = len - self.first;
        if held + count <= self.capacity {
            return;
        }
        let keep_from = shape.window.map_or(self.first, |w| len.saturating_sub(w - 1)).max(self.first);
        let (drop, kept) = (keep_from - self.first, len - keep_from);
        let capacity =
            if kept + count <= self.capacity { self.capacity } else { (kept + count).max(2 * self.capacity).max(64) };
        for (buf, hd) in [(&mut self.k, shape.widths[0]), (&mut self.v, shape.widths[1])] {
            let mut moved = vec![0f32; shape.kv_heads * capacity * hd];
            for h in 0..shape.kv_heads {
                moved[h * capacity * hd..][..kept * hd]
                    .copy_from_slice(&buf[(h * self.capacity + drop) * hd..][..kept * hd]);
            }
            *buf = moved;
        }
        (self.first, self.capacity) = (keep_from, capacity);
    }

    /// Adds the positions after `len` (room reserved) that a pass of `tokens` computed as its rows
    /// `rows` (one decoding run's share of a batched step): keys and values head-major
    /// (`[kv_heads, tokens, qk]` and `[kv_heads, tokens, v]`).
    pub(super) fn append(&mut self, len: usize, rows: Range<usize>, tokens: usize, fresh: [&[f32]; 2], shape: Shape) {
        let (at, count) = (len - self.first, rows.len());
        for ((cache, fresh), hd) in [&mut self.k, &mut self.v].into_iter().zip(fresh).zip(shape.widths) {
            cache.par_chunks_mut(self.capacity * hd).zip(fresh.par_chunks(tokens * hd)).for_each(|(slab, pass)| {
                slab[at * hd..(at + count) * hd].copy_from_slice(&pass[rows.start * hd..rows.end * hd]);
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A windowed layer keeps its last `window − 1` positions (and the step's), in order; a global
    /// layer keeps them all.
    #[test]
    fn a_windowed_layer_keeps_only_what_a_later_query_sees() {
        for window in [Some(5), None] {
            let shape = Shape { kv_heads: 2, widths: [3, 2], window };
            let mut cache = LayerCache::default();
            let mut len = 0;
            for count in [7, 1, 1, 60, 1, 1, 1, 70, 2] {
                cache.reserve(len, count, shape);
                // Position p of head h holds keys (h, p, c) → 1000h + 10p + c.
                let keys: Vec<f32> = (0..2)
                    .flat_map(|h| {
                        (len..len + count).flat_map(move |p| (0..3).map(move |c| (1000 * h + 10 * p + c) as f32))
                    })
                    .collect();
                let values: Vec<f32> = keys.chunks(3).flat_map(|k| [k[0], -k[0]]).collect();
                cache.append(len, 0..count, count, [&keys, &values], shape);
                len += count;
                let lowest = window.map_or(0, |w| (len + 1).saturating_sub(w));
                assert!(cache.first <= lowest, "window {window:?}: position {lowest} dropped at {len}");
                if window.is_none() {
                    assert_eq!(cache.first, 0);
                }
                let cached = cache.cached(len);
                for h in 0..2 {
                    for p in cache.first..len {
                        let row = (h * cache.capacity + p - cache.first) * 3;
                        assert_eq!(
                            cached.k[row],
                            (1000 * h + 10 * p) as f32,
                            "window {window:?}, head {h}, position {p}"
                        );
                    }
                }
            }
            if window.is_some() {
                assert!(cache.capacity < 150, "a windowed cache stays near its window: {}", cache.capacity);
            }
        }
    }
}
