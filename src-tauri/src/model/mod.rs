//! The Model step: the hardware and device choice, the base model (each published generation from the
//! hub cache, or downloaded: [`download`]), and what the app remembers between launches
//! ([`preferences`]).

pub mod commands;
pub mod download;
pub mod preferences;
pub mod step;
