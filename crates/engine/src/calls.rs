//! Does the model make the right calls? The weights to try (a checkpoint, with an adapter merged, or
//! a built `.cact` read back), a prompt rendered as training renders it and answered by greedy
//! decoding, the tool calls parsed out of the answer, and exact-call accuracy over examples, with
//! how far the answers' confidence can be relied on ([`reliability`]).

mod breakdown;
pub mod decode_bench;
pub mod ladder;
mod parse;
pub mod reliability;
mod score;

pub use breakdown::{AnswerKind, ArgumentDiff, ArgumentProblem, Breakdown, Verdict, UNNAMED, UNPARSEABLE};
pub use parse::{parse_calls, parse_reasoning, parse_tools, NO_CALL, UNREADABLE};
pub use reliability::{Reliability, Scored};
pub use score::*;
