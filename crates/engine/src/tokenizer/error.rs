//! Everything that can be wrong with a tokenizer file, each naming the file, the place and the fix.
use std::path::PathBuf;

use super::{PieceKind, MAX_PIECES};

/// Fix advice for vocabulary problems: the settings needle's tokenizer is trained with (a `.cact` blob
/// inherits its vocabulary from such a model, so the same fix applies before re-exporting).
const RETRAIN: &str = "retrain the tokenizer with spm_train --model_type=bpe --pad_id=0 --eos_id=1 --bos_id=2 \
                       --unk_id=3 --normalization_rule_name=identity (see tests/fixtures/make_fixtures.py), and \
                       re-export any .cact built from it";

#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("cannot read tokenizer model {}: {source}; check that the path names an existing, readable \
             tokenizer.model", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("{} is not a SentencePiece model (protobuf decoding failed: {source}); pass the tokenizer.model \
             written by spm_train, not the .vocab or another file", path.display())]
    NotAModel {
        path: PathBuf,
        #[source]
        source: prost::DecodeError,
    },

    #[error("{}, byte offset {offset}: {problem}; pass the tokenizer.model written by spm_train, copied whole",
             path.display())]
    Malformed { path: PathBuf, offset: usize, problem: ProtoProblem },

    #[error("{}: {setting} is {found}, but only {supported} is supported; {RETRAIN}", path.display())]
    Unsupported { path: PathBuf, setting: &'static str, found: String, supported: &'static str },

    #[error("{origin}: piece id {id}: {problem}; {RETRAIN}")]
    Piece { origin: String, id: usize, problem: PieceProblem },

    #[error("{origin}: {problem}; {RETRAIN}")]
    Vocabulary { origin: String, problem: VocabularyProblem },

    #[error(
        "tokenizer blob, byte offset {offset}: {problem}; re-export the .cact (needle build) or pass the \
         blob exactly as stored in the .cact's RAW tokenizer tensor"
    )]
    Blob { offset: usize, problem: BlobProblem },
}

/// What is wrong with one piece of the vocabulary.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PieceProblem {
    #[error("the piece text is empty")]
    Empty,
    #[error("the piece text is not UTF-8 ({0})")]
    BadUtf8(std::str::Utf8Error),
    #[error("the piece text is {0} bytes long; a .cact stores at most 65535")]
    TooLong(usize),
    #[error("the score is NaN, so merges cannot be ranked")]
    NanScore,
    #[error("{text:?} is already piece id {first_id}")]
    Duplicate { text: String, first_id: usize },
    #[error(
        "piece type {0} is not supported (NORMAL=1, UNKNOWN=2, CONTROL=3, USER_DEFINED=4 and BYTE=6 are; \
         UNUSED=5 is not)"
    )]
    UnsupportedType(i32),
    #[error("byte piece {0:?} is not of the form <0xNN> (two upper-case hex digits)")]
    BadByteName(String),
    #[error("byte piece {0:?} is present although byte_fallback is off")]
    ByteWithoutFallback(String),
    #[error("needle needs {expected} here, but the piece is {found:?} {text:?}")]
    WrongSpecial { expected: &'static str, found: PieceKind, text: String },
}

/// What is wrong with the vocabulary as a whole.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum VocabularyProblem {
    #[error("it has {0} pieces, fewer than the 4 special ids needle needs (pad 0, eos 1, bos 2, unk 3)")]
    TooFewPieces(usize),
    #[error("it has {0} pieces, more than the {MAX_PIECES} a tokenizer may have")]
    TooManyPieces(usize),
    #[error("byte_fallback is on but there is no byte piece <0x{0:02X}> (all 256 are required)")]
    MissingBytePiece(u8),
    #[error("piece id {0} is a second UNKNOWN piece; only id 3 may be")]
    SecondUnknown(usize),
    #[error("its USER_DEFINED pieces are too many or too long to match ({0})")]
    UserDefinedTooLarge(String),
}

/// What is wrong at one offset of a `tokenizer.model`'s protobuf encoding.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ProtoProblem {
    #[error(
        "the {what} ends past the end of the file ({needed} bytes needed, {available} left): the file is truncated"
    )]
    Truncated { what: String, needed: u64, available: usize },
    #[error("the {what} is not a valid varint")]
    BadVarint { what: String },
    #[error("field {field} has wire type {wire}, which no SentencePiece model uses")]
    WireType { field: u64, wire: u64 },
}

/// What is wrong at one offset of a `.cact` tokenizer blob.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BlobProblem {
    #[error("expected {what} ({needed} bytes) but only {available} bytes remain")]
    Truncated { what: BlobField, needed: usize, available: usize },
    #[error("header field {field} is {found}, but needle's fixed id is {expected}")]
    SpecialId { field: &'static str, found: u32, expected: u32 },
    #[error("header flag {field} is {found}; it must be 0 or 1")]
    BadFlag { field: &'static str, found: u8 },
    #[error("piece id {id} has type code {code}; codes are 0 NORMAL, 1 UNKNOWN, 2 CONTROL, 3 USER_DEFINED, 4 BYTE")]
    BadKind { id: usize, code: u8 },
    #[error("piece id {id}: the surface is not UTF-8 ({source})")]
    BadUtf8 { id: usize, source: std::str::Utf8Error },
    #[error("{0} bytes follow the last piece")]
    TrailingBytes(usize),
}

/// A field of the blob, for truncation errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlobField {
    Header(&'static str),
    Piece { id: usize, part: &'static str },
}

impl std::fmt::Display for BlobField {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Header(field) => write!(f, "header field {field}"),
            Self::Piece { id, part } => write!(f, "piece {id}'s {part}"),
        }
    }
}
