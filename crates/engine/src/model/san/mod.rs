//! The reference's `SimpleAttentionNetwork` (cactus-needle 2.x and 3.x), on candle's ops.
//!
//! The shape of the model, top to bottom:
//! - token embedding × √d_model, with the same matrix (transposed) as the output projection;
//! - engram memories: hashed n-gram lookups turned into keys and values once per sequence, injected
//!   through a learned gate at the configured layers ([`engram`]);
//! - a stack of identical blocks whose parameters are stored stacked along a leading layer axis,
//!   carried on several residual lanes mixed by doubly-stochastic matrices ([`stack`]);
//! - each block ([`block`]): zero-centred RMSNorm sandwiches around grouped-query attention with
//!   per-head q/k norms, RoPE and a sigmoid output gate ([`attention`]), then an MLP: Needle 2's
//!   fixed Walsh rotations ([`mlp`]) or Needle 3's learned Monarch transforms ([`monarch`]).
//!
//! Needle 3 also gives the attention q/k heads narrower than its v heads, a causal convolution
//! on Q, K and V ([`conv`], which the engram values use too) and a window on all but its global
//! layers, and scores only the first `out_vocab` rows of the embedding.
//!
//! Each part's weights are its namesake in [`super::weights`] ([`super::Network`] holds them all);
//! the hand-written CPU path ([`super::CpuNetwork`]) computes the same layers from the same weights.

pub mod attention;
pub mod block;
pub mod conv;
pub mod decode;
pub mod engram;
pub mod mlp;
pub mod monarch;
pub mod network;
pub mod stack;
