//! How a batch's rows are laid out for one pass through the network.
//!
//! An app's training data repeats one long prompt — the system and tools block — at the start of
//! every row. Rows that begin with the same tokens share one copy of that prefix: it is computed
//! once, and each row computes only its own tail, whose queries attend to the prefix's keys and
//! values as well as to their own. Nothing but attention mixes positions, and in attention a tail
//! sees exactly the keys its unshared row would have, at the same positions, so every value is the
//! unshared one; the gradient reaching the prefix from every row that shares it is summed into it,
//! which is the sum the unshared rows' gradients would have made. Sharing changes what is
//! computed, not how, so every backend runs it.
//!
//! The packed layout is a list of [`Segment`]s of consecutive tokens: a shared prefix, the tails
//! that continue it, and whole rows that share nothing. Tokens carry their position in their row,
//! so position-dependent parts (rotary angles, the engram n-grams and convolution taps) see the
//! same positions as unshared rows; [`Packing::earlier`] walks a row backwards across a tail's
//! start into its prefix. Trailing padding (PAD with a zero mask) is dropped from every row: it
//! sits after every scored token under a causal mask, so it changes no loss.

use std::ops::Range;

use super::loss::Scored;
use super::{ModelError, Result};
use crate::dataset::Encoded;
use crate::tokenizer::PAD_ID;

/// The shortest prefix worth sharing: below it, the bookkeeping of another segment (and on GPUs
/// another attention call) costs more than the tokens it saves.
pub const MIN_SHARED: usize = 16;

/// Consecutive packed tokens that are one part of one or more rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// Packed index of the first token.
    pub start: usize,
    pub len: usize,
    /// The shared prefix (a segment index) this segment continues; `None` for a prefix and for a
    /// row that shares nothing. A segment's first position is its context's length.
    pub context: Option<usize>,
}

impl Segment {
    pub fn range(&self) -> Range<usize> {
        self.start..self.start + self.len
    }
}

/// A shared prefix with the segments that continue it, or a segment on its own: the segments whose
/// queries read the same keys. A family's tokens are one contiguous range of the packing, and the
/// families follow one another in packed order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Family {
    /// The prefix, or the lone segment.
    pub head: usize,
    /// The segments continuing the prefix (none for a lone segment).
    pub tails: Vec<usize>,
    pub range: Range<usize>,
}

impl Family {
    /// The shared prefix, if the family has one.
    pub fn prefix(&self) -> Option<usize> {
        (!self.tails.is_empty()).then_some(self.head)
    }

    /// Every segment of the family, the head first.
    pub fn segments(&self) -> impl Iterator<Item = usize> + '_ {
        std::iter::once(self.head).chain(self.tails.iter().copied())
    }
}

/// One row of the batch: the segments that hold it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct RowSpan {
    /// Its own segment (the tail, or the whole row).
    own: usize,
    /// Tokens of the row after trailing padding is dropped.
    len: usize,
}

/// Rows that share their first `len` tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Share {
    /// Row indices, in order.
    pub rows: Vec<usize>,
    pub len: usize,
}

/// A batch's rows laid out as segments, with the positions the loss scores.
#[derive(Debug, Clone, PartialEq)]
pub struct Packing {
    /// Token ids in packed order.
    pub ids: Vec<u32>,
    /// Each packed token's position in its row(s).
    pub positions: Vec<u32>,
    /// Each packed token's segment.
    segment_of: Vec<u32>,
    segments: Vec<Segment>,
    rows: Vec<RowSpan>,
    /// The scored positions, as packed indices: `positions[s]` is the token whose logits predict
    /// `targets[s]`.
    scored: Scored,
}

impl Packing {
    /// The rows laid out with shared prefixes of at least [`MIN_SHARED`] tokens when `share`,
    /// else one segment per row (the layout of a plain `[B, T]` batch, without its padding).
    pub fn new(rows: &[Encoded], share: bool) -> Result<Self> {
        let trimmed: Vec<&[u32]> = rows.iter().map(|row| &row.ids[..used_len(row)]).collect();
        if trimmed.is_empty() || trimmed.iter().any(|row| row.is_empty()) {
            return Err(ModelError::EmptyBatch);
        }
        let shares = if share { shared_prefixes(&trimmed, MIN_SHARED) } else { Vec::new() };
        let mut packing = Self {
            ids: Vec::new(),
            positions: Vec::new(),
            segment_of: Vec::new(),
            segments: Vec::new(),
            rows: vec![RowSpan { own: 0, len: 0 }; rows.len()],
            scored: Scored::default(),
        };
        let mut shared = vec![false; rows.len()];
        for share in &shares {
            let prefix = packing.push(&trimmed[share.rows[0]][..share.len], 0, None);
            for &row in &share.rows {
                let own = packing.push(&trimmed[row][share.len..], share.len, Some(prefix));
                packing.rows[row] = RowSpan { own, len: trimmed[row].len() };
                shared[row] = true;
            }
        }
        for (row, ids) in trimmed.iter().enumerate().filter(|(row, _)| !shared[*row]) {
            let own = packing.push(ids, 0, None);
            packing.rows[row] = RowSpan { own, len: ids.len() };
        }
        packing.scored = packing.scored_positions(rows);
        Ok(packing)
    }

