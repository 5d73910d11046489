//! W4A8: the products of a `.cact`'s CQ weights with activations, computed from the codes as the
//! file stores them, with 8-bit activations and integer dot products: what the Needle engine runs,
//! where the simulated path ([`crate::cact::reader::CactFile::values`]) dequantizes to f32.
//!
//! **The algebra.** A CQ row stores, per 128-wide group, codes `c` into a Lloyd–Max codebook and a
//! norm `n`; the group's weights are `w = H·(n·cb[c])`, with `H` the orthonormal Walsh–Hadamard
//! transform, symmetric and its own inverse. So `w·x = n·(cb[c]·(H·x))`: the activations are
//! rotated once per group ([`Activations`]) and every output row then needs only its codes, never
//! its weights ([`CqMatrix`] holds the codes, the fp16 norms and the codebook: 4-bit codes are the
//! file's own bytes, 3-, 2- and 1.58-bit ones are repacked once as they load; [`layout`] says how).
//! The network's `x·W` with the file's `[out, in]` matrix `M` is `x·Mᵀ`: [`CqMatrix::product`].
//!
//! **The approach: an int8-mapped codebook, looked up in registers.** The levels are mapped to
//! int8 against one scale (the largest level is ±127), the codes of a group index them with
//! `vpshufb`, and the products are integer dot products of those int8 weights with int8
//! activations: `vpdpbusd` on AVX-512 VNNI, `vpmaddubsw` + `vpmaddwd` on AVX2, plain Rust (which
//! the compiler vectorizes, NEON on aarch64) elsewhere, chosen at run time ([`Isa::detect`]). A
//! group's product is an exact integer on every path; one float epilogue scales it by the
//! weight's norm, the codebook's scale and the activations' group scale, so every CPU computes the
//! same values bit for bit. A float lookup (the f32 levels times f32 activations) would keep the
//! codebook exact but multiply in f32 at a quarter of the int8 throughput, and no int8 activation
//! could use it.
//!
//! **What it costs in accuracy** (`accuracy_tests`, relative error of the product against the
//! simulated path's, f64 products of the same codes dequantized): on random Gaussian `[96, 768]`
//! matrices and 16 rows, 0.88 % at 4 bits, of which the int8 activations alone cost 0.64 % and
//! the int8 codebook alone 0.61 % (they add in quadrature); 0.74 % at 3 bits, 0.66 % at 2 bits and
//! 0.65 % at 1.58 bits, whose three levels map to −127, 0, 127 exactly. Rows with one channel in
//! 64 ten times louder cost no more (0.83 % at 4 bits): the rotation spreads an outlier over its
//! group before the group is scaled. On every CQ tensor of the golden fixtures, with the same
//! activations: 0.73 % over the Needle 3 file (42 tensors), 0.92 % and 0.68 % over the Needle 2
//! W4 and W2 files, the worst single tensor 1.7 % (a 3-output probe head, 12 products). For
//! scale: the 4-bit quantization the simulated path already carries moves a product by about 10 %.

mod activations;
mod codes;
mod error;
mod isa;
pub mod layout;
mod matrix;
mod portable;
mod product;
mod read;
#[cfg(target_arch = "x86_64")]
mod x86;

#[cfg(test)]
mod accuracy_tests;
#[cfg(test)]
mod decode_tests;

pub use activations::Activations;
pub use codes::{EngramCodes, LaneCodes, LayerCodes, NetworkCodes, PROJECTIONS};
pub use error::W4a8Error;
pub use isa::Isa;
pub use matrix::{CqMatrix, Levels};
