//! The `.cact` deployment blob: writer (`needle build`), reader (`needle inspect`) and the CQ
//! quantizer they share.
//!
//! Byte layout (all little-endian), as the reference's `export.py` defines it:
//! a 120-byte header (29 × u32 then `rope_theta` as f32), `codebook_len` f32 (cb2|cb3|cb4), a nameless
//! directory of 44-byte records (`u8 dtype, u8 ndim, u16 pad, u32 shape[4], u64 offset, u64 nbytes,
//! u32 group, u32 bits`), then 64-byte aligned blobs. Tensors are positional, in [`writer`]'s canonical
//! order; [`layout::core_names`] and [`layout::head_names`] recover their names from the header geometry.

pub mod bits;
pub mod export;
pub mod geometry;
pub mod layout;
pub mod quant;
pub mod reader;
pub mod synthetic;
pub mod weights;
pub mod writer;

pub use bits::{BitsChoice, BitsMap, BitsMapError};
pub use export::{export, ExportError, ExportEvent, ExportOptions};
pub use quant::Bits;
pub use reader::{CactFile, ReadError};
pub use weights::WeightsError;
pub use writer::{build_cact, write_cact, BuildError, BuiltCact, WriteError};

/// First u32 of every `.cact`.
pub const TAG: u32 = 0x05E1_2A83;
/// Every blob starts on a multiple of this.
pub const ALIGN: usize = 64;
/// Header size: 29 u32 fields and the f32 `rope_theta`.
pub const HEADER_LEN: usize = 30 * 4;
/// One directory record.
pub const RECORD_LEN: usize = 44;
/// Most dimensions a directory record can describe.
pub const MAX_NDIM: usize = 4;

/// Storage of one tensor, as the directory's `dtype` (and, for CQ, `group`/`bits`) fields record it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorKind {
    Fp16,
    Fp32,
    Cq(Bits),
    Raw,
}

impl TensorKind {
    /// The directory's dtype code.
    pub fn code(self) -> u8 {
        match self {
            TensorKind::Fp16 => 1,
            TensorKind::Fp32 => 2,
            TensorKind::Cq(_) => 3,
            TensorKind::Raw => 4,
        }
    }

    /// Short label for tables and size-by-kind summaries.
    pub fn label(self) -> &'static str {
        match self {
            TensorKind::Fp16 => "FP16",
            TensorKind::Fp32 => "FP32",
            TensorKind::Cq(_) => "CQ",
            TensorKind::Raw => "RAW",
        }
    }
}

/// Rounds a byte position up to the next blob boundary.
pub fn align_up(pos: usize) -> usize {
    pos.div_ceil(ALIGN) * ALIGN
}

#[cfg(test)]
mod golden_tests;
