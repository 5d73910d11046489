//! The Train step: a training as the window drafts it and the app checks it ([`draft`]), the one
//! training in progress ([`slot`]), and its worker and what the window hears of it ([`job`]), written
//! into the trainings' record ([`crate::record`]) whose loss curve [`crate::chart`] draws.

pub mod commands;
pub mod draft;
pub mod job;
pub mod slot;
pub mod step;
