//! JSONL file → validated examples → token ids + loss mask, as the reference's `finetune.py`
//! (`load_jsonl`, `render_example`, `_encode`, `fit_max_len`) reads and encodes them.
//!
//! [`Dataset::load`] keeps exactly the examples the reference would train on and records a
//! [`Problem`] for every line it would skip or crash on; [`Dataset::prepare`] tokenizes each
//! example once and derives from that the sequence length, the encoded rows and a
//! [`DatasetReport`].

mod chat;
mod doctor;
mod encode;
mod example;
mod lines;
mod load;
mod problem;
mod render;
mod report;
pub(crate) mod schema;
#[cfg(test)]
mod tests;

pub use doctor::{
    duplicate_key, query_key, CategoryShare, Checkup, Finding, RowCategory, Severity, MIN_CALLS_PER_TOOL,
};
pub use encode::{fit_max_len, Encoded, Tokenized};
pub use example::Example;
pub use load::*;
pub use problem::{Field, Issue, Problem, Problems, KEPT_PROBLEMS};
pub use render::{render, ChatFormat, JsonStyle, TextFields, ThinkBlock};
pub(crate) use render::{THINK_END, THINK_START, TOOL_CALL_END, TOOL_CALL_START};
pub use report::{DatasetReport, HistogramBin, LengthStats, Sample};
pub use schema::{check_row, Kind, RowIssue};
