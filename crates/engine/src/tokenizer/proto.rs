//! The parts of SentencePiece's `ModelProto` (sentencepiece_model.proto, proto2) that decide how a BPE model
//! encodes, declared by hand for prost; every other field is skipped while decoding.
use std::path::Path;

use prost::Message;

use super::{Normalization, Piece, PieceKind, Tokenizer, TokenizerError, DEFAULT_UNK_SURFACE};

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
    let model = ModelProto::decode(bytes)
        .map_err(|source| TokenizerError::NotAModel { path: path.to_path_buf(), source })?;
    let trainer = model.trainer_spec.unwrap_or_default();
    let normalizer = model.normalizer_spec.unwrap_or_default();
    check_supported(path, &trainer, &normalizer, model.denormalizer_spec.as_ref())?;
    let origin = path.display().to_string();
    let pieces = model
        .pieces
        .iter()
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

fn convert_piece(piece: &SentencePiece) -> Result<Piece, super::PieceProblem> {
    let text = std::str::from_utf8(piece.piece.as_deref().unwrap_or_default()).map_err(super::PieceProblem::BadUtf8)?;
    let kind = piece_kind(piece.r#type()).ok_or(super::PieceProblem::UnsupportedType(piece.r#type()))?;
    Ok(Piece { text: text.to_string(), score: piece.score(), kind })
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
