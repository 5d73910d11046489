//! CONTRACT placeholder: SentencePiece BPE tokenizer.
use std::path::Path;

pub const PAD_ID: u32 = 0;
pub const EOS_ID: u32 = 1;
pub const BOS_ID: u32 = 2;
pub const UNK_ID: u32 = 3;

#[derive(Debug, thiserror::Error)]
#[error("tokenizer error")]
pub struct TokenizerError;

#[derive(Debug, Clone)]
pub struct Tokenizer;

impl Tokenizer {
    /// Loads a SentencePiece `tokenizer.model` (protobuf).
    pub fn load(_path: &Path) -> Result<Self, TokenizerError> { todo!() }
    /// Parses the RAW tokenizer blob stored inside a `.cact`.
    pub fn from_cact_blob(_blob: &[u8]) -> Result<Self, TokenizerError> { todo!() }
    pub fn encode(&self, _text: &str) -> Vec<u32> { todo!() }
    pub fn decode(&self, _ids: &[u32]) -> String { todo!() }
    pub fn vocab_size(&self) -> usize { todo!() }
}
