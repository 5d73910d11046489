//! The RAW tokenizer blob of a `.cact` (layout in the docstring of needle's `model/export.py`), all
//! little-endian:
//! header `u32 n_pieces, u32 pad_id, u32 eos_id, u32 bos_id, u32 unk_id, u8 add_dummy_prefix,
//! u8 byte_fallback, u16 padding`, then per piece in id order `f32 score, u8 type, u16 surface_len` and
//! `surface_len` UTF-8 bytes.
use super::error::{BlobField, BlobProblem};
use super::{
    check_piece_count, Normalization, Piece, PieceKind, Tokenizer, TokenizerError, BOS_ID, DEFAULT_UNK_SURFACE, EOS_ID,
    PAD_ID, UNK_ID,
};

/// `struct.calcsize("<fBH")`: the fixed part of a piece record.
const RECORD_LEN: usize = 7;

/// The header: `n_pieces`, the four special ids, two flags and the padding.
const HEADER_LEN: usize = 24;

/// How errors name a blob: it has no file name of its own.
const ORIGIN: &str = "the .cact tokenizer blob";

const SPECIAL_IDS: [(&str, u32); 4] = [("pad_id", PAD_ID), ("eos_id", EOS_ID), ("bos_id", BOS_ID), ("unk_id", UNK_ID)];

fn kind_code(piece: &Piece, markers: &[&str]) -> u8 {
    match piece.kind {
        PieceKind::Control => 2,
        PieceKind::Unknown => 1,
        PieceKind::Byte => 4,
        // The reference types pieces USER_DEFINED by name, not by what the model says.
        _ if markers.contains(&piece.text.as_str()) => 3,
        _ => 0,
    }
}

fn kind_from_code(code: u8) -> Option<PieceKind> {
    match code {
        0 => Some(PieceKind::Normal),
        1 => Some(PieceKind::Unknown),
        2 => Some(PieceKind::Control),
        3 => Some(PieceKind::UserDefined),
        4 => Some(PieceKind::Byte),
        _ => None,
    }
}

/// `export._tokenizer_blob`. The piece count must fit a u32 and every piece text a u16 length (as
/// `Tokenizer::from_parts` guarantees of a tokenizer's pieces), so the narrowing casts below are exact.
pub(crate) fn write(pieces: &[Piece], markers: &[&str], dummy_prefix: bool) -> Vec<u8> {
    let size = HEADER_LEN + pieces.iter().map(|p| RECORD_LEN + p.text.len()).sum::<usize>();
    let mut out = Vec::with_capacity(size);
    out.extend_from_slice(&(pieces.len() as u32).to_le_bytes());
    for (_, id) in SPECIAL_IDS {
        out.extend_from_slice(&id.to_le_bytes());
    }
    out.extend_from_slice(&[u8::from(dummy_prefix), 1, 0, 0]);
    for piece in pieces {
        out.extend_from_slice(&piece.score.to_le_bytes());
        out.push(kind_code(piece, markers));
        out.extend_from_slice(&(piece.text.len() as u16).to_le_bytes());
        out.extend_from_slice(piece.text.as_bytes());
    }
    out
}

/// A cursor over the blob whose reads fail with the offset and what was expected there.
struct Reader<'a> {
    blob: &'a [u8],
    offset: usize,
}

impl<'a> Reader<'a> {
    fn remaining(&self) -> usize {
        self.blob.len() - self.offset
    }

    fn take<const N: usize>(&mut self, what: BlobField) -> Result<[u8; N], TokenizerError> {
        let bytes = self.take_slice(N, what)?;
        let mut array = [0; N];
        array.copy_from_slice(bytes);
        Ok(array)
    }

    fn take_slice(&mut self, len: usize, what: BlobField) -> Result<&'a [u8], TokenizerError> {
        let bytes = self.blob.get(self.offset..).and_then(|rest| rest.get(..len)).ok_or_else(|| {
            let problem = BlobProblem::Truncated { what, needed: len, available: self.remaining() };
            TokenizerError::Blob { offset: self.offset, problem }
        })?;
        self.offset += len;
        Ok(bytes)
    }

    fn u32(&mut self, what: BlobField) -> Result<u32, TokenizerError> {
        self.take(what).map(u32::from_le_bytes)
    }

    fn flag(&mut self, field: &'static str) -> Result<bool, TokenizerError> {
        let offset = self.offset;
        match self.take::<1>(BlobField::Header(field))? {
            [0] => Ok(false),
            [1] => Ok(true),
            [found] => Err(TokenizerError::Blob { offset, problem: BlobProblem::BadFlag { field, found } }),
        }
    }
}

