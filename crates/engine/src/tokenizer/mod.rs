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
mod piece;
mod proto;
mod vocab;

pub(crate) use blob::write as write_cact_blob;
pub use blob::{piece_count as cact_blob_piece_count, stated_piece_count as cact_blob_stated_pieces};
pub use error::{BlobField, BlobProblem, PieceProblem, ProtoProblem, TokenizerError, VocabularyProblem};
pub use piece::*;
pub use vocab::*;

use std::path::Path;

use crate::generation::Generation;

// The tokenizer's entry points, each handed to the room that does it.
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
        let dummy_prefix = match generation {
            Generation::Needle2 => true,
            Generation::Needle3 => self.add_dummy_prefix(),
        };
        blob::write(self.pieces(), chat_markers(generation), dummy_prefix)
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
}
