//! The Evaluate step: the held-out scores of a built `.cact` ([`score`]; the base and tuned
//! model's come with the training's record), and Try, one question to the base and the tuned model
//! side by side ([`tryout`]).

pub mod commands;
pub mod score;
pub mod step;
pub mod tryout;
