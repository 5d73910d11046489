//! The worker: the `needle` CLI run as a child process of the app ([`process`]), so that a crash, an
//! out-of-memory kill or a cancel never takes the window down, given one typed [`job::Job`] at a time;
//! [`engine`] chooses which binary that is.

pub mod engine;
pub mod job;
pub mod process;
