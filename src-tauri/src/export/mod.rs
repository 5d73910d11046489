//! The Export step: a training's adapter merged into its base and written as a `.cact` ([`build`]),
//! and that file pushed to a model repository on the hub ([`publish`]).

pub mod build;
pub mod commands;
pub mod publish;
pub mod step;
