//! `needle run`: one question to a model — base, tuned or a built `.cact` — answered by greedy
//! decoding from the prompt training renders; prints the reasoning, the calls acted on, those the
//! schema and grounding checks withheld (each with why), and the turn's confidence.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result};
use needle_engine::backend::{self, DeviceRequest};
use needle_engine::calls::{answer, parse_reasoning, parse_tools, Answer};
use needle_engine::checks::{Call, CheckedAnswer, Turn, Withheld};
use needle_engine::dataset::{render, Example};
use needle_engine::model::Completion;
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
    /// Print one JSON object {"text", "calls" (acted on; null without a call list), "withheld",
    /// "confidence", "decode", "head", "stop", "tokens_per_s", …}
    #[arg(long)]
    pub json: bool,
}

/// What `--json` prints: the answer as checked, and its speed.
#[derive(Serialize)]
struct Printed<'a> {
    text: &'a str,
    /// The calls acted on; `None` when the answer holds no call list.
    calls: Option<&'a [Call]>,
    withheld: &'a [Withheld],
    confidence: f64,
    decode: f64,
    head: Option<f64>,
    #[serde(flatten)]
    completion: &'a Completion,
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
    let answer = answer(&model.network, model.head.as_ref(), &model.tokenizer, &prompt, args.max_new)?;
    let offered = tools.as_array().map(Vec::as_slice).unwrap_or_default();
    let turn = Turn { tools: offered, query: &args.query, system: &args.system };
    let checked = CheckedAnswer::check(answer.calls.as_deref(), answer.confidence, turn, 0.0);
    let mut out = std::io::stdout().lock();
    if args.json {
        let printed = Printed {
            text: &answer.text,
            calls: answer.calls.as_ref().map(|_| checked.calls.as_slice()),
            withheld: &checked.withheld,
            confidence: answer.confidence,
            decode: answer.decode,
            head: answer.head,
            completion: &answer.completion,
            tokens_per_s: answer.completion.tokens_per_s(),
        };
        writeln!(out, "{}", serde_json::to_string(&printed)?)?;
        return Ok(());
    }
    writeln!(out, "  {:<9} {}", "model", model.label)?;
    print_answer(&mut out, &answer, &checked)?;
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

/// The reasoning, the calls acted on and withheld, and the confidence of `answer`, `checked`.
fn print_answer(out: &mut impl Write, answer: &Answer, checked: &CheckedAnswer) -> std::io::Result<()> {
    let reasoning = parse_reasoning(&answer.text);
    writeln!(out, "  {:<9} {}", "think", reasoning.unwrap_or("(none)"))?;
    if answer.calls.is_none() {
        writeln!(out, "  {:<9} none parseable; the answer was: {}", "calls", answer.text)?;
    } else if checked.calls.is_empty() && checked.withheld.is_empty() {
        writeln!(out, "  {:<9} (no call)", "calls")?;
    }
    for call in &checked.calls {
        writeln!(out, "  {:<9} {}", "call", call.to_value())?;
    }
    for withheld in &checked.withheld {
        writeln!(out, "  {:<9} {}: {}", "withheld", withheld.call, withheld.reason)?;
    }
    let head = match answer.head {
        Some(head) => format!("confidence head {head:.3}"),
        None => "no confidence head".to_string(),
    };
    writeln!(out, "  {:<9} {:.3} (decode probability {:.3}; {head})", "confident", answer.confidence, answer.decode)
}

#[cfg(test)]
mod tests {
    use needle_engine::model::Stop;
    use serde_json::{json, Value};

    use super::*;

    fn printed(text: &str, tools: Value) -> String {
        let calls = needle_engine::calls::parse_calls(text);
        let completion = Completion {
            ids: vec![],
            probabilities: vec![],
            stop: Stop::EndOfTurn,
            prompt_tokens: 0,
            prefill_seconds: 0.0,
            decode_seconds: 0.0,
        };
        let answer = Answer { text: text.into(), calls, confidence: 0.42, decode: 0.42, head: None, completion };
        let turn = Turn { tools: tools.as_array().unwrap(), query: "21 degrees please", system: "" };
        let checked = CheckedAnswer::check(answer.calls.as_deref(), answer.confidence, turn, 0.0);
        let mut out = Vec::new();
        print_answer(&mut out, &answer, &checked).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn the_calls_acted_on_the_withheld_ones_with_why_and_the_confidence_are_printed() {
        let tools = json!([{"name": "set_thermostat", "parameters": {"type": "object",
            "properties": {"temperature": {"type": "integer", "minimum": 10, "maximum": 30}}}}]);
        let text = r#"<think>warm</think><tool_call>[{"name":"set_thermostat","arguments":{"temperature":21}},{"name":"set_thermostat","arguments":{"temperature":45}},{"name":"open_door","arguments":{}}]</tool_call>"#;
        let said = printed(text, tools.clone());
        let lines: Vec<&str> = said.lines().map(str::trim).collect();
        assert_eq!(
            lines,
            [
                "think     warm",
                r#"call      {"name":"set_thermostat","arguments":{"temperature":21}}"#,
                r#"withheld  {"name":"set_thermostat","arguments":{"temperature":45}}: temperature is 45, outside maximum 30"#,
                r#"withheld  {"name":"open_door","arguments":{}}: unknown tool "open_door""#,
                "confident 0.420 (decode probability 0.420; no confidence head)",
            ]
        );
        // A turn whose only call is withheld acts on nothing, and says what it held back, not "(no call)".
        let said = printed(r#"<tool_call>[{"name":"open_door","arguments":{}}]</tool_call>"#, tools.clone());
        assert!(said.contains("withheld") && !said.contains("(no call)"), "{said}");
        assert!(printed("<tool_call>[]</tool_call>", tools.clone()).contains("calls     (no call)"));
        assert!(printed("no calls here", tools).contains("none parseable; the answer was: no calls here"));
    }
}
