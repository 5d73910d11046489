//! The Export step: a training's adapter merged into its base and written as a `.cact` ([`build`]),
//! whole or as a rung of its depth ladder picked from the rungs' scores ([`ladder`]), and that file
//! pushed to a model repository on the hub ([`publish`]).

pub mod build;
pub mod commands;
pub mod ladder;
pub mod publish;
pub mod step;
