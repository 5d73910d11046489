//! `sp.Encode` for BPE models: identity normalisation, then sentencepiece's merge loop.
use std::cmp::Ordering;
use std::collections::BinaryHeap;

use super::{PieceKind, Tokenizer};

/// U+2581 LOWER ONE EIGHTH BLOCK: how sentencepiece spells a space inside pieces.
pub(super) const SPACE_SYMBOL: &str = "\u{2581}";

pub(super) fn encode(tok: &Tokenizer, text: &str) -> Vec<u32> {
    // Positions are u32, which keeps the merge at about 45 bytes per character of a huge input;
    // a text whose normalised form could pass 4 GiB (a space becomes three bytes) is encoded in
    // parts, each cut at a character boundary.
    if text.len() > MAX_PART {
        let mut cut = MAX_PART;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        let mut ids = encode(tok, &text[..cut]);
        ids.extend(encode(tok, &text[cut..]));
        return ids;
    }
    let normalized = normalize(tok, text);
    let symbols = merge(tok, &normalized);
    symbol_ids(tok, &normalized, &symbols)
}

/// The longest text encoded in one part: its normalised form stays under `u32::MAX` bytes.
const MAX_PART: usize = (u32::MAX as usize - SPACE_SYMBOL.len()) / 3;

/// sentencepiece's `Normalizer::Normalize` without a character map: optional removal of leading, trailing
/// and repeated spaces, the dummy-prefix `▁`, and every remaining space spelled `▁`. Only U+0020 counts as
/// whitespace; tabs and newlines pass through. The text is consumed in [`Tokenizer::chunks`], so a
/// USER_DEFINED piece's own spaces are never collapsed.
fn normalize(tok: &Tokenizer, text: &str) -> String {
    let remove_extra = tok.normalization.remove_extra_whitespaces;
    let mut chunks = tok.chunks(text).peekable();
    while remove_extra && chunks.next_if(|&(chunk, _)| chunk == " ").is_some() {}
    if chunks.peek().is_none() {
        return String::new();
    }
    let mut out = String::with_capacity(3 * text.len() + SPACE_SYMBOL.len());
    if tok.normalization.add_dummy_prefix {
        out.push_str(SPACE_SYMBOL);
    }
    let mut is_prev_space = remove_extra;
    for (chunk, _) in chunks {
        let kept = if is_prev_space { chunk.trim_start_matches(' ') } else { chunk };
        if !kept.is_empty() {
            for c in kept.chars() {
                match c {
                    ' ' => out.push_str(SPACE_SYMBOL),
                    _ => out.push(c),
                }
            }
            is_prev_space = remove_extra && kept.ends_with(' ');
        }
    }
    if remove_extra {
        while let Some(trimmed) = out.strip_suffix(SPACE_SYMBOL) {
            out.truncate(trimmed.len());
        }
    }
    out
}

/// A span of the normalised text in a doubly linked list; `len == 0` once merged into its left neighbour.
struct Symbol {
    start: u32,
    len: u32,
    prev: Option<u32>,
    next: Option<u32>,
    /// USER_DEFINED pieces never take part in merges.
    frozen: bool,
}

/// A merge of two adjacent symbols that was possible when queued; stale once either side changed length.
struct Candidate {
    score: f32,
    left: u32,
    right: u32,
    len: u32,
}

/// Highest score first, ties to the leftmost pair: sentencepiece's `SymbolPairComparator`. Scores are never
/// NaN (refused on load); comparing with `partial_cmp` keeps -0.0 == 0.0 as C++ `<` does.
impl Ord for Candidate {
    fn cmp(&self, other: &Self) -> Ordering {
        let by_score = self.score.partial_cmp(&other.score).unwrap_or(Ordering::Equal);
        by_score.then_with(|| other.left.cmp(&self.left))
    }
}

