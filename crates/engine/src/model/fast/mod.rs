//! The CPU training path: the same network as the candle modules, computed without candle's
//! autograd. Each layer's forward keeps the few tensors its own backward needs ([`stack`]), the
//! backward is written out by hand, attention is flash-style ([`flash`]), every matrix product is
//! one `gemm` call on host slices ([`mat`]) and the per-token work runs on rayon's pool. Nothing is
//! kept per operation, no gradient is formed for a frozen weight, and the buffers live in a
//! [`Workspace`] reused from step to step.
//!
//! The kernels are read in place from the network's tensors (no copy of the base model); the
//! small parameters (gains, gate scalars, the MLP's diagonals and factors, the lane gates'
//! projections) are copied once. The candle path
//! stays the reference for what is computed: the parity tests check this one against it and
//! against the reference's goldens. CUDA and Metal run the candle path.

mod attention;
mod block;
mod conv;
mod decode;
mod engram;
mod flash;
mod kept;
mod kv_cache;
mod lanes;
mod mat;
mod mlp;
mod monarch;
mod network;
mod pass;
mod stack;

pub use decode::CpuDecode;
pub use network::{CpuNetwork, HostFactors, Workspace};
