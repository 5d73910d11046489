//! `needle run`: one question to a model — base, tuned or a built `.cact` — answered by greedy
//! decoding from the prompt training renders; prints the reasoning and the parsed calls.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result};
use needle_engine::backend::{self, DeviceRequest};
use needle_engine::calls::{answer, parse_reasoning, parse_tools, Answer};
use needle_engine::dataset::{render, Example};
use serde::Serialize;

use crate::inputs::WeightsInputs;

/// Ask a model one question with a set of tools and print the calls it makes.
#[derive(Debug, clap::Args, serde::Serialize)]
pub struct Args {
    #[command(flatten)]
    pub weights: WeightsInputs,
    /// Tool schemas: a JSON file holding the list the dataset's `tools` field would
    #[arg(long)]
    pub tools: PathBuf,
    /// The user's request
    #[arg(long, allow_hyphen_values = true)]
    pub query: String,
    /// A system prompt (none by default, as in training data without one)
    #[arg(long, default_value = "", allow_hyphen_values = true)]
    pub system: String,
    /// Most new tokens to decode
    #[arg(long, default_value_t = 256)]
    pub max_new: usize,
    /// auto, cpu, cuda or metal [default: NEEDLE_DEVICE, else auto]
    #[arg(long)]
    pub device: Option<String>,
    /// Print one JSON object {"text", "calls", "tokens_per_s", …}
    #[arg(long)]
    pub json: bool,
}

/// What `--json` prints: the answer and its speed.
#[derive(Serialize)]
struct Printed<'a> {
    #[serde(flatten)]
    answer: &'a Answer,
    tokens_per_s: f64,
}

pub fn run(args: Args) -> Result<()> {
    let selected = backend::select(DeviceRequest::resolve(args.device.as_deref())?)?;
    let text = std::fs::read_to_string(&args.tools).with_context(|| format!("cannot read {}", args.tools.display()))?;
    let tools = parse_tools(&text).map_err(|problem| anyhow::anyhow!("{}: {problem}", args.tools.display()))?;
    let model = args.weights.load(&selected.device)?;
    let generation = model.network.config().generation;
    let question = Example::question(&tools, &args.query, &args.system, generation)
        .map_err(|issue| anyhow::anyhow!("--query and --system with {}: {issue}", args.tools.display()))?;
    let (prompt, _) = render(&question);
    let answer = answer(&model.network, &model.tokenizer, &prompt, args.max_new)?;
    let mut out = std::io::stdout().lock();
    if args.json {
        writeln!(
            out,
            "{}",
            serde_json::to_string(&Printed { answer: &answer, tokens_per_s: answer.completion.tokens_per_s() })?
        )?;
        return Ok(());
    }
    writeln!(out, "  {:<9} {}", "model", model.label)?;
    let reasoning = parse_reasoning(&answer.text);
    writeln!(out, "  {:<9} {}", "think", reasoning.unwrap_or("(none)"))?;
    match &answer.calls {
        Some(calls) if calls.is_empty() => writeln!(out, "  {:<9} (no call)", "calls")?,
        Some(calls) => {
            for call in calls {
                writeln!(out, "  {:<9} {call}", "call")?;
            }
        }
        None => writeln!(out, "  {:<9} none parseable; the answer was: {}", "calls", answer.text)?,
    }
    let g = &answer.completion;
    writeln!(
        out,
        "  {:<9} {} tokens in {:.2}s ({:.1} tokens/s; {} prompt tokens prefilled in {:.0} ms)",
        "speed",
        g.ids.len(),
        g.prefill_seconds + g.decode_seconds,
        g.tokens_per_s(),
        g.prompt_tokens,
        g.prefill_seconds * 1e3
    )?;
    Ok(())
}
