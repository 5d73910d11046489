//! The Evaluate step: the held-out scores of a training (the base and tuned model's come with the
//! training's record; the built `.cact`'s, beside the tuned model float and with its quantization
//! simulated, from [`score`]), drawn per tool by kind of answer and worded ([`view`], [`gaps`]); and
//! Try, one question to the base and the tuned model side by side ([`tryout`]); the confidence
//! threshold the model ships with ([`threshold`]), and an acceptance suite run on the base, tuned and
//! `.cact` ([`acceptance`]).

pub mod acceptance;
pub mod commands;
pub mod gaps;
pub mod score;
pub mod step;
pub mod threshold;
pub mod tryout;
pub mod view;
