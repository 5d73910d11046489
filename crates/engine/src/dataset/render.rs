//! The chat template of the reference's `render_example`.

use super::Example;

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
    let target = format!(
        "{THINK_START}{}{THINK_END}\n{TOOL_CALL_START}{}{TOOL_CALL_END}{IM_END}",
        example.reasoning, example.answers
    );
    (prompt, target)
}