    /// Appends a segment of `ids` at positions `first..`; returns its index.
    fn push(&mut self, ids: &[u32], first: usize, context: Option<usize>) -> usize {
        let index = self.segments.len();
        self.segments.push(Segment { start: self.ids.len(), len: ids.len(), context });
        self.ids.extend_from_slice(ids);
        self.positions.extend((first..first + ids.len()).map(|p| p as u32));
        self.segment_of.extend(std::iter::repeat_n(index as u32, ids.len()));
        index
    }

    /// Logits at t predict `ids[t + 1]`, weighted by `mask[t + 1]`, row by row.
    fn scored_positions(&self, rows: &[Encoded]) -> Scored {
        let mut scored = Scored::default();
        for (row, encoded) in rows.iter().enumerate() {
            for t in 1..self.rows[row].len {
                if encoded.mask[t] != 0.0 {
                    scored.positions.push(self.index(row, t - 1) as u32);
                    scored.targets.push(encoded.ids[t]);
                    scored.weights.push(encoded.mask[t]);
                }
            }
        }
        scored
    }

    /// Packed tokens.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Rows of the batch.
    pub fn num_rows(&self) -> usize {
        self.rows.len()
    }

    /// Tokens of `row` (its trailing padding dropped).
    pub fn row_len(&self, row: usize) -> usize {
        self.rows[row].len
    }

    /// The longest row.
    pub fn longest_row(&self) -> usize {
        self.rows.iter().map(|r| r.len).max().unwrap_or(0)
    }

    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }

    /// The segment holding row `row`'s own tokens (its tail, or all of it).
    pub fn row_segment(&self, row: usize) -> usize {
        self.rows[row].own
    }

    pub fn scored(&self) -> &Scored {
        &self.scored
    }

    /// The packed index of row `row`'s token at position `t`.
    pub fn index(&self, row: usize, t: usize) -> usize {
        let own = self.segments[self.rows[row].own];
        match own.context.map(|c| self.segments[c]) {
            Some(context) if t < context.len => context.start + t,
            Some(context) => own.start + t - context.len,
            None => own.start + t,
        }
    }

    /// The packed index of the token `back` positions before packed token `i` in its row (any row
    /// it is part of: a prefix token's history is the prefix); `None` before the row's start.
    pub fn earlier(&self, i: usize, back: usize) -> Option<usize> {
        let position = self.positions[i] as usize;
        let target = position.checked_sub(back)?;
        let segment = self.segments[self.segment_of[i] as usize];
        let first = position - (i - segment.start);
        match segment.context {
            Some(context) if target < first => Some(self.segments[context].start + target),
            _ => Some(i - back),
        }
    }

    /// The families of segments, in packed order.
    pub fn families(&self) -> Vec<Family> {
        let mut families: Vec<Family> = Vec::new();
        for (s, segment) in self.segments.iter().enumerate() {
            match (segment.context, families.last_mut()) {
                // A tail follows its prefix's family.
                (Some(_), Some(family)) => {
                    family.tails.push(s);
                    family.range.end = segment.start + segment.len;
                }
                _ => families.push(Family { head: s, tails: Vec::new(), range: segment.range() }),
            }
        }
        families
    }

    /// The rows split into passes of at most `max_tokens` packed tokens each (a pass holds one row
    /// at least, however long): whole families where they fit, so that a prefix is computed once
    /// per pass it appears in. Row indices per pass, in order.
    pub fn passes(&self, max_tokens: usize) -> Vec<Vec<usize>> {
        let families = self.families();
        let mut family_of = vec![0; self.segments.len()];
        for (f, family) in families.iter().enumerate() {
            family.segments().for_each(|s| family_of[s] = f);
        }
        let mut members: Vec<Vec<usize>> = vec![Vec::new(); families.len()];
        for (row, span) in self.rows.iter().enumerate() {
            members[family_of[span.own]].push(row);
        }
        let mut passes: Vec<Vec<usize>> = Vec::new();
        let (mut current, mut used) = (Vec::new(), 0usize);
        for (family, rows) in families.iter().zip(members) {
            let prefix = family.prefix().map_or(0, |p| self.segments[p].len);
            let mut prefix_paid = false;
            for row in rows {
                let tail = self.segments[self.rows[row].own].len;
                if !current.is_empty() && used + tail + if prefix_paid { 0 } else { prefix } > max_tokens {
                    passes.push(std::mem::take(&mut current));
                    used = 0;
                    prefix_paid = false;
                }
                used += tail + if prefix_paid { 0 } else { prefix };
                prefix_paid = true;
                current.push(row);
            }
        }
        if !current.is_empty() {
            passes.push(current);
        }
        passes.iter_mut().for_each(|pass| pass.sort_unstable());
        passes
    }

    /// Positions every query attends to summed over the batch: the work of attention.
    pub fn attention_pairs(&self) -> usize {
        self.segments
            .iter()
            .map(|s| {
                let context = s.context.map_or(0, |c| self.segments[c].len);
                s.len * context + s.len * (s.len + 1) / 2
            })
            .sum()
    }

    /// The tokens the same rows would take unshared: what sharing saves is the difference.
    pub fn unshared_len(&self) -> usize {
        self.rows.iter().map(|r| r.len).sum()
    }
}

