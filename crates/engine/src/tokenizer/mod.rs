//! SentencePiece BPE tokenizer, bit-exact with `sentencepiece` 0.2.x (`sp.Encode` / `sp.Decode`).
//!
//! Two sources: a SentencePiece `tokenizer.model` ([`Tokenizer::load`]) and the RAW tokenizer blob stored in a
//! `.cact` ([`Tokenizer::from_cact_blob`]); [`Tokenizer::to_cact_blob`] writes the latter exactly as the
//! reference's `export._tokenizer_blob` does.
//!
//! Supported models are the ones needle trains: `model_type=bpe`, an identity normaliser (no precompiled
//! character map), whitespace escaped as `▁` and placed as a prefix, pad/eos/bos/unk at ids 0/1/2/3.
//! Everything else is refused at load time with an error saying what to retrain, so encoding never fails.
//! `split_by_whitespace` is accepted either way: sentencepiece only uses it while training, its BPE encoder
//! merges over the whole normalised text, and so does this one.

mod blob;
mod decode;
mod encode;
mod error;
mod proto;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use aho_corasick::{AhoCorasick, MatchKind};

use crate::generation::DummyPrefix;
use crate::generation::Generation;

pub(crate) use blob::write as write_cact_blob;
pub use blob::{piece_count as cact_blob_piece_count, stated_piece_count as cact_blob_stated_pieces};
pub use error::{BlobField, BlobProblem, PieceProblem, ProtoProblem, TokenizerError, VocabularyProblem};

pub const PAD_ID: u32 = 0;
pub const EOS_ID: u32 = 1;
pub const BOS_ID: u32 = 2;
pub const UNK_ID: u32 = 3;
/// `<|im_end|>`, the second chat marker: the end of a turn, where decoding stops.
pub const IM_END_ID: u32 = 5;

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

/// A generation's chat markers, which its `.cact` tokenizer blob types USER_DEFINED.
pub fn chat_markers(generation: Generation) -> &'static [&'static str] {
    generation.profile().chat.markers
}

/// What a piece is for; decides how it encodes and decodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PieceKind {
    /// Ordinary text, produced by BPE merges.
    Normal,
    /// `<unk>`: stands for text the vocabulary cannot spell.
    Unknown,
    /// `<pad>`, `<s>`, `</s>`: never produced by encoding, invisible when decoding.
    Control,
    /// Always one token, matched before any merge (the chat markers).
    UserDefined,
    /// `<0xNN>`: one raw UTF-8 byte, for byte fallback.
    Byte,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Piece {
    pub text: String,
    pub score: f32,
    pub kind: PieceKind,
}

/// How text is normalised before BPE; the SentencePiece `NormalizerSpec` switches needle's models may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Normalization {
    add_dummy_prefix: bool,
    remove_extra_whitespaces: bool,
}

/// The most pieces a tokenizer may have: far above any real vocabulary (Needle 2's has 8192), low
/// enough that a file claiming more is refused before its pieces are read, which bounds the memory
/// a hostile file can ask for.
pub const MAX_PIECES: usize = 1 << 20;

/// The longest piece text, in bytes: a `.cact` stores each piece's length as a u16.
pub const MAX_PIECE_LEN: usize = u16::MAX as usize;

/// sentencepiece's default `unk_surface`: what `sp.Decode` prints for `<unk>`.
const DEFAULT_UNK_SURFACE: &str = " \u{2047} ";

/// A vocabulary plus the settings the model was trained with, validated as sentencepiece does on load.
#[derive(Debug, Clone)]
pub struct Tokenizer {
    pieces: Vec<Piece>,
    /// NORMAL and USER_DEFINED pieces: the only results BPE may merge into (sentencepiece's `pieces_`).
    mergeable: HashMap<String, u32>,
    /// CONTROL, UNKNOWN and BYTE pieces, looked up before `mergeable` (sentencepiece's `reserved_id_map_`).
    reserved: HashMap<String, u32>,
    /// Every USER_DEFINED piece, matched leftmost-longest: sentencepiece's greedy longest-prefix scan
    /// in one pass over the text, whatever the number of pieces (a scan of every piece at every
    /// position would be quadratic).
    user_defined: AhoCorasick,
    /// Id of the `<0xNN>` piece for every byte value, when byte fallback is on.
    byte_ids: Option<Box<[u32; 256]>>,
    normalization: Normalization,
    unk_surface: String,
}

/// Where a checkpoint's tokenizer is looked for when none is given: `tokenizer.model` beside it, as the
/// reference keeps them.
pub fn default_path(checkpoint: &Path) -> PathBuf {
    checkpoint.with_file_name("tokenizer.model")
}

