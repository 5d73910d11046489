//! The chat template of the reference's `render_example`, 2.x's and 3.x's.

use super::Example;
use crate::generation::Generation;

const IM_START: &str = "<|im_start|>";
const IM_END: &str = "<|im_end|>";
pub(crate) const THINK_START: &str = "<think>";
pub(crate) const THINK_END: &str = "</think>";
const TOOLS_START: &str = "<tools>";
const TOOLS_END: &str = "</tools>";
pub(crate) const TOOL_CALL_START: &str = "<tool_call>";
pub(crate) const TOOL_CALL_END: &str = "</tool_call>";

/// How a generation's `render_example` writes a row.
#[derive(Debug, Clone, Copy)]
pub struct ChatFormat {
    pub think: ThinkBlock,
    /// How `tools` and `answers` that are not strings are written into the text.
    pub json: JsonStyle,
    /// How `system` and `reasoning` are read from a row.
    pub text_fields: TextFields,
    /// Whether a row may be a chat transcript (`messages`) rather than `query`/`answers`.
    pub chat_rows: bool,
}

impl ChatFormat {
    pub const fn of(generation: Generation) -> Self {
        match generation {
            Generation::Needle2 => ChatFormat {
                think: ThinkBlock::Always,
                json: JsonStyle::Ascii,
                text_fields: TextFields::AsWritten,
                chat_rows: false,
            },
            Generation::Needle3 => ChatFormat {
                think: ThinkBlock::WhenReasoning,
                json: JsonStyle::Unicode,
                text_fields: TextFields::Stripped,
                chat_rows: true,
            },
        }
    }
}

/// The `<think>` block before the calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThinkBlock {
    /// `<think>{reasoning}</think>\n`, empty reasoning included (2.x).
    Always,
    /// `<think>\n{reasoning}\n</think>\n`, left out when there is no reasoning (3.x).
    WhenReasoning,
}

/// `json.dumps` as a generation's template calls it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JsonStyle {
    /// Non-ASCII escaped as `\uXXXX` (2.x).
    Ascii,
    /// `ensure_ascii=False` (3.x).
    Unicode,
}

/// How `system` and `reasoning` are read from a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TextFields {
    /// As written: a false-y non-string `system` is ignored, a true-y one is refused (2.x).
    AsWritten,
    /// `(row.get(field) or "").strip()` (3.x).
    Stripped,
}

/// `(prompt, target)`: the text the model reads, and the text it learns to produce.
///
/// A system turn is added only for a non-empty system string, as in the reference.
pub fn render(example: &Example) -> (String, String) {
    let system_turn = if example.system.is_empty() {
        String::new()
    } else {
        format!("{IM_START}system\n{}{IM_END}\n", example.system)
    };
    let prompt = format!(
        "{system_turn}{IM_START}user\n{TOOLS_START}{}{TOOLS_END}\n{}{IM_END}\n{IM_START}assistant\n",
        example.tools, example.query
    );
    let think = match ChatFormat::of(example.generation).think {
        ThinkBlock::Always => format!("{THINK_START}{}{THINK_END}\n", example.reasoning),
        // 3.x puts the reasoning on lines of its own, and leaves the block out when there is none.
        ThinkBlock::WhenReasoning if example.reasoning.is_empty() => String::new(),
        ThinkBlock::WhenReasoning => format!("{THINK_START}\n{}\n{THINK_END}\n", example.reasoning),
    };
    let target = format!("{think}{TOOL_CALL_START}{}{TOOL_CALL_END}{IM_END}", example.answers);
    (prompt, target)
}