impl PartialOrd for Candidate {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Candidate {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Candidate {}

/// One symbol per character, or per USER_DEFINED piece starting there.
fn initial_symbols(tok: &Tokenizer, normalized: &str) -> Vec<Symbol> {
    let mut symbols: Vec<Symbol> = Vec::new();
    let mut start = 0;
    // `encode` keeps the text under u32::MAX bytes, and there are at most as many symbols.
    let at = |n: usize| n as u32;
    for (chunk, user_defined) in tok.chunks(normalized) {
        let (index, len) = (symbols.len(), chunk.len());
        symbols.push(Symbol {
            start: at(start),
            len: at(len),
            prev: index.checked_sub(1).map(at),
            next: (start + len < normalized.len()).then_some(at(index + 1)),
            frozen: user_defined,
        });
        start += len;
    }
    symbols
}

/// Queues the merge of `left` with its right neighbour `right` if the vocabulary has the joined piece.
fn push_candidate(
    tok: &Tokenizer,
    normalized: &str,
    symbols: &[Symbol],
    agenda: &mut BinaryHeap<Candidate>,
    left: u32,
    right: u32,
) {
    let (l, r) = (&symbols[left as usize], &symbols[right as usize]);
    if l.frozen || r.frozen {
        return;
    }
    let len = l.len + r.len;
    if let Some(&id) = tok.mergeable.get(span(normalized, l.start, len)) {
        agenda.push(Candidate { score: tok.pieces[id as usize].score, left, right, len });
    }
}

/// sentencepiece's BPE loop: repeatedly merge the best adjacent pair. A heap of candidates with lazy
/// invalidation keeps it O(n log n) on long inputs.
fn merge(tok: &Tokenizer, normalized: &str) -> Vec<Symbol> {
    let mut symbols = initial_symbols(tok, normalized);
    let mut agenda = BinaryHeap::new();
    for right in 1..symbols.len() as u32 {
        push_candidate(tok, normalized, &symbols, &mut agenda, right - 1, right);
    }
    while let Some(top) = agenda.pop() {
        let (left, right) = (top.left as usize, top.right as usize);
        let (l, r) = (&symbols[left], &symbols[right]);
        if l.len == 0 || r.len == 0 || l.len + r.len != top.len {
            continue;
        }
        let next = r.next;
        symbols[left].len = top.len;
        symbols[left].next = next;
        symbols[right].len = 0;
        if let Some(next) = next {
            symbols[next as usize].prev = Some(top.left);
            push_candidate(tok, normalized, &symbols, &mut agenda, top.left, next);
        }
        if let Some(prev) = symbols[left].prev {
            push_candidate(tok, normalized, &symbols, &mut agenda, prev, top.left);
        }
    }
    symbols
}

/// The `len` bytes of `text` from `start`.
fn span(text: &str, start: u32, len: u32) -> &str {
    let start = start as usize;
    &text[start..start + len as usize]
}

/// Ids of the surviving symbols in order. Symbols the vocabulary lacks become their UTF-8 bytes when byte
/// fallback is on; otherwise each run of them becomes a single `<unk>` (sentencepiece folds unknown runs).
fn symbol_ids(tok: &Tokenizer, normalized: &str, symbols: &[Symbol]) -> Vec<u32> {
    let mut ids = Vec::with_capacity(symbols.len());
    let mut prev_unknown = false;
    let mut cursor = (!symbols.is_empty()).then_some(0);
    while let Some(index) = cursor {
        let symbol = &symbols[index as usize];
        let text = span(normalized, symbol.start, symbol.len);
        let id = tok.piece_to_id(text);
        let unknown = tok.kind(id) == Some(PieceKind::Unknown);
        match (&tok.byte_ids, unknown) {
            (Some(byte_ids), true) => ids.extend(text.bytes().map(|b| byte_ids[usize::from(b)])),
            (None, true) if prev_unknown => {}
            _ => ids.push(id),
        }
        prev_unknown = unknown;
        cursor = symbol.next;
    }
    ids
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::time::{Duration, Instant};

    use super::*;
    use crate::tokenizer::Piece;

    const BASE_MODEL: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/tokenizer/variants/base.model");

    /// The fixture's base model with `extra` appended as USER_DEFINED pieces.
    fn with_user_pieces(extra: impl IntoIterator<Item = String>) -> Tokenizer {
        let base = Tokenizer::load(Path::new(BASE_MODEL)).expect("variants/base.model loads");
        let mut pieces = base.pieces().to_vec();
        pieces.extend(extra.into_iter().map(|text| Piece { text, score: 0.0, kind: PieceKind::UserDefined }));
        Tokenizer::from_parts("test", pieces, base.byte_fallback(), base.normalization, base.unk_surface)
            .expect("extra user-defined pieces are a valid vocabulary")
    }

    /// sentencepiece's scan, spelled out: at each position the longest piece that starts there, else one
    /// character.
    fn greedy_scan<'t>(pieces: &[&str], text: &'t str) -> Vec<(&'t str, bool)> {
        let mut out = Vec::new();
        let mut rest = text;
        while let Some(c) = rest.chars().next() {
            let longest = pieces.iter().filter(|p| rest.starts_with(**p)).map(|p| p.len()).max();
            let len = longest.unwrap_or(c.len_utf8());
            out.push((&rest[..len], longest.is_some()));
            rest = &rest[len..];
        }
        out
    }

    #[test]
    fn chunks_are_the_greedy_longest_prefix_scan() {
        // Letters the fixture's English vocabulary lacks, so the pieces are new; prefixes of each other,
        // overlapping, and multi-byte.
        let pieces = ["жз", "жзи", "зий", "з", "<ж>", "ё", "ёж", "▁▁ж"];
        let tok = with_user_pieces(pieces.iter().map(|p| p.to_string()));
        for text in ["жзий", "жззийё", "aжзижзий<ж>>", "ёёжё", "▁▁▁ж з", "", "ж", "<ж<ж>", "зийжзи"]
        {
            assert_eq!(tok.chunks(text).collect::<Vec<_>>(), greedy_scan(&pieces, text), "{text:?}");
        }
    }

    #[test]
    fn fifty_thousand_user_pieces_encode_long_text_in_linear_time() {
        // The pieces share their first three bytes, so a per-position scan of the pieces that start with
        // the text's next byte (the old bucket-by-first-byte match) tried all 50 000 at each of the text's
        // 100 000 `▁` positions: 5·10⁹ comparisons, minutes. One automaton pass is milliseconds.
        let tok = with_user_pieces((0..50_000).map(|i| format!("▁~{i:05}")));
        let text = " ~".repeat(100_000);
        let started = Instant::now();
        let ids = tok.encode(&text);
        let elapsed = started.elapsed();
        assert!(ids.len() >= 100_000, "every `▁~` pair is at least one token");
        assert!(elapsed < Duration::from_secs(10), "encoding took {elapsed:?}");
        let id = |text: &str| tok.piece_to_id(text);
        assert_eq!(tok.encode(" ~00042 x")[1..2], [id("▁~00042")], "a user piece is one token");
        assert_eq!(tok.encode(" ~49999"), [id("▁"), id("▁~49999")]);
    }
}
