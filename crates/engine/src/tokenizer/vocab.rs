//! The tokenizer's vocabulary and the settings it was trained with, validated as sentencepiece
//! validates them on load; and what each generation's vocabulary holds (its chat markers, how many
//! rows a tokenizer may fill).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use aho_corasick::{AhoCorasick, MatchKind};

use super::error::{PieceProblem, TokenizerError, VocabularyProblem};
use super::piece::{Piece, PieceKind, BOS_ID, EOS_ID, MAX_PIECES, MAX_PIECE_LEN, PAD_ID, UNK_ID};
use crate::generation::Generation;

/// The chat markers in id order from 4 (`needle/model/tokenizer.py`'s `CHAT_MARKERS`): Needle 2's
/// ten, then the six Needle 3 adds.
pub(crate) static CHAT_MARKERS: [&str; 16] = [
    "<|im_start|>",
    "<|im_end|>",
    "<think>",
    "</think>",
    "<tools>",
    "</tools>",
    "<tool_call>",
    "</tool_call>",
    "<tool_result>",
    "</tool_result>",
    "<context>",
    "</context>",
    "<extract>",
    "</extract>",
    "<schema>",
    "</schema>",
];

/// A generation's chat markers, which its `.cact` tokenizer blob types USER_DEFINED: Needle 2's ten,
/// all sixteen for Needle 3.
pub fn chat_markers(generation: Generation) -> &'static [&'static str] {
    match generation {
        Generation::Needle2 => &CHAT_MARKERS[..10],
        Generation::Needle3 => &CHAT_MARKERS,
    }
}

/// Which tokenizers fit a vocabulary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VocabFit {
    /// A row per piece (2.x).
    Exact,
    /// At most a row per piece: the vocabulary may hold rows past the tokenizer's pieces (3.x's
    /// code embeddings past the text slice).
    AtMost,
}

impl VocabFit {
    pub const fn of(generation: Generation) -> Self {
        match generation {
            Generation::Needle2 => VocabFit::Exact,
            Generation::Needle3 => VocabFit::AtMost,
        }
    }
}

/// Whether a tokenizer of `pieces` pieces serves a vocabulary of `vocab_size` rows.
pub fn fits(generation: Generation, pieces: usize, vocab_size: usize) -> bool {
    match VocabFit::of(generation) {
        VocabFit::Exact => pieces == vocab_size,
        VocabFit::AtMost => pieces <= vocab_size,
    }
}

/// How text is normalised before BPE; the SentencePiece `NormalizerSpec` switches needle's models may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Normalization {
    pub(super) add_dummy_prefix: bool,
    pub(super) remove_extra_whitespaces: bool,
}

/// A vocabulary plus the settings the model was trained with, validated as sentencepiece does on load.
#[derive(Debug, Clone)]
pub struct Tokenizer {
    pub(super) pieces: Vec<Piece>,
    /// NORMAL and USER_DEFINED pieces: the only results BPE may merge into (sentencepiece's `pieces_`).
    pub(super) mergeable: HashMap<String, u32>,
    /// CONTROL, UNKNOWN and BYTE pieces, looked up before `mergeable` (sentencepiece's `reserved_id_map_`).
    pub(super) reserved: HashMap<String, u32>,
    /// Every USER_DEFINED piece, matched leftmost-longest: sentencepiece's greedy longest-prefix scan
    /// in one pass over the text, whatever the number of pieces (a scan of every piece at every
    /// position would be quadratic).
    pub(super) user_defined: AhoCorasick,
    /// Id of the `<0xNN>` piece for every byte value, when byte fallback is on.
    pub(super) byte_ids: Option<Box<[u32; 256]>>,
    pub(super) normalization: Normalization,
    pub(super) unk_surface: String,
}

/// Where a checkpoint's tokenizer is looked for when none is given: `tokenizer.model` beside it, as the
/// reference keeps them.
pub fn default_path(checkpoint: &Path) -> PathBuf {
    checkpoint.with_file_name("tokenizer.model")
}