pub(super) fn parse(blob: &[u8]) -> Result<Tokenizer, TokenizerError> {
    let mut reader = Reader { blob, offset: 0 };
    let count = reader.u32(BlobField::Header("n_pieces"))?;
    for (field, expected) in SPECIAL_IDS {
        let offset = reader.offset;
        let found = reader.u32(BlobField::Header(field))?;
        if found != expected {
            return Err(TokenizerError::Blob { offset, problem: BlobProblem::SpecialId { field, found, expected } });
        }
    }
    let add_dummy_prefix = reader.flag("add_dummy_prefix")?;
    let byte_fallback = reader.flag("byte_fallback")?;
    reader.take::<2>(BlobField::Header("padding"))?;
    let pieces = read_pieces(&mut reader, count)?;
    // The blob has no whitespace setting; the reference's RefTokenizer keeps all whitespace.
    let normalization = Normalization { add_dummy_prefix, remove_extra_whitespaces: false };
    Tokenizer::from_parts(ORIGIN, pieces, byte_fallback, normalization, DEFAULT_UNK_SURFACE.to_string())
}

/// The piece count of a blob whose every record reads cleanly to its end, without judging the header's
/// ids and flags or the vocabulary: the layout a runtime walks (what `needle inspect --verify` checks).
pub fn piece_count(blob: &[u8]) -> Result<usize, TokenizerError> {
    let mut reader = Reader { blob, offset: 0 };
    let count = stated_count(&mut reader)?;
    read_pieces(&mut reader, count).map(|pieces| pieces.len())
}

/// The piece count a blob's header states; the header must be whole, the records are not read
/// (what a build checks against the model's vocabulary, and `needle inspect` shows).
pub fn stated_piece_count(blob: &[u8]) -> Result<u32, TokenizerError> {
    stated_count(&mut Reader { blob, offset: 0 })
}

/// Reads the whole header, returning its piece count, without judging its ids and flags.
fn stated_count(reader: &mut Reader) -> Result<u32, TokenizerError> {
    let count = reader.u32(BlobField::Header("n_pieces"))?;
    reader.take::<{ HEADER_LEN - 4 }>(BlobField::Header("ids, flags and padding"))?;
    Ok(count)
}

/// `count` piece records, which must end the blob. The count comes from the file: it is held to the
/// budget, and no more records are reserved than the remaining bytes could hold.
fn read_pieces(reader: &mut Reader, count: u32) -> Result<Vec<Piece>, TokenizerError> {
    let count = usize::try_from(count).unwrap_or(usize::MAX);
    check_piece_count(ORIGIN, count)?;
    let mut pieces = Vec::with_capacity(count.min(reader.remaining() / RECORD_LEN));
    for id in 0..count {
        pieces.push(read_piece(reader, id)?);
    }
    if reader.remaining() > 0 {
        let problem = BlobProblem::TrailingBytes(reader.remaining());
        return Err(TokenizerError::Blob { offset: reader.offset, problem });
    }
    Ok(pieces)
}

