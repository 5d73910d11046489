//! The codes a W4A8 network multiplies by, read from a `.cact` as it ships: every layer's
//! attention projections and the output head (the tied embedding), each a [`CqMatrix`] of the
//! file's own codes and fp16 norms.
//!
//! Only these products run from codes. The MLP (Needle 2's diagonals, Needle 3's Monarch blocks),
//! the mHC lane mix and the engram projections are small per-token products whose shapes the
//! 128-wide group kernels do not fit; they stay on the simulated path's float weights.

use std::sync::Arc;

use super::matrix::CqMatrix;

/// A layer's projections in the CPU path's order: q, k, v, gate, out.
pub const PROJECTIONS: [&str; 5] = ["q_proj", "k_proj", "v_proj", "gate_proj", "out_proj"];

/// One layer's five projections, shared by every clone of the network that reads them.
pub type LayerCodes = Arc<[CqMatrix; 5]>;

/// The CQ matrices a W4A8 network reads in place of float weights.
#[derive(Debug, Clone)]
pub struct NetworkCodes {
    layers: Vec<LayerCodes>,
    head: Arc<CqMatrix>,
}

impl NetworkCodes {
    /// `layers`' projections (q, k, v, gate, out) and the output head `head`.
    pub(super) fn new(layers: Vec<LayerCodes>, head: CqMatrix) -> Self {
        Self { layers, head: Arc::new(head) }
    }

    /// Each layer's projections, in layer order.
    pub fn layers(&self) -> &[LayerCodes] {
        &self.layers
    }

    /// The output head: the embedding `[vocab, d]`, whose product with a hidden row is its logits.
    pub fn head(&self) -> &CqMatrix {
        &self.head
    }
}