impl Tokenizer {
    pub fn vocab_size(&self) -> usize {
        self.pieces.len()
    }

    /// All pieces in id order.
    pub fn pieces(&self) -> &[Piece] {
        &self.pieces
    }

    pub fn add_dummy_prefix(&self) -> bool {
        self.normalization.add_dummy_prefix
    }

    pub fn byte_fallback(&self) -> bool {
        self.byte_ids.is_some()
    }

    pub fn remove_extra_whitespaces(&self) -> bool {
        self.normalization.remove_extra_whitespaces
    }

    /// Builds the lookup tables, refusing every vocabulary sentencepiece would refuse to load and those that
    /// break needle's fixed special ids. `origin` names the source in errors.
    pub(super) fn from_parts(
        origin: &str,
        pieces: Vec<Piece>,
        byte_fallback: bool,
        normalization: Normalization,
        unk_surface: String,
    ) -> Result<Self, TokenizerError> {
        let vocabulary_error = |problem| TokenizerError::Vocabulary { origin: origin.to_string(), problem };
        if pieces.len() <= UNK_ID as usize {
            return Err(vocabulary_error(VocabularyProblem::TooFewPieces(pieces.len())));
        }
        check_piece_count(origin, pieces.len())?;
        let mut mergeable = HashMap::new();
        let mut reserved = HashMap::new();
        let mut user_defined = Vec::new();
        let mut byte_ids = [None; 256];
        for (id, piece) in (0u32..).zip(&pieces) {
            let piece_error = |problem| TokenizerError::Piece { origin: origin.to_string(), id: id as usize, problem };
            check_piece(id, piece, byte_fallback).map_err(piece_error)?;
            if let Some(&first_id) = mergeable.get(&piece.text).or_else(|| reserved.get(&piece.text)) {
                let text = piece.text.clone();
                return Err(piece_error(PieceProblem::Duplicate { text, first_id: first_id as usize }));
            }
            let table = match piece.kind {
                PieceKind::Normal | PieceKind::UserDefined => &mut mergeable,
                PieceKind::Unknown | PieceKind::Control | PieceKind::Byte => &mut reserved,
            };
            table.insert(piece.text.clone(), id);
            match piece.kind {
                PieceKind::UserDefined => user_defined.push(piece.text.as_str()),
                PieceKind::Byte => byte_ids[usize::from(byte_value(&piece.text).map_err(piece_error)?)] = Some(id),
                PieceKind::Unknown if id != UNK_ID => {
                    return Err(vocabulary_error(VocabularyProblem::SecondUnknown(id as usize)))
                }
                _ => {}
            }
        }
        let user_defined = AhoCorasick::builder()
            .match_kind(MatchKind::LeftmostLongest)
            .build(user_defined)
            .map_err(|e| vocabulary_error(VocabularyProblem::UserDefinedTooLarge(e.to_string())))?;
        let byte_ids = if byte_fallback { Some(all_byte_ids(&byte_ids).map_err(vocabulary_error)?) } else { None };
        Ok(Self { pieces, mergeable, reserved, user_defined, byte_ids, normalization, unk_surface })
    }

