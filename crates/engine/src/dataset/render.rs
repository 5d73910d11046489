//! The chat template of the reference's `render_example`, 2.x's and 3.x's.

use super::Example;
use crate::generation::ThinkBlock;

const IM_START: &str = "<|im_start|>";
const IM_END: &str = "<|im_end|>";
pub(crate) const THINK_START: &str = "<think>";
pub(crate) const THINK_END: &str = "</think>";
const TOOLS_START: &str = "<tools>";
const TOOLS_END: &str = "</tools>";
pub(crate) const TOOL_CALL_START: &str = "<tool_call>";
pub(crate) const TOOL_CALL_END: &str = "</tool_call>";

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
    let think = match example.generation.profile().chat.think {
        ThinkBlock::Always => format!("{THINK_START}{}{THINK_END}\n", example.reasoning),
        // 3.x puts the reasoning on lines of its own, and leaves the block out when there is none.
        ThinkBlock::WhenReasoning if example.reasoning.is_empty() => String::new(),
        ThinkBlock::WhenReasoning => format!("{THINK_START}\n{}\n{THINK_END}\n", example.reasoning),
    };
    let target = format!("{think}{TOOL_CALL_START}{}{TOOL_CALL_END}{IM_END}", example.answers);
    (prompt, target)
}
