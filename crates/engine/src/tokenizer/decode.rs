//! `sp.Decode`: pieces back to text, byte pieces reassembled into UTF-8.
use super::encode::SPACE_SYMBOL;
use super::{byte_value, PieceKind, Tokenizer};

pub(super) fn decode(tok: &Tokenizer, ids: &[u32]) -> String {
    let mut text = String::new();
    let mut pending_bytes = Vec::new();
    // sentencepiece drops the `▁` the encoder added in front: it strips it from the first piece that starts
    // the text (leading CONTROL pieces and byte pieces decoding to nothing do not count). With
    // remove_extra_whitespaces it keeps stripping while the text stays empty.
    let strips_leading_space = tok.normalization.add_dummy_prefix || tok.normalization.remove_extra_whitespaces;
    let mut at_start = true;
    let mut stripped_space = false;
    for piece in ids.iter().filter_map(|&id| tok.pieces.get(id as usize)) {
        if piece.kind == PieceKind::Byte {
            // Byte pieces were checked to be <0xNN> on load, so this always yields the byte.
            if let Ok(byte) = byte_value(&piece.text) {
                pending_bytes.push(byte);
            }
            continue;
        }
        append_bytes(&mut text, &mut pending_bytes);
        if stripped_space || !text.is_empty() {
            at_start = false;
        }
        stripped_space = false;
        match piece.kind {
            PieceKind::Control => {}
            PieceKind::Unknown => text.push_str(&tok.unk_surface),
            _ => {
                let mut surface = piece.text.as_str();
                if at_start && strips_leading_space {
                    if let Some(rest) = surface.strip_prefix(SPACE_SYMBOL) {
                        surface = rest;
                        stripped_space = !tok.normalization.remove_extra_whitespaces;
                    }
                }
                text.push_str(&surface.replace(SPACE_SYMBOL, " "));
            }
        }
    }
    append_bytes(&mut text, &mut pending_bytes);
    text
}

/// Appends a run of byte pieces as UTF-8, one U+FFFD per byte that does not belong to a valid character
/// (sentencepiece's rule, finer than `String::from_utf8_lossy`'s one per maximal invalid sequence).
fn append_bytes(text: &mut String, bytes: &mut Vec<u8>) {
    for chunk in bytes.utf8_chunks() {
        text.push_str(chunk.valid());
        text.extend(std::iter::repeat_n(char::REPLACEMENT_CHARACTER, chunk.invalid().len()));
    }
    bytes.clear();
}
