//! Format-v2 Needle checkpoints: Needle 2's pickles (`.pkl`, read with the safe pickle reader in
//! [`pickle`], which never executes anything) and Needle 3's safetensors files ([`safetensors_file`]),
//! told apart by their structure; and the reference's LoRA adapter pickles.
//!
//! The flattened parameter paths (`stack/layers/block/self_attn/q_proj/kernel`: the nested `params` dict
//! keys joined with `/`) are the naming authority for the whole engine.

mod array;
mod load;
mod needle3;
#[cfg(test)]
mod needle3_tests;
pub mod pickle;
pub mod safetensors_file;
#[cfg(test)]
mod tests;
pub mod writer;

pub use array::{unravel, ArrayError, DType, NdArray, RawLayout};
pub use load::*;

use std::path::Path;

use crate::generation::Generation;

/// The generation a checkpoint file's bytes hold: a pickle (protocol 2 and up, which is what
/// cactus-needle 2.x writes) is Needle 2; a safetensors file whose metadata carries the
/// `format_version` and `config` that cactus-needle 3.x writes is Needle 3. `None`: neither.
/// `bytes` may stop after the safetensors header: the tensors are not read.
pub fn generation(bytes: &[u8]) -> Option<Generation> {
    let container = Container::of(bytes)?;
    match container {
        Container::Pickle => Some(container.generation()),
        Container::Safetensors => {
            let metadata = needle3::header_metadata(bytes)?;
            needle3::CHECKPOINT_METADATA.iter().all(|key| metadata.contains_key(*key)).then(|| container.generation())
        }
    }
}

/// The generation of the checkpoint at `path`, read from its first bytes (a pickle's protocol, a
/// safetensors header) without loading its weights. `None`: unreadable, or neither.
pub fn file_generation(path: &Path) -> Option<Generation> {
    use std::io::Read;
    /// A safetensors header is a few kilobytes of JSON; more is not a checkpoint's.
    const MAX_HEADER: u64 = 1 << 24;
    let mut file = std::fs::File::open(path).ok()?;
    let mut head = Vec::new();
    (&mut file).take(9).read_to_end(&mut head).ok()?;
    if Container::of(&head) == Some(Container::Safetensors) {
        let header_len = u64::from_le_bytes(*head.first_chunk::<8>()?);
        if header_len > MAX_HEADER {
            return None;
        }
        // The header's first byte is already read.
        file.take(header_len - 1).read_to_end(&mut head).ok()?;
    }
    generation(&head)
}

impl Checkpoint {
    /// Reads a checkpoint as the reference's `load_checkpoint` does, without executing anything.
    pub fn load(path: &Path) -> Result<Self, CheckpointError> {
        let file = FileReader { path };
        let bytes = file.read()?;
        match Container::of(&bytes) {
            Some(Container::Safetensors) => file.needle3_checkpoint(&bytes),
            Some(Container::Pickle) => file.needle2_checkpoint(&bytes),
            None => Err(CheckpointError::NotACheckpoint { path: path.to_owned(), head: hex_head(&bytes) }),
        }
    }
}
