//! The errors of the W4A8 path.

use super::isa::Isa;
use crate::quant::CqBlobError;

/// Why a W4A8 product could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum W4a8Error {
    #[error("the .cact has no tensor `{name}`; it is not a complete export (rebuild it with `needle build`)")]
    Missing { name: String },
    #[error("the .cact has no tensor {index} (it lists {count})")]
    NoTensor { index: usize, count: usize },
    #[error("tensor {index} (`{name}`) is stored as {kind}, not CQ: only CQ weights multiply as W4A8")]
    NotCq { index: usize, name: String, kind: &'static str },
    #[error("tensor {index} (`{name}`): {source}; the file is corrupt, rebuild it with `needle build`")]
    Blob { index: usize, name: String, source: CqBlobError },
    #[error(
        "the .cact's `{name}` has {rows} rows, not a whole number of rows for each of its {layers} layers; the file \
         is corrupt, rebuild it with `needle build`"
    )]
    Layers { name: String, rows: usize, layers: usize },
    #[error("{len} activation values do not make {rows} rows of {in_dim}")]
    Rows { len: usize, rows: usize, in_dim: usize },
    #[error("activation rows are {found} wide but the matrix takes rows of {expected}")]
    Width { found: usize, expected: usize },
    #[error("this CPU cannot run the {isa:?} kernels (Isa::detect picks one it can)")]
    Unsupported { isa: Isa },
}