    /// `text` cut as sentencepiece's normaliser and BPE both cut it: each USER_DEFINED piece by greedy
    /// longest match, every other character on its own; `true` marks a USER_DEFINED piece.
    ///
    /// A greedy scan that tries the longest piece at each position, else steps one character, finds
    /// exactly the leftmost-longest non-overlapping matches: pieces and text are UTF-8, so no piece
    /// can match from inside a character the scan steps over.
    pub(super) fn chunks<'t>(&'t self, text: &'t str) -> impl Iterator<Item = (&'t str, bool)> + 't {
        let mut matches = self.user_defined.find_iter(text).peekable();
        let mut at = 0;
        std::iter::from_fn(move || {
            let rest = text.get(at..).filter(|rest| !rest.is_empty())?;
            let piece = matches.next_if(|m| m.start() == at);
            let len = piece.map_or_else(|| rest.chars().next().map_or(rest.len(), char::len_utf8), |m| m.len());
            at += len;
            Some((&rest[..len], piece.is_some()))
        })
    }

    /// sentencepiece's `PieceToId`: reserved pieces first, then mergeable ones, else `<unk>`.
    pub(super) fn piece_to_id(&self, text: &str) -> u32 {
        self.reserved.get(text).or_else(|| self.mergeable.get(text)).copied().unwrap_or(UNK_ID)
    }

    pub(super) fn kind(&self, id: u32) -> Option<PieceKind> {
        self.pieces.get(id as usize).map(|p| p.kind)
    }
}

/// Refuses a piece count beyond [`MAX_PIECES`]; the readers call it with the count a file claims
/// before they read any piece.
pub(super) fn check_piece_count(origin: &str, count: usize) -> Result<(), TokenizerError> {
    if count > MAX_PIECES {
        let problem = VocabularyProblem::TooManyPieces(count);
        return Err(TokenizerError::Vocabulary { origin: origin.to_string(), problem });
    }
    Ok(())
}

/// The kind needle's fixed special ids must have.
pub(super) fn required_kind(id: u32) -> Option<(PieceKind, &'static str)> {
    match id {
        PAD_ID => Some((PieceKind::Control, "the CONTROL piece <pad> (PAD_ID 0)")),
        EOS_ID => Some((PieceKind::Control, "the CONTROL piece </s> (EOS_ID 1)")),
        BOS_ID => Some((PieceKind::Control, "the CONTROL piece <s> (BOS_ID 2)")),
        UNK_ID => Some((PieceKind::Unknown, "the UNKNOWN piece <unk> (UNK_ID 3)")),
        _ => None,
    }
}

pub(super) fn check_piece(id: u32, piece: &Piece, byte_fallback: bool) -> Result<(), PieceProblem> {
    if piece.text.is_empty() {
        return Err(PieceProblem::Empty);
    }
    if piece.text.len() > MAX_PIECE_LEN {
        return Err(PieceProblem::TooLong(piece.text.len()));
    }
    if piece.score.is_nan() {
        return Err(PieceProblem::NanScore);
    }
    if piece.kind == PieceKind::Byte && !byte_fallback {
        return Err(PieceProblem::ByteWithoutFallback(piece.text.clone()));
    }
    match required_kind(id) {
        Some((kind, expected)) if kind != piece.kind => {
            Err(PieceProblem::WrongSpecial { expected, found: piece.kind, text: piece.text.clone() })
        }
        _ => Ok(()),
    }
}

/// The byte a `<0xNN>` piece stands for (sentencepiece accepts exactly the `<0x%02X>` spellings).
pub(super) fn byte_value(text: &str) -> Result<u8, PieceProblem> {
    let bad = || PieceProblem::BadByteName(text.to_string());
    let hex = text.strip_prefix("<0x").and_then(|rest| rest.strip_suffix('>')).ok_or_else(bad)?;
    let is_canonical = hex.len() == 2 && hex.bytes().all(|b| b.is_ascii_digit() || (b'A'..=b'F').contains(&b));
    if !is_canonical {
        return Err(bad());
    }
    u8::from_str_radix(hex, 16).map_err(|_| bad())
}

pub(super) fn all_byte_ids(found: &[Option<u32>; 256]) -> Result<Box<[u32; 256]>, VocabularyProblem> {
    let mut ids = Box::new([0; 256]);
    for (byte, (id, found)) in (0u8..=255).zip(ids.iter_mut().zip(found)) {
        *id = found.ok_or(VocabularyProblem::MissingBytePiece(byte))?;
    }
    Ok(ids)
}
