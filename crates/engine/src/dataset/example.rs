//! One usable example of a dataset, as the chat template reads it.

use serde::Serialize;

use crate::generation::Generation;

/// One usable example, each field already in the text form the chat template splices in.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Example {
    /// Whose recipe it is read and rendered by: 3.x strips the reasoning and the system prompt,
    /// keeps non-ASCII text unescaped in the JSON it splices in, and leaves out an empty `<think>`.
    #[serde(skip)]
    pub generation: Generation,
    /// 1-based line of the file.
    pub line: usize,
    /// The system prompt; empty means no system turn.
    pub system: String,
    pub query: String,
    pub reasoning: String,
    /// `tools` verbatim when it is a string, else its `json.dumps` text (`[]` when absent).
    pub tools: String,
    /// `answers` (or `function_calls` when `answers` is absent), verbatim when it is a string,
    /// else its `json.dumps` text (`[]` when both are absent).
    pub answers: String,
}