/// Positions of `row` that matter: trailing PAD tokens with a zero mask are dropped (one position
/// is kept of a row that is all padding).
fn used_len(row: &Encoded) -> usize {
    let used = row.ids.iter().zip(&row.mask).rposition(|(&id, &m)| id != PAD_ID || m != 0.0).map_or(0, |p| p + 1);
    used.max(1).min(row.ids.len())
}

/// Length of the common prefix of two rows.
pub(crate) fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Groups of rows that share a prefix of at least `min_len` tokens, chosen to save the most
/// tokens: rows are sorted so that rows with common prefixes are neighbours, then cut into runs
/// by dynamic programming, a run of k rows whose shortest neighbouring common prefix is m saving
/// (k − 1)·m. Every row keeps at least one token of its own. Rows in no group share nothing.
pub fn shared_prefixes(rows: &[&[u32]], min_len: usize) -> Vec<Share> {
    let mut order: Vec<usize> = (0..rows.len()).collect();
    order.sort_by(|&a, &b| rows[a].cmp(rows[b]).then(a.cmp(&b)));
    // common[i]: the prefix rows order[i] and order[i + 1] can share.
    let common: Vec<usize> = order
        .windows(2)
        .map(|w| common_prefix(rows[w[0]], rows[w[1]]).min(rows[w[0]].len() - 1).min(rows[w[1]].len() - 1))
        .collect();
    // best[i]: (tokens saved by the first i sorted rows, where the last run starts).
    let mut best: Vec<(usize, usize)> = vec![(0, 0); order.len() + 1];
    for end in 1..=order.len() {
        best[end] = (best[end - 1].0, end - 1);
        let mut shortest = usize::MAX;
        for start in (0..end - 1).rev() {
            shortest = shortest.min(common[start]);
            if shortest < min_len {
                break;
            }
            let saved = best[start].0 + (end - start - 1) * shortest;
            if saved > best[end].0 {
                best[end] = (saved, start);
            }
        }
    }
    let mut shares = Vec::new();
    let mut end = order.len();
    while end > 0 {
        let start = best[end].1;
        if end - start >= 2 {
            let len = common[start..end - 1].iter().copied().min().unwrap_or(0);
            let mut members = order[start..end].to_vec();
            members.sort_unstable();
            shares.push(Share { rows: members, len });
        }
        end = start;
    }
    shares.sort_by_key(|share| share.rows[0]);
    shares
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(ids: &[u32], scored_from: usize) -> Encoded {
        let mask = (0..ids.len()).map(|t| if t >= scored_from { 1.0 } else { 0.0 }).collect();
        Encoded { ids: ids.to_vec(), mask, truncated: false }
    }

    /// A row of `prefix` shared tokens (1..) followed by `tail` tokens starting at `tail_token`.
    fn prompt_row(prefix: usize, tail_token: u32, tail: usize) -> Encoded {
        let ids: Vec<u32> = (1..=prefix as u32).chain((0..tail as u32).map(|i| tail_token + i)).collect();
        row(&ids, prefix + 1)
    }

    #[test]
    fn rows_with_a_common_prompt_share_it_and_keep_their_positions() {
        let rows = [prompt_row(20, 100, 5), prompt_row(20, 200, 3), prompt_row(20, 300, 4)];
        let packing = Packing::new(&rows, true).unwrap();
        assert_eq!(packing.len(), 20 + 5 + 3 + 4);
        assert_eq!(packing.unshared_len(), 25 + 23 + 24);
        let segments = packing.segments();
        assert_eq!(segments[0], Segment { start: 0, len: 20, context: None });
        assert_eq!(segments[2], Segment { start: 25, len: 3, context: Some(0) });
        for (r, encoded) in rows.iter().enumerate() {
            for t in 0..encoded.ids.len() {
                let i = packing.index(r, t);
                assert_eq!((packing.ids[i], packing.positions[i] as usize), (encoded.ids[t], t), "row {r}, t {t}");
                // Walking back from any position reaches every earlier token of the same row.
                for back in 0..=t {
                    assert_eq!(packing.earlier(i, back), Some(packing.index(r, t - back)));
                }
                assert_eq!(packing.earlier(i, t + 1), None);
            }
        }
        // Scored positions are each row's predecessors of its masked tokens, as packed indices.
        let scored = packing.scored();
        assert_eq!(scored.positions.len(), 4 + 2 + 3);
        assert_eq!(scored.positions[0] as usize, packing.index(0, 20));
        assert_eq!(scored.targets[0], 101);
        // Queries see the prefix and their own tail: 20·21/2 for the prefix, then per tail.
        let tails: usize = [5usize, 3, 4].iter().map(|&l| l * 20 + l * (l + 1) / 2).sum();
        assert_eq!(packing.attention_pairs(), 210 + tails);
    }

    #[test]
    fn short_common_prefixes_and_unshared_layouts_keep_rows_whole() {
        let rows = [prompt_row(MIN_SHARED - 1, 100, 5), prompt_row(MIN_SHARED - 1, 200, 5)];
        let packing = Packing::new(&rows, true).unwrap();
        assert_eq!(packing.len(), packing.unshared_len());
        assert!(packing.segments().iter().all(|s| s.context.is_none()));
        let rows = [prompt_row(40, 100, 5), prompt_row(40, 200, 5)];
        assert_eq!(Packing::new(&rows, false).unwrap().len(), 90);
    }

    #[test]
    fn groups_are_chosen_to_save_the_most_tokens() {
        // Two apps (prompts of 30 and 50 tokens that agree on their first 20), one row alone.
        let app = |first: u32, len: usize, tail: u32| -> Encoded {
            let ids: Vec<u32> =
                (1..=20).chain((0..len as u32 - 20).map(|i| first + i)).chain([tail, tail + 1]).collect();
            row(&ids, len)
        };
        let rows = [app(500, 30, 7), app(600, 50, 8), app(500, 30, 9), app(600, 50, 10), row(&[9, 9, 9, 9], 2)];
        let packing = Packing::new(&rows, true).unwrap();
        // Sharing the 20 common tokens among all four would save 60; per app it saves 30 + 50.
        assert_eq!(packing.unshared_len() - packing.len(), 80);
        let contexts: Vec<Option<usize>> = (0..5).map(|r| packing.segments()[packing.row_segment(r)].context).collect();
        assert_eq!(contexts[0], contexts[2]);
        assert_eq!(contexts[1], contexts[3]);
        assert_ne!(contexts[0], contexts[1]);
        assert_eq!(contexts[4], None);
    }

    #[test]
    fn identical_rows_keep_one_token_of_their_own_and_padding_is_dropped() {
        let mut padded = prompt_row(30, 100, 2);
        padded.ids.extend([PAD_ID; 6]);
        padded.mask.extend([0.0; 6]);
        let rows = [prompt_row(30, 100, 2), padded];
        let packing = Packing::new(&rows, true).unwrap();
        assert_eq!((packing.row_len(0), packing.row_len(1)), (32, 32));
        assert_eq!(packing.len(), 31 + 1 + 1);
        assert_eq!(packing.scored().positions.len(), 2);
        assert!(matches!(Packing::new(&[], true), Err(ModelError::EmptyBatch)));
    }

    #[test]
    fn passes_keep_groups_together_and_pay_a_prefix_once_per_pass() {
        let rows: Vec<Encoded> =
            (0..6).map(|i| prompt_row(40, 100 * (i + 1), 10)).chain([row(&[5; 30], 1), row(&[6; 30], 1)]).collect();
        let (shared, unshared) = (Packing::new(&rows, true).unwrap(), Packing::new(&rows, false).unwrap());
        // The six rows share 40 tokens: 40 + 6·10 = 100 tokens, then two rows of 30.
        assert_eq!(shared.passes(1000), [vec![0, 1, 2, 3, 4, 5, 6, 7]]);
        assert_eq!(shared.passes(100), [vec![0, 1, 2, 3, 4, 5], vec![6, 7]]);
        assert_eq!(shared.passes(70), [vec![0, 1, 2], vec![3, 4, 5], vec![6, 7]]);
        // A budget below one row still gives each row a pass.
        assert_eq!(unshared.passes(10).len(), 8);
        // One family for the six rows, then one per lone row.
        let families = shared.families();
        assert_eq!(families.len(), 3);
        assert_eq!((families[0].prefix(), families[0].tails.len(), families[0].range.clone()), (Some(0), 6, 0..100));
        assert_eq!((families[1].prefix(), families[1].range.clone()), (None, 100..130));
    }
}
