//! Each part's weights, as both compute paths read them: the reference's modules (network, stack,
//! block, attention, MLPs, engram) loaded from a [`super::Params`] source and checked against the
//! config, one file per part. The candle path ([`super::san`]) and the CPU path ([`super::fast`])
//! compute the same parts in files of the same names; neither imports the other.

pub mod attention;
pub mod block;
pub mod engram;
pub mod mlp;
pub mod monarch;
pub mod network;
pub mod stack;