fn read_piece(reader: &mut Reader, id: usize) -> Result<Piece, TokenizerError> {
    let score = f32::from_le_bytes(reader.take(BlobField::Piece { id, part: "score" })?);
    let kind_offset = reader.offset;
    let [code] = reader.take(BlobField::Piece { id, part: "type" })?;
    let kind = kind_from_code(code)
        .ok_or(TokenizerError::Blob { offset: kind_offset, problem: BlobProblem::BadKind { id, code } })?;
    let len = u16::from_le_bytes(reader.take(BlobField::Piece { id, part: "surface length" })?);
    let surface_offset = reader.offset;
    let surface = reader.take_slice(usize::from(len), BlobField::Piece { id, part: "surface" })?;
    let text = std::str::from_utf8(surface).map_err(|source| TokenizerError::Blob {
        offset: surface_offset + source.valid_up_to(),
        problem: BlobProblem::BadUtf8 { id, source },
    })?;
    Ok(Piece { text: text.to_string(), score, kind })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generation::Generation;
    use crate::tokenizer::{PieceProblem, VocabularyProblem};

    const BASE_BLOB: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/tokenizer/variants/base.blob");

    fn base_blob() -> Vec<u8> {
        std::fs::read(BASE_BLOB).expect("variants/base.blob is committed")
    }

    /// Offset of piece 0's record: right after the 24-byte header.
    const FIRST_RECORD: usize = 24;

    fn blob_problem(blob: &[u8]) -> (usize, BlobProblem) {
        match parse(blob) {
            Err(TokenizerError::Blob { offset, problem }) => (offset, problem),
            other => panic!("expected a blob error, got {other:?}"),
        }
    }

    #[test]
    fn base_blob_round_trips() {
        let blob = base_blob();
        assert_eq!(parse(&blob).expect("base blob parses").to_cact_blob(Generation::Needle2), blob);
    }

    #[test]
    fn every_truncation_is_reported_at_its_offset() {
        let blob = base_blob();
        for len in 0..blob.len() {
            let (offset, problem) = blob_problem(&blob[..len]);
            assert!(offset <= len, "offset {offset} beyond the {len} bytes given");
            assert!(matches!(problem, BlobProblem::Truncated { .. }), "length {len}: {problem}");
        }
    }

    #[test]
    fn a_piece_count_past_the_budget_is_refused_before_any_piece_is_read() {
        let mut blob = base_blob();
        blob[..4].copy_from_slice(&u32::MAX.to_le_bytes());
        match parse(&blob) {
            Err(TokenizerError::Vocabulary { origin, problem: VocabularyProblem::TooManyPieces(n) }) => {
                assert_eq!((origin.as_str(), n), (ORIGIN, u32::MAX as usize))
            }
            other => panic!("expected the piece budget, got {other:?}"),
        }
        assert!(matches!(piece_count(&blob), Err(TokenizerError::Vocabulary { .. })));
    }

    #[test]
    fn a_count_within_budget_but_past_the_bytes_is_a_truncation() {
        let mut blob = base_blob();
        blob[..4].copy_from_slice(&401u32.to_le_bytes());
        let (offset, problem) = blob_problem(&blob);
        assert_eq!(offset, blob.len());
        assert!(matches!(problem, BlobProblem::Truncated { what: BlobField::Piece { id: 400, .. }, .. }), "{problem}");
    }

    #[test]
    fn the_layout_walk_counts_pieces_without_judging_the_vocabulary() {
        let blob = base_blob();
        assert_eq!(piece_count(&blob).unwrap(), 400);
        let mut odd_ids = blob.clone();
        odd_ids[4] = 7;
        assert_eq!(piece_count(&odd_ids).unwrap(), 400, "pad_id is the runtime's business, not the layout's");
        assert!(matches!(piece_count(&blob[..blob.len() - 1]), Err(TokenizerError::Blob { .. })));
    }

    #[test]
    fn corrupt_fields_are_reported_at_their_offset() {
        let corrupt = |offset: usize, byte: u8| {
            let mut blob = base_blob();
            blob[offset] = byte;
            blob_problem(&blob)
        };
        assert_eq!(corrupt(4, 7), (4, BlobProblem::SpecialId { field: "pad_id", found: 7, expected: PAD_ID }));
        assert_eq!(corrupt(16, 0), (16, BlobProblem::SpecialId { field: "unk_id", found: 0, expected: UNK_ID }));
        assert_eq!(corrupt(21, 2), (21, BlobProblem::BadFlag { field: "byte_fallback", found: 2 }));
        assert_eq!(corrupt(FIRST_RECORD + 4, 9), (FIRST_RECORD + 4, BlobProblem::BadKind { id: 0, code: 9 }));
        let surface = FIRST_RECORD + RECORD_LEN;
        let (offset, problem) = corrupt(surface + 1, 0xFF);
        assert!(offset == surface + 1 && matches!(problem, BlobProblem::BadUtf8 { id: 0, .. }), "{problem}");
        let mut blob = base_blob();
        blob.push(0);
        assert_eq!(blob_problem(&blob), (blob.len() - 1, BlobProblem::TrailingBytes(1)));
    }

    #[test]
    fn blob_vocabulary_is_validated_like_a_model() {
        // Piece 0 is "<pad>" and piece 1 "</s>": renaming piece 0 makes piece 1 a duplicate.
        let mut pieces = parse(&base_blob()).expect("base blob parses").pieces().to_vec();
        pieces[0].text = "</s>".into();
        match parse(&write(&pieces, &[], true)) {
            Err(TokenizerError::Piece { origin, id: 1, problem: PieceProblem::Duplicate { first_id: 0, .. } }) => {
                assert_eq!(origin, ORIGIN)
            }
            other => panic!("expected a duplicate-piece error, got {other:?}"),
        }
    }
}
