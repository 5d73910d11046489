//! Needle 2, the reference's `SimpleAttentionNetwork` (cactus-needle 2.0.x), on candle's ops.
//!
//! The shape of the model, top to bottom:
//! - token embedding × √d_model, with the same matrix (transposed) as the output projection;
//! - engram memories: hashed n-gram lookups turned into keys and values once per sequence, injected
//!   through a learned gate at the configured layers ([`engram`]);
//! - a stack of identical blocks whose parameters are stored stacked along a leading layer axis,
//!   carried on several residual lanes mixed by doubly-stochastic matrices ([`stack`]);
//! - each block ([`block`]): zero-centred RMSNorm sandwiches around grouped-query attention with
//!   per-head q/k norms, RoPE and a sigmoid output gate ([`attention`]), then a Hadamard-mixing
//!   MLP ([`mlp`]).
//!
//! [`Network`] holds them; the hand-written CPU path ([`super::CpuNetwork`]) computes the same
//! layers from the same weights.

pub mod attention;
pub mod block;
pub mod engram;
pub mod mlp;
pub mod network;
pub mod stack;

pub use network::Network;
