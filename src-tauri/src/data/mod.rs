//! The Data step: the dataset's report and the doctor's findings ([`report`]), and more examples
//! written by an LLM ([`generate`]).

pub mod commands;
pub mod generate;
pub mod report;
pub mod step;
