//! The codes a W4A8 network multiplies by, read from a `.cact` as it ships: every CQ tensor of the
//! network, each a [`CqMatrix`] of the file's own codes and fp16 norms, and no f32 copy of any of
//! them. The attention projections, the mHC lane gates' projections, the engram key and value
//! projections and the output head are multiplied from them on the integer kernels; the embedding
//! and the engram tables are looked up a row at a time ([`CqMatrix::row`]).
//!
//! The MLP (Needle 2's diagonals, Needle 3's Monarch factors, diagonals and conditioning) is not
//! here: the `.cact` stores it in FP16, not as codes, and the network reads those values as they
//! are (a few hundred kB a layer).

use std::sync::Arc;

use super::matrix::CqMatrix;

/// A layer's projections in the CPU path's order: q, k, v, gate, out.
pub const PROJECTIONS: [&str; 5] = ["q_proj", "k_proj", "v_proj", "gate_proj", "out_proj"];

/// One layer's five projections, shared by every clone of the network that reads them.
pub type LayerCodes = Arc<[CqMatrix; 5]>;

/// One layer's mHC gate projections `Φ_pre`, `Φ_post`, `Φ_res`, each `[gates, n·d]` (the `.cact`'s
/// rows of this layer): `x̂·Φ` is their product with the normalised lanes.
pub type LaneCodes = Arc<[CqMatrix; 3]>;

/// One engram site's tables `[tables·slots, sub_dim]` (looked up by row), and its key and value
/// projections `[d, tables·sub_dim]`.
#[derive(Debug)]
pub struct EngramCodes {
    pub tables: CqMatrix,
    pub key: CqMatrix,
    pub value: CqMatrix,
}

/// The CQ matrices a W4A8 network reads in place of float weights.
#[derive(Debug, Clone)]
pub struct NetworkCodes {
    layers: Vec<LayerCodes>,
    lanes: Vec<LaneCodes>,
    engrams: Arc<[EngramCodes]>,
    head: Arc<CqMatrix>,
}

impl NetworkCodes {
    /// Each layer's attention projections (q, k, v, gate, out) and lane gates, each engram site's
    /// codes, and the embedding `head`.
    pub(super) fn new(
        layers: Vec<LayerCodes>,
        lanes: Vec<LaneCodes>,
        engrams: Vec<EngramCodes>,
        head: CqMatrix,
    ) -> Self {
        Self { layers, lanes, engrams: engrams.into(), head: Arc::new(head) }
    }

    /// Each layer's attention projections, in layer order.
    pub fn layers(&self) -> &[LayerCodes] {
        &self.layers
    }

    /// Each layer's mHC gate projections, in layer order.
    pub fn lanes(&self) -> &[LaneCodes] {
        &self.lanes
    }

    /// Each engram site's codes, in site order.
    pub fn engrams(&self) -> &[EngramCodes] {
        &self.engrams
    }

    /// The embedding `[vocab, d]`: a token's row looked up is its embedding, and its product with
    /// a hidden row is that row's logits (the tied output head).
    pub fn head(&self) -> &CqMatrix {
        &self.head
    }
}
