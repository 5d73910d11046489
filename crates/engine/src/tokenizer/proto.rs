//! The parts of SentencePiece's `ModelProto` (sentencepiece_model.proto, proto2) that decide how a BPE model
//! encodes, declared by hand for prost; every other field is skipped while decoding.
//!
//! Before prost decodes anything, one pass over the top-level fields checks that each lies within the file
//! and counts the pieces against [`MAX_PIECES`](super::MAX_PIECES): a truncated file is reported at the
//! offset of the field it cuts, and a file claiming too many pieces is refused before any is allocated.
//! Decoding then costs a small multiple of the file: each piece is its own bytes plus a fixed overhead.
use std::path::Path;

use prost::Message;

use super::{
    check_piece_count, Normalization, Piece, PieceKind, PieceProblem, ProtoProblem, Tokenizer, TokenizerError,
    DEFAULT_UNK_SURFACE,
};

/// `ModelProto.pieces`.
const PIECES_FIELD: u64 = 1;

#[derive(Clone, PartialEq, Message)]
pub(super) struct ModelProto {
    #[prost(message, repeated, tag = "1")]
    pub pieces: Vec<SentencePiece>,
    #[prost(message, optional, tag = "2")]
    pub trainer_spec: Option<TrainerSpec>,
    #[prost(message, optional, tag = "3")]
    pub normalizer_spec: Option<NormalizerSpec>,
    #[prost(message, optional, tag = "5")]
    pub denormalizer_spec: Option<NormalizerSpec>,
}

#[derive(Clone, PartialEq, Message)]
pub(super) struct SentencePiece {
    /// Bytes, not `string`, so that bad UTF-8 is reported with the piece id instead of as a decode failure.
    #[prost(bytes = "vec", optional, tag = "1")]
    pub piece: Option<Vec<u8>>,
    #[prost(float, optional, tag = "2", default = "0")]
    pub score: Option<f32>,
    /// NORMAL=1 UNKNOWN=2 CONTROL=3 USER_DEFINED=4 UNUSED=5 BYTE=6.
    #[prost(int32, optional, tag = "3", default = "1")]
    pub r#type: Option<i32>,
}

#[derive(Clone, PartialEq, Message)]
pub(super) struct TrainerSpec {
    /// UNIGRAM=1 BPE=2 WORD=3 CHAR=4.
    #[prost(int32, optional, tag = "3", default = "1")]
    pub model_type: Option<i32>,
    #[prost(bool, optional, tag = "24", default = "false")]
    pub treat_whitespace_as_suffix: Option<bool>,
    #[prost(bool, optional, tag = "35", default = "false")]
    pub byte_fallback: Option<bool>,
    #[prost(string, optional, tag = "44")]
    pub unk_surface: Option<String>,
}

#[derive(Clone, PartialEq, Message)]
pub(super) struct NormalizerSpec {
    #[prost(string, optional, tag = "1")]
    pub name: Option<String>,
    #[prost(bytes = "vec", optional, tag = "2")]
    pub precompiled_charsmap: Option<Vec<u8>>,
    #[prost(bool, optional, tag = "3", default = "true")]
    pub add_dummy_prefix: Option<bool>,
    #[prost(bool, optional, tag = "4", default = "true")]
    pub remove_extra_whitespaces: Option<bool>,
    #[prost(bool, optional, tag = "5", default = "true")]
    pub escape_whitespaces: Option<bool>,
}

const BPE: i32 = 2;

fn model_type_name(code: i32) -> String {
    match code {
        1 => "UNIGRAM".to_string(),
        2 => "BPE".to_string(),
        3 => "WORD".to_string(),
        4 => "CHAR".to_string(),
        _ => format!("unknown type {code}"),
    }
}

fn piece_kind(code: i32) -> Option<PieceKind> {
    match code {
        1 => Some(PieceKind::Normal),
        2 => Some(PieceKind::Unknown),
        3 => Some(PieceKind::Control),
        4 => Some(PieceKind::UserDefined),
        6 => Some(PieceKind::Byte),
        _ => None,
    }
}

