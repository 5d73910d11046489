//! The Evaluate step: the held-out scores of a training (the base and tuned model's come with the
//! training's record; the built `.cact`'s, beside the tuned model float and with its quantization
//! simulated, from [`score`]), drawn per tool by kind of answer and worded ([`view`], [`gaps`]); and
//! Try, one question to the base and the tuned model side by side ([`tryout`]).

pub mod commands;
pub mod gaps;
pub mod score;
pub mod step;
pub mod tryout;
pub mod view;
