//! The History step: past trainings, newest first, and one of them opened again with its chart.

pub mod commands;
pub mod step;
