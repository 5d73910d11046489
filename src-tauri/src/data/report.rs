//! The dataset as a training will see it: the report `needle data --json` makes of it, computed in
//! the worker (a huge or hostile file costs that process, never the window's), and any of its lines
//! as written.

use std::path::Path;

use needle_engine::checkpoint::file_generation;
use needle_engine::dataset::Dataset;
use needle_engine::generation::Generation;
use needle_engine::settings::Field;

use crate::worker::job::Job;
use crate::worker::process::{Slot, Worker};

/// How much of a dataset line the window is shown.
const SHOWN_LINE_CHARS: usize = 16_384;

/// The report for the Data panel, as the worker printed it. A newer request in `slot` ends this
/// one. `max_len` is as typed in the Train panel, read by the training's own max-length field; the
/// lines are read as the chosen base model's generation reads them: `checkpoint`'s, else `chosen`
/// (the published model chosen in the Model step).
pub fn report(
    worker: &Worker,
    slot: &Slot,
    path: &Path,
    tokenizer: Option<&Path>,
    checkpoint: Option<&Path>,
    chosen: Generation,
    max_len: &serde_json::Value,
) -> Result<serde_json::Value, String> {
    let field = Field::named("max_len").ok_or("the training settings have no max length")?;
    let max_len = field.read(Some(max_len)).map_err(|problem| format!("{}: {problem}", field.label))?;
    let tokenizer = tokenizer.ok_or("choose the base model's tokenizer (.model) to see token lengths")?;
    let generation = match checkpoint {
        Some(checkpoint) => file_generation(checkpoint).ok_or_else(|| {
            format!(
                "{} is not a Needle checkpoint (a 2.x .pkl or a 3.x .safetensors); choose the base model in the Model step",
                checkpoint.display()
            )
        })?,
        None => chosen,
    };
    let max_len = max_len.as_u64().and_then(|n| usize::try_from(n).ok()).ok_or("the max length is not a count")?;
    let job = Job::Report { dataset: path.into(), tokenizer: tokenizer.into(), max_len, generation };
    let out = worker.output_in(slot, &job)?;
    serde_json::from_str(out.trim()).map_err(|error| format!("the worker's report was not understood ({error})"))
}

/// Line `line` of the dataset at `path` as it is written (a finding's line, shown when clicked);
/// pretty-printed when it is JSON, and cut at [`SHOWN_LINE_CHARS`] characters.
pub fn line(path: &Path, line: usize) -> Result<String, String> {
    let text = Dataset::line_of(path, line)
        .map_err(|error| error.to_string())?
        .ok_or_else(|| format!("{} has no line {line}", path.display()))?;
    let text = serde_json::from_str::<serde_json::Value>(&text)
        .ok()
        .and_then(|value| serde_json::to_string_pretty(&value).ok())
        .unwrap_or(text);
    Ok(match text.char_indices().nth(SHOWN_LINE_CHARS) {
        Some((cut, _)) => format!("{}… (cut: the line is longer)", &text[..cut]),
        None => text,
    })
}
