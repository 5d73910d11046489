//! The `.cact` deployment blob: writer (`needle build`), reader (`needle inspect`) and the CQ
//! quantizer they share.
//!
//! Byte layout (all little-endian), as the reference's `export.py` defines it: a header (Needle 2:
//! 120 bytes; Needle 3, format v3: 196), `codebook_len` f32 (cb2|cb3|cb4), a nameless
//! directory of 44-byte records (`u8 dtype, u8 ndim, u16 pad, u32 shape[4], u64 offset, u64 nbytes,
//! u32 group, u32 bits`), then 64-byte aligned blobs. [`format`](mod@format) is that frame, written down once for
//! the writer and the reader. What the tensors are and in which order belongs to the generation
//! ([`layout`]: [`needle2`], [`needle3`]); [`tensors`] lays a checkpoint out in that order,
//! [`weights`] reads a built file back into the network's parameters, and [`geometry`] maps the
//! model config to the header and back.

pub mod bits;
pub mod encode;
pub mod export;
pub mod format;
pub mod geometry;
pub mod ladder;
pub mod layout;
pub mod needle2;
pub mod needle3;
pub mod reader;
pub mod synthetic;
pub mod tensors;
pub mod weights;
pub mod writer;

pub use crate::quant::Bits;
pub use bits::{BitsChoice, BitsMap, BitsMapError};
pub use encode::BuildError;
pub use export::{export, load_checked, merge_adapter, ExportError, ExportEvent, ExportOptions};
pub use format::{align_up, Header, Record, TensorKind};
pub use reader::{CactFile, ReadError};
pub use weights::WeightsError;
pub use writer::{build_cact, write_cact, BuiltCact, WriteError};

#[cfg(test)]
mod golden_tests;