pub(super) fn parse_model(path: &Path, bytes: &[u8]) -> Result<Tokenizer, TokenizerError> {
    let origin = path.display().to_string();
    check_piece_count(&origin, count_pieces(path, bytes)?)?;
    let model =
        ModelProto::decode(bytes).map_err(|source| TokenizerError::NotAModel { path: path.to_path_buf(), source })?;
    let trainer = model.trainer_spec.unwrap_or_default();
    let normalizer = model.normalizer_spec.unwrap_or_default();
    check_supported(path, &trainer, &normalizer, model.denormalizer_spec.as_ref())?;
    let pieces = model
        .pieces
        .into_iter()
        .enumerate()
        .map(|(id, piece)| {
            convert_piece(piece).map_err(|problem| TokenizerError::Piece { origin: origin.clone(), id, problem })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let normalization = Normalization {
        add_dummy_prefix: normalizer.add_dummy_prefix(),
        remove_extra_whitespaces: normalizer.remove_extra_whitespaces(),
    };
    let byte_fallback = trainer.byte_fallback();
    let unk_surface = trainer.unk_surface.unwrap_or_else(|| DEFAULT_UNK_SURFACE.to_string());
    Tokenizer::from_parts(&origin, pieces, byte_fallback, normalization, unk_surface)
}

/// The decoded piece's bytes become its text without a copy.
fn convert_piece(piece: SentencePiece) -> Result<Piece, PieceProblem> {
    let (score, code) = (piece.score(), piece.r#type());
    let text = String::from_utf8(piece.piece.unwrap_or_default()).map_err(|e| PieceProblem::BadUtf8(e.utf8_error()))?;
    let kind = piece_kind(code).ok_or(PieceProblem::UnsupportedType(code))?;
    Ok(Piece { text, score, kind })
}

/// Walks the top-level fields without decoding them and returns how many pieces the file holds; each
/// field's extent is checked against the file, so a cut file is reported at the field it cuts.
fn count_pieces(path: &Path, bytes: &[u8]) -> Result<usize, TokenizerError> {
    let malformed = |offset, problem| TokenizerError::Malformed { path: path.to_path_buf(), offset, problem };
    let (mut at, mut pieces) = (0, 0);
    while at < bytes.len() {
        let start = at;
        let key = read_varint(bytes, &mut at, || "field key".into()).map_err(|problem| malformed(start, problem))?;
        let (field, wire) = (key >> 3, key & 7);
        let what = || match field {
            PIECES_FIELD => format!("record of piece {pieces}"),
            other => format!("field {other}"),
        };
        // Wire types 0 (varint), 1 (8 bytes), 2 (length-delimited) and 5 (4 bytes); groups are
        // deprecated and no SentencePiece model has one.
        let len = match wire {
            0 => read_varint(bytes, &mut at, what).map(|_| 0),
            1 => Ok(8),
            2 => read_varint(bytes, &mut at, || format!("length of the {}", what())),
            5 => Ok(4),
            _ => Err(ProtoProblem::WireType { field, wire }),
        }
        .map_err(|problem| malformed(start, problem))?;
        let available = bytes.len() - at;
        match usize::try_from(len).ok().filter(|&len| len <= available) {
            Some(len) => at += len,
            None => return Err(malformed(start, ProtoProblem::Truncated { what: what(), needed: len, available })),
        }
        if field == PIECES_FIELD {
            pieces += 1;
        }
    }
    Ok(pieces)
}

/// The base-128 varint at `*at`, which then moves past it. `what` names it for the errors: the file
/// ending inside it (truncated) or a varint longer than the ten bytes a u64 takes.
fn read_varint(bytes: &[u8], at: &mut usize, what: impl Fn() -> String) -> Result<u64, ProtoProblem> {
    let mut value = 0u64;
    for (read, shift) in (0..64).step_by(7).enumerate() {
        let Some(&byte) = bytes.get(*at) else {
            return Err(ProtoProblem::Truncated { what: what(), needed: read as u64 + 1, available: read });
        };
        *at += 1;
        value |= u64::from(byte & 0x7F) << shift;
        if byte < 0x80 {
            return Ok(value);
        }
    }
    Err(ProtoProblem::BadVarint { what: what() })
}

/// Refuses the settings this encoder does not implement, rather than encoding differently from sentencepiece.
fn check_supported(
    path: &Path,
    trainer: &TrainerSpec,
    normalizer: &NormalizerSpec,
    denormalizer: Option<&NormalizerSpec>,
) -> Result<(), TokenizerError> {
    let unsupported = |setting, found: String, supported| TokenizerError::Unsupported {
        path: path.to_path_buf(),
        setting,
        found,
        supported,
    };
    if trainer.model_type() != BPE {
        return Err(unsupported("model_type", model_type_name(trainer.model_type()), "BPE"));
    }
    if trainer.treat_whitespace_as_suffix() {
        return Err(unsupported("treat_whitespace_as_suffix", "true".into(), "false (whitespace as a prefix)"));
    }
    // The character map, not the name, is what sentencepiece applies; nmt_nfkc and friends are NFKC plus
    // extra rules, so no Unicode crate reproduces them exactly.
    if normalizer.precompiled_charsmap.as_ref().is_some_and(|map| !map.is_empty()) {
        let name = normalizer.name.clone().unwrap_or_else(|| "(unnamed)".to_string());
        return Err(unsupported("the normaliser", format!("{name:?} with a precompiled character map"), "identity"));
    }
    if !normalizer.escape_whitespaces() {
        return Err(unsupported("escape_whitespaces", "false".into(), "true (spaces spelled ▁)"));
    }
    let denormalizes = denormalizer.and_then(|spec| spec.precompiled_charsmap.as_ref());
    if denormalizes.is_some_and(|map| !map.is_empty()) {
        return Err(unsupported("the denormaliser", "a precompiled character map".into(), "none"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generation::Generation;
    use crate::tokenizer::{PieceProblem, VocabularyProblem, MAX_PIECES};

    const BASE_MODEL: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/tokenizer/variants/base.model");

    fn base_model() -> ModelProto {
        let bytes = std::fs::read(BASE_MODEL).expect("variants/base.model is committed");
        ModelProto::decode(bytes.as_slice()).expect("base.model decodes")
    }

    fn parse_mutated(model: &ModelProto) -> Result<Tokenizer, TokenizerError> {
        parse_model(Path::new("mutated.model"), &model.encode_to_vec())
    }

    fn parse(name: &str, bytes: &[u8]) -> Result<Tokenizer, TokenizerError> {
        parse_model(Path::new(name), bytes)
    }

    /// The error loading the base model with one change; the unchanged model loads (see below), so the change
    /// is what is refused.
    fn refused(change: impl FnOnce(&mut ModelProto)) -> TokenizerError {
        let mut model = base_model();
        change(&mut model);
        let err = parse_mutated(&model).expect_err("the changed model must be refused");
        assert!(err.to_string().contains("mutated.model"), "error must name the file: {err}");
        err
    }

    fn trainer(model: &mut ModelProto) -> &mut TrainerSpec {
        model.trainer_spec.get_or_insert_with(Default::default)
    }

    fn normalizer(model: &mut ModelProto) -> &mut NormalizerSpec {
        model.normalizer_spec.get_or_insert_with(Default::default)
    }

    fn piece_problem(err: TokenizerError) -> (usize, PieceProblem) {
        match err {
            TokenizerError::Piece { id, problem, .. } => (id, problem),
            other => panic!("expected a piece error, got {other}"),
        }
    }

    fn unsupported_setting(err: TokenizerError) -> &'static str {
        match err {
            TokenizerError::Unsupported { setting, .. } => setting,
            other => panic!("expected an unsupported-setting error, got {other}"),
        }
    }

    #[test]
    fn reencoded_base_model_loads() {
        let tok = parse_mutated(&base_model()).expect("round-tripped model loads");
        assert_eq!(tok.vocab_size(), 400);
        assert!(tok.byte_fallback() && tok.add_dummy_prefix() && !tok.remove_extra_whitespaces());
    }

    #[test]
    fn missing_file_is_a_read_error_naming_it() {
        let err = Tokenizer::load(Path::new("/nonexistent/tokenizer.model")).expect_err("no such file");
        assert!(matches!(err, TokenizerError::Read { .. }), "{err}");
        assert!(err.to_string().contains("/nonexistent/tokenizer.model"), "{err}");
    }

    #[test]
    fn a_cact_blob_is_not_a_model() {
        let blob = std::fs::read(BASE_MODEL.replace(".model", ".blob")).expect("variants/base.blob");
        let err = parse_model(Path::new("tokenizer.blob"), &blob).expect_err("a blob is not a ModelProto");
        assert!(matches!(err, TokenizerError::NotAModel { .. } | TokenizerError::Malformed { .. }), "{err}");
    }

    #[test]
    fn every_cut_is_reported_at_the_field_it_cuts() {
        let bytes = base_model().encode_to_vec();
        for len in 1..bytes.len() {
            match parse_model(Path::new("cut.model"), &bytes[..len]) {
                Err(TokenizerError::Malformed { offset, problem: ProtoProblem::Truncated { .. }, .. }) => {
                    assert!(offset < len, "offset {offset} of a {len}-byte cut")
                }
                // A cut between two fields leaves a well-formed model that lacks the rest.
                Ok(_) | Err(TokenizerError::Vocabulary { .. } | TokenizerError::Unsupported { .. }) => {}
                other => panic!("a {len}-byte cut gave {other:?}"),
            }
        }
        let err = parse_model(Path::new("cut.model"), &bytes[..bytes.len() / 2]).unwrap_err();
        assert!(err.to_string().starts_with("cut.model, byte offset "), "{err}");
        assert!(err.to_string().contains("record of piece"), "{err}");
    }

    #[test]
    fn a_piece_count_past_the_budget_is_refused_before_decoding() {
        // The smallest piece record there is, `0a 00`, MAX_PIECES + 1 times: 2 MB of file that prost
        // would turn into a vector of over a million decoded pieces.
        let bytes = [0x0a, 0x00].repeat(MAX_PIECES + 1);
        match parse_model(Path::new("many.model"), &bytes) {
            Err(TokenizerError::Vocabulary { problem: VocabularyProblem::TooManyPieces(n), .. }) => {
                assert_eq!(n, MAX_PIECES + 1)
            }
            other => panic!("expected the piece budget, got {other:?}"),
        }
    }

    #[test]
    fn malformed_keys_and_wire_types_are_placed() {
        let mut bytes = base_model().encode_to_vec();
        let at = bytes.len();
        bytes.extend_from_slice(&[0x0b]);
        assert!(matches!(
            parse("grouped.model", &bytes),
            Err(TokenizerError::Malformed { offset, problem: ProtoProblem::WireType { field: 1, wire: 3 }, .. })
                if offset == at
        ));
        bytes.truncate(at);
        bytes.extend_from_slice(&[0xFF; 11]);
        assert!(matches!(
            parse("varint.model", &bytes),
            Err(TokenizerError::Malformed { problem: ProtoProblem::BadVarint { .. }, .. })
        ));
    }

    #[test]
    fn unsupported_settings_are_refused_by_name() {
        let err = refused(|m| trainer(m).model_type = Some(1));
        assert!(err.to_string().contains("UNIGRAM"), "{err}");
        assert_eq!(unsupported_setting(err), "model_type");
        assert_eq!(unsupported_setting(refused(|m| m.trainer_spec = None)), "model_type");
        assert_eq!(
            unsupported_setting(refused(|m| trainer(m).treat_whitespace_as_suffix = Some(true))),
            "treat_whitespace_as_suffix"
        );
        assert_eq!(
            unsupported_setting(refused(|m| normalizer(m).escape_whitespaces = Some(false))),
            "escape_whitespaces"
        );
        let err = refused(|m| {
            normalizer(m).name = Some("nmt_nfkc".into());
            normalizer(m).precompiled_charsmap = Some(vec![4, 0, 0, 0, 1, 2, 3, 4, 5]);
        });
        assert!(err.to_string().contains("nmt_nfkc") && err.to_string().contains("identity"), "{err}");
        assert_eq!(unsupported_setting(err), "the normaliser");
        let err = refused(|m| {
            m.denormalizer_spec = Some(NormalizerSpec { precompiled_charsmap: Some(vec![1]), ..Default::default() })
        });
        assert_eq!(unsupported_setting(err), "the denormaliser");
    }

    #[test]
    fn bad_pieces_are_refused_with_their_id() {
        let (id, problem) = piece_problem(refused(|m| m.pieces[20].piece = Some(Vec::new())));
        assert_eq!((id, problem), (20, PieceProblem::Empty));
        let (id, problem) = piece_problem(refused(|m| m.pieces[300].piece = Some(vec![b'a', 0xFF])));
        assert!(id == 300 && matches!(problem, PieceProblem::BadUtf8(_)), "{problem}");
        let (id, problem) = piece_problem(refused(|m| m.pieces[301].piece = Some(vec![b'x'; 70_000])));
        assert_eq!((id, problem), (301, PieceProblem::TooLong(70_000)));
        let (id, problem) = piece_problem(refused(|m| m.pieces[302].score = Some(f32::NAN)));
        assert_eq!((id, problem), (302, PieceProblem::NanScore));
        let (id, problem) = piece_problem(refused(|m| m.pieces[303].piece = m.pieces[302].piece.clone()));
        assert!(id == 303 && matches!(problem, PieceProblem::Duplicate { first_id: 302, .. }), "{problem}");
        let (id, problem) = piece_problem(refused(|m| m.pieces[304].r#type = Some(5)));
        assert_eq!((id, problem), (304, PieceProblem::UnsupportedType(5)));
    }

    #[test]
    fn byte_pieces_must_be_canonical_and_complete() {
        // Piece 14 is <0x00>, the first byte piece.
        let (id, problem) = piece_problem(refused(|m| m.pieces[14].piece = Some(b"<0x0a>".to_vec())));
        assert_eq!((id, problem), (14, PieceProblem::BadByteName("<0x0a>".into())));
        let (id, problem) = piece_problem(refused(|m| trainer(m).byte_fallback = Some(false)));
        assert_eq!((id, problem), (14, PieceProblem::ByteWithoutFallback("<0x00>".into())));
        let err = refused(|m| m.pieces[14 + 0x41].r#type = Some(1));
        assert!(
            matches!(err, TokenizerError::Vocabulary { problem: VocabularyProblem::MissingBytePiece(0x41), .. }),
            "{err}"
        );
    }

    #[test]
    fn needle_special_ids_are_required() {
        let (id, problem) = piece_problem(refused(|m| m.pieces[3].r#type = Some(1)));
        assert!(id == 3 && matches!(problem, PieceProblem::WrongSpecial { found: PieceKind::Normal, .. }));
        let (id, problem) = piece_problem(refused(|m| m.pieces.swap(0, 3)));
        assert!(id == 0 && matches!(problem, PieceProblem::WrongSpecial { found: PieceKind::Unknown, .. }));
        let err = refused(|m| m.pieces[200].r#type = Some(2));
        assert!(matches!(err, TokenizerError::Vocabulary { problem: VocabularyProblem::SecondUnknown(200), .. }));
        let err = refused(|m| m.pieces.truncate(3));
        assert!(matches!(err, TokenizerError::Vocabulary { problem: VocabularyProblem::TooFewPieces(3), .. }));
    }

    #[test]
    fn only_chat_markers_are_written_user_defined() {
        let mut model = base_model();
        model.pieces[300].r#type = Some(4);
        let tok = parse_mutated(&model).expect("an extra user-defined piece is fine");
        assert_eq!(tok.pieces()[300].kind, PieceKind::UserDefined);
        let base = parse_mutated(&base_model()).expect("base");
        assert_eq!(
            tok.to_cact_blob(Generation::Needle2),
            base.to_cact_blob(Generation::Needle2),
            "the reference types USER_DEFINED by marker name only"
        );
    }
}