impl Tokenizer {
    /// Loads a SentencePiece `tokenizer.model` (protobuf).
    pub fn load(path: &Path) -> Result<Self, TokenizerError> {
        let bytes = std::fs::read(path).map_err(|source| TokenizerError::Read { path: path.to_path_buf(), source })?;
        proto::parse_model(path, &bytes)
    }

    /// Parses the RAW tokenizer blob stored inside a `.cact`. The blob carries no normaliser settings, so the
    /// result normalises like the reference's `RefTokenizer`: whitespace is kept (no removal of extra
    /// whitespace). One deliberate difference: when a blob has `byte_fallback = 0` (needle never writes one),
    /// a run of unknown characters becomes one `<unk>` as in sentencepiece, not one per character.
    pub fn from_cact_blob(blob: &[u8]) -> Result<Self, TokenizerError> {
        blob::parse(blob)
    }

    /// The RAW tokenizer blob exactly as `generation`'s `export._tokenizer_blob` writes it. Like the
    /// reference, the header always declares ids 0/1/2/3 and `byte_fallback = 1` whatever this model says,
    /// and only the generation's [`chat_markers`] are typed USER_DEFINED (other user-defined pieces become
    /// NORMAL). `add_dummy_prefix` is always 1 in Needle 2; Needle 3 states the model's own.
    pub fn to_cact_blob(&self, generation: Generation) -> Vec<u8> {
        let dummy_prefix = match generation.profile().chat.blob_dummy_prefix {
            DummyPrefix::Always => true,
            DummyPrefix::Model => self.add_dummy_prefix(),
        };
        blob::write(&self.pieces, chat_markers(generation), dummy_prefix)
    }

    /// Token ids for `text`, as `sp.Encode(text, out_type=int)`.
    pub fn encode(&self, text: &str) -> Vec<u32> {
        encode::encode(self, text)
    }

    /// Text for `ids`, as `sp.Decode(ids)`. Ids at or beyond [`Tokenizer::vocab_size`] are skipped (sentencepiece
    /// refuses the whole call): they can only come from a model head larger than the vocabulary, which export
    /// already rejects, and dropping them keeps a generation preview readable.
    pub fn decode(&self, ids: &[u32]) -> String {
        decode::decode(self, ids)
    }

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
    fn from_parts(
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
    fn chunks<'t>(&'t self, text: &'t str) -> impl Iterator<Item = (&'t str, bool)> + 't {
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
    fn piece_to_id(&self, text: &str) -> u32 {
        self.reserved.get(text).or_else(|| self.mergeable.get(text)).copied().unwrap_or(UNK_ID)
    }

    fn kind(&self, id: u32) -> Option<PieceKind> {
        self.pieces.get(id as usize).map(|p| p.kind)
    }
}

/// Refuses a piece count beyond [`MAX_PIECES`]; the readers call it with the count a file claims
/// before they read any piece.
fn check_piece_count(origin: &str, count: usize) -> Result<(), TokenizerError> {
    if count > MAX_PIECES {
        let problem = VocabularyProblem::TooManyPieces(count);
        return Err(TokenizerError::Vocabulary { origin: origin.to_string(), problem });
    }
    Ok(())
}

/// The kind needle's fixed special ids must have.
fn required_kind(id: u32) -> Option<(PieceKind, &'static str)> {
    match id {
        PAD_ID => Some((PieceKind::Control, "the CONTROL piece <pad> (PAD_ID 0)")),
        EOS_ID => Some((PieceKind::Control, "the CONTROL piece </s> (EOS_ID 1)")),
        BOS_ID => Some((PieceKind::Control, "the CONTROL piece <s> (BOS_ID 2)")),
        UNK_ID => Some((PieceKind::Unknown, "the UNKNOWN piece <unk> (UNK_ID 3)")),
        _ => None,
    }
}

fn check_piece(id: u32, piece: &Piece, byte_fallback: bool) -> Result<(), PieceProblem> {
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
fn byte_value(text: &str) -> Result<u8, PieceProblem> {
    let bad = || PieceProblem::BadByteName(text.to_string());
    let hex = text.strip_prefix("<0x").and_then(|rest| rest.strip_suffix('>')).ok_or_else(bad)?;
    let is_canonical = hex.len() == 2 && hex.bytes().all(|b| b.is_ascii_digit() || (b'A'..=b'F').contains(&b));
    if !is_canonical {
        return Err(bad());
    }
    u8::from_str_radix(hex, 16).map_err(|_| bad())
}

fn all_byte_ids(found: &[Option<u32>; 256]) -> Result<Box<[u32; 256]>, VocabularyProblem> {
    let mut ids = Box::new([0; 256]);
    for (byte, (id, found)) in (0u8..=255).zip(ids.iter_mut().zip(found)) {
        *id = found.ok_or(VocabularyProblem::MissingBytePiece(byte))?;
    }
    Ok(ids)
}
