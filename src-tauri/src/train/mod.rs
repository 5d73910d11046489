//! The Train step: a training as the window drafts it and the app checks it ([`draft`]), the one
//! training in progress ([`slot`]), its worker and what the window hears of it ([`job`]), its record
//! on disk ([`record`]), whose loss curve [`crate::chart`] draws.

pub mod commands;
pub mod draft;
pub mod job;
pub mod record;
pub mod slot;
pub mod step;
