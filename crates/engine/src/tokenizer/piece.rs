//! The atoms of a vocabulary: a piece and what it is for, the ids every Needle tokenizer reserves,
//! and the limits a file's pieces are held to.

pub const PAD_ID: u32 = 0;
pub const EOS_ID: u32 = 1;
pub const BOS_ID: u32 = 2;
pub const UNK_ID: u32 = 3;
/// `<|im_end|>`, the second chat marker: the end of a turn, where decoding stops.
pub const IM_END_ID: u32 = 5;

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

/// The most pieces a tokenizer may have: far above any real vocabulary (Needle 2's has 8192), low
/// enough that a file claiming more is refused before its pieces are read, which bounds the memory
/// a hostile file can ask for.
pub const MAX_PIECES: usize = 1 << 20;

/// The longest piece text, in bytes: a `.cact` stores each piece's length as a u16.
pub const MAX_PIECE_LEN: usize = u16::MAX as usize;

/// sentencepiece's default `unk_surface`: what `sp.Decode` prints for `<unk>`.
pub(super) const DEFAULT_UNK_SURFACE: &str = " \u{2047} ";
