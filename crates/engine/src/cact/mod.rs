//! The `.cact` deployment blob: writer (`needle build`), reader (`needle inspect`) and the CQ
//! quantizer they share.
//!
//! Byte layout (all little-endian), as the reference's `export.py` defines it:
//! a 120-byte header (29 × u32 then `rope_theta` as f32), `codebook_len` f32 (cb2|cb3|cb4), a nameless
//! directory of 44-byte records (`u8 dtype, u8 ndim, u16 pad, u32 shape[4], u64 offset, u64 nbytes,
//! u32 group, u32 bits`), then 64-byte aligned blobs. [`format`](mod@format) is that frame, written down once for
//! the writer and the reader. What the tensors are, in which order, and how the header follows from
//! the model config belong to the generation: [`needle2`] (the checkpoint's tensors in file order,
//! their names recovered from the header geometry, and the way back to the network's weights).

pub mod bits;
pub mod export;
pub mod format;
pub mod geometry;
pub mod needle2;
pub mod quant;
pub mod reader;
pub mod synthetic;
pub mod writer;

pub use bits::{BitsChoice, BitsMap, BitsMapError};
pub use export::{export, ExportError, ExportEvent, ExportOptions};
pub use format::{align_up, Header, Record, TensorKind};
pub use needle2::WeightsError;
pub use quant::Bits;
pub use reader::{CactFile, ReadError};
pub use writer::{build_cact, write_cact, BuildError, BuiltCact, WriteError};

#[cfg(test)]
mod golden_tests;
