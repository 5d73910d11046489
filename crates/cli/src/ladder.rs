//! `needle eval --ladder`: every rung of a model's depth ladder (Needle 3: each depth a smaller
//! model) built as `needle build --layers N` builds it, run as its `.cact` runs and scored on the
//! held-out examples, so the smallest rung that still makes the calls can be picked. A progress
//! bar on a terminal, or `--events jsonl` for the app; Ctrl-C, or `cancel` on stdin with events,
//! stops the sweep, which then prints no table.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::{Context, Result};
use indicatif::ProgressBar;
use needle_engine::calls::ladder::{Ladder, LadderEvent, LadderModel};
use needle_engine::calls::AnswerKind;
use needle_engine::dataset::Example;
use needle_engine::generation::Generation;
use needle_engine::model::Device;
use needle_engine::tokenizer::Tokenizer;

use crate::events::{cancel_on_stdin, print_json, EventFormat};
use crate::inputs::WeightsInputs;
use crate::progress;

/// The ladder's flags, beside `needle eval`'s.
#[derive(Debug, Clone, Default, clap::Args, serde::Serialize)]
pub struct LadderArgs {
    /// Score each rung of a Needle 3 model's depth ladder (every depth is a smaller model) on the
    /// examples instead: exact calls and why the others are wrong, the size of its .cact and its
    /// decoding tokens/s, each rung built as `needle build --layers N` builds it and run as the
    /// .cact runs (CQ-W4 weights, 8-bit activations and KV cache)
    #[arg(long, conflicts_with_all = ["weights", "accuracy", "quant_rows"])]
    pub ladder: bool,
    /// With --ladder, only these depths (comma-separated) [default: every rung, 2 to the model's layers]
    #[arg(long, requires = "ladder", value_delimiter = ',', value_name = "LAYERS")]
    #[serde(serialize_with = "comma_separated")]
    pub rungs: Vec<usize>,
    /// With --ladder, print progress as one JSON event per line on stdout, the ladder in the last
    /// (`finished`); a line `cancel` on stdin then stops the sweep like Ctrl-C
    #[arg(long, value_enum, requires = "ladder")]
    pub events: Option<EventFormat>,
}

/// Depths as `--rungs` reads them (`2,4,8`); none as no flag.
fn comma_separated<S: serde::Serializer>(rungs: &[usize], serializer: S) -> Result<S::Ok, S::Error> {
    let written: Vec<String> = rungs.iter().map(usize::to_string).collect();
    match written.is_empty() {
        true => serializer.serialize_none(),
        false => serializer.serialize_str(&written.join(",")),
    }
}

/// Sweeps the ladder of the model `inputs` name over the examples `held_out` reads for its
/// generation, printing a table (or JSON with `json`) at the end.
pub fn run(
    args: &LadderArgs,
    inputs: &WeightsInputs,
    json: bool,
    device: &Device,
    held_out: impl FnOnce(Generation) -> Result<Vec<Example>>,
) -> Result<()> {
    let cancel = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&cancel);
    ctrlc::set_handler(move || flag.store(true, Ordering::Relaxed)).context("installing the Ctrl-C handler")?;
    if args.events.is_some() {
        cancel_on_stdin(&cancel);
    }
    let base =
        crate::download::base_model_of(inputs.generation, inputs.checkpoint.as_deref(), inputs.tokenizer.as_deref())?;
    let tokenizer = Tokenizer::load(&base.tokenizer)?;
    // Loaded first: a model without a ladder is told so before the dataset is read.
    let model = LadderModel::load(&base.checkpoint, inputs.lora.as_deref(), tokenizer)?;
    let examples = held_out(model.generation())?;
    let rungs = if args.rungs.is_empty() { model.depths() } else { args.rungs.clone() };
    let climbed = match args.events {
        Some(EventFormat::Jsonl) => {
            // When the reader of the events is gone (the app closed), stop as a cancel would.
            let climbed = model.climb(&rungs, &examples, device, &cancel, |event| {
                if print_json(&event).is_err() {
                    cancel.store(true, Ordering::Relaxed);
                }
            });
            climbed.inspect_err(|error| drop(print_json(&LadderEvent::Failed { message: error.to_string() })))?
        }
        None => {
            let view = ProgressView::new();
            let climbed = model.climb(&rungs, &examples, device, &cancel, |event| view.show(&event));
            view.bar.finish_and_clear();
            climbed?
        }
    };
    let Some(ladder) = climbed else {
        anyhow::bail!("the ladder sweep was cancelled: no table, as a partial ladder would rank rungs it never tried")
    };
    match (args.events, json) {
        (Some(_), _) => Ok(()),
        (None, true) => Ok(outln!("{}", serde_json::to_string(&ladder)?)?),
        (None, false) => print_table(&ladder),
    }
}

/// The terminal's view of a sweep: one bar over every answer of every rung.
struct ProgressView {
    bar: ProgressBar,
}

impl ProgressView {
    fn new() -> Self {
        Self { bar: progress::bar(0, "{pos}/{len} answers  eta {eta}  {msg}") }
    }

    fn show(&self, event: &LadderEvent) {
        match event {
            LadderEvent::Started { rungs, examples } => self.bar.set_length((rungs.len() * examples) as u64),
            LadderEvent::Rung { layers, index, of } => {
                self.bar.set_message(format!("rung {index}/{of}: {layers} layers"))
            }
            LadderEvent::Answered { .. } => self.bar.inc(1),
            LadderEvent::Scored { rung } => self.bar.println(format!(
                "  {:<9} {:>2} layers  {}/{} exact calls",
                "scored", rung.layers, rung.calls.exact, rung.calls.examples
            )),
            LadderEvent::Finished { .. } | LadderEvent::Cancelled { .. } | LadderEvent::Failed { .. } => {}
        }
    }
}

/// One line per rung: its exact calls, file size and decoding speed, and why the others are wrong.
fn print_table(ladder: &Ladder) -> Result<()> {
    outln!(
        "  {:<9} {} layers; {} examples; each rung as its .cact runs (CQ-W4 weights, 8-bit activations and KV)",
        "ladder",
        ladder.num_layers,
        ladder.examples
    )?;
    outln!("  {:<9} {:<16} {:>9}  {:>12}", "layers", "exact calls", ".cact", "decode")?;
    for rung in &ladder.rungs {
        let calls = &rung.calls;
        let exact = format!("{}/{} ({:.0}%)", calls.exact, calls.examples, 100.0 * calls.exact_rate);
        let wrong = wrong_kinds(&calls.breakdown.kinds).map(|w| format!("  ({w})")).unwrap_or_default();
        outln!(
            "  {:<9} {exact:<16} {:>6.2} MB  {:>6.0} tok/s{wrong}",
            rung.layers,
            rung.cact_bytes as f64 / 1e6,
            calls.decode_tokens_per_s
        )?;
    }
    Ok(())
}

/// `2 wrong tool, 1 false refusal`: the kinds of the wrong answers, as the JSON names them;
/// `None` when there are none.
pub(crate) fn wrong_kinds(kinds: &BTreeMap<AnswerKind, usize>) -> Option<String> {
    let wrong: Vec<String> = (kinds.iter())
        .filter(|(kind, _)| **kind != AnswerKind::Exact)
        .map(|(kind, n)| format!("{n} {}", kind.label()))
        .collect();
    (!wrong.is_empty()).then(|| wrong.join(", "))
}
