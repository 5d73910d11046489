//! `needle eval`: the masked answer loss of a model (a checkpoint, with an adapter, or a built
//! `.cact`) over a whole dataset file, and with `--accuracy` its exact-call accuracy.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

use crate::inputs::{Model, WeightsInputs};
use crate::ladder::wrong_kinds;
use anyhow::{Context, Result};
use needle_engine::backend::{self, DeviceRequest};
use needle_engine::calls::reliability::{Interval, MAX_RIGHT_STOPPED};
use needle_engine::calls::{accuracy, Accuracy, Answered, ModelScore, Precision, QuantRows, Reliability, Weights};
use needle_engine::confidence::TurnHead;
use needle_engine::dataset::{Dataset, Encoded, Example};
use needle_engine::generation::Generation;
use needle_engine::model::{evaluate, Device, EvalSummary, Network};
use needle_engine::tokenizer::Tokenizer;
use needle_engine::train::finetune::split;
use needle_engine::train::memory::{activation_budget, forward_rows};
use serde::Serialize;

/// `--batch-size` when none is given.
pub const DEFAULT_BATCH_SIZE: usize = 16;

/// Measure the masked cross-entropy of the answer tokens over a JSONL file, and with `--accuracy`
/// whether the model makes exactly the expected calls.
#[derive(Debug, clap::Args, Serialize)]
pub struct Args {
    /// Dataset (.jsonl) in the reference's tool-call format
    pub data: PathBuf,
    #[command(flatten)]
    pub weights: WeightsInputs,
    /// Longest sequence length; rows use the reference's fit_max_len bucket under it
    #[arg(long, default_value_t = 1024)]
    pub max_len: usize,
    /// Examples per forward pass, fewer when the device's memory holds fewer (the result does not change)
    #[arg(long, default_value_t = DEFAULT_BATCH_SIZE)]
    pub batch_size: usize,
    /// Only the examples a `needle finetune` with this --val-split (and --seed) holds out
    #[arg(long)]
    pub val_split: Option<f64>,
    /// The seed of that split
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// At most this many examples (the first, in file or split order)
    #[arg(long)]
    pub max_examples: Option<usize>,
    /// Also answer every example by greedy decoding and score the calls acted on (those that pass the
    /// tools' schemas and the grounding check): exact-call accuracy, the share of answers that parse,
    /// accuracy per tool, why the others are wrong (by kind, withheld calls among them; per tool; which
    /// tool was called for which), each answer's confidence, and how far it can be relied on: AUROC and
    /// ECE with bootstrap 90% intervals, the reliability table and the trade-off of a confidence gate
    #[arg(long)]
    pub accuracy: bool,
    /// With --accuracy, write the examples answered wrong to this .jsonl, one a line: its file line, the
    /// query, the expected and the given calls (null when they do not parse), the whole answer, and its
    /// verdict (the kind of mistake and what differs)
    #[arg(long, requires = "accuracy")]
    pub answers: Option<PathBuf>,
    /// With --answers, write every answer, the right ones too, each with "exact", "confidence",
    /// "decode" and "head" (null without a confidence head: a trained one beside the adapter, or the one a
    /// .cact carries): what the figures are made from
    #[arg(long, requires = "answers")]
    pub all_answers: bool,
    /// With --accuracy, three rows: the checkpoint (and adapter) as given; the same weights with the
    /// deployment's quantization simulated (CQ-W4 weights, 8-bit activations and KV cache, as a .cact
    /// runs); and CACT, the .cact built from them, run from its own codes (W4A8: its attention projections
    /// and output head multiplied from the CQ codes with 8-bit activations on the integer kernels), its
    /// answers read by the confidence head it carries, if any
    #[arg(long, value_name = "CACT", requires = "accuracy", conflicts_with = "weights")]
    pub quant_rows: Option<PathBuf>,
    #[command(flatten)]
    pub ladder: crate::ladder::LadderArgs,
    /// Force a backend (auto, cpu, cuda, metal); default: NEEDLE_DEVICE, else auto
    #[arg(long)]
    pub device: Option<String>,
    /// Print one JSON line {"loss", "examples", "tokens", "seq_len", "tokens_per_s"[, "accuracy" (its
    /// "confidence": {"auroc", "ece", "bins", "tradeoff", …})][,
    /// "quant_rows": {"float", "simulated", "cact"}]} instead of text; with --ladder, the ladder
    /// {"num_layers", "examples", "rungs": [{"layers", "cact_bytes", "calls"}]}
    #[arg(long)]
    pub json: bool,
}

/// What `--json` prints.
#[derive(Serialize)]
struct Printed {
    #[serde(flatten)]
    loss: EvalSummary,
    #[serde(skip_serializing_if = "Option::is_none")]
    accuracy: Option<Accuracy>,
    #[serde(skip_serializing_if = "Option::is_none")]
    quant_rows: Option<QuantRows>,
    /// Every answer, for the text's table of confidences.
    #[serde(skip)]
    answers: Vec<Answered>,
}

pub fn run(args: Args) -> Result<()> {
    let selected = backend::select(DeviceRequest::resolve(args.device.as_deref())?)?;
    noteln!("  {:<9} {}  {}", "backend", selected.info.backend, selected.info.device);
    if args.ladder.ladder {
        let examples = |generation| held_out(&args, load_dataset(&args, generation)?.examples);
        return crate::ladder::run(&args.ladder, &args.weights, args.json, &selected.device, examples);
    }
    let model = args.weights.load(&selected.device)?;
    // Loaded before any scoring, so that a .cact of another model is refused at once.
    let quantized = (args.quant_rows.as_deref())
        .map(|cact| Quantized::load(&args.weights, &selected.device, &model, cact))
        .transpose()?;
    let dataset = load_dataset(&args, model.network.config().generation)?;
    let prepared = dataset.prepare(&model.tokenizer, args.max_len)?;
    // Passes of as many rows as the device's memory holds. Rows are not cut at the model's own
    // length, as the reference's whole-file loss does not cut them; one too long for any pass is
    // an error that says so, not an allocation that fails.
    let budget = activation_budget(&selected.device);
    let rows_per_pass = forward_rows(model.network.config(), prepared.seq_len, args.batch_size, budget);
    anyhow::ensure!(
        rows_per_pass > 0,
        "{}: a row of {} tokens needs more than the {} MB one pass may hold on this device; lower --max-len",
        args.data.display(),
        prepared.seq_len,
        budget >> 20
    );
    let pairs: Vec<(Encoded, Example)> = prepared.rows().zip(dataset.examples).collect();
    let (rows, examples): (Vec<Encoded>, Vec<Example>) = held_out(&args, pairs)?.into_iter().unzip();
    let held = Held { rows, examples, seq_len: prepared.seq_len, rows_per_pass };
    let loss = evaluate(&model.network, held.rows.iter().cloned(), held.seq_len, rows_per_pass, |done, total| {
        report_progress("eval", done, total)
    })
    .with_context(|| format!("evaluating {}", model.label))?;
    end_progress();
    let answered = match args.accuracy {
        true => Some(held.answer(&model.network, model.head.as_ref(), &model.tokenizer, "answer")?),
        false => None,
    };
    if let (Some(path), Some((_, all))) = (&args.answers, &answered) {
        let written: Vec<&Answered> = all.iter().filter(|answer| args.all_answers || !answer.exact).collect();
        write_answers(path, &written)?;
        let which = if args.all_answers { "" } else { " wrong" };
        noteln!("  {:<9} {}{which} answers in {}", "answers", written.len(), path.display());
    }
    let quant_rows = match (quantized, &answered) {
        (Some(quantized), Some((calls, all))) => {
            let float = ModelScore { loss: loss.loss, calls: calls.clone(), wrong: wrong_of(all) };
            // The simulated weights are the same model's, so its head reads them; the `.cact`'s
            // answers are read by the head it carries, if any.
            let simulated = held.score(&quantized.simulated, model.head.as_ref(), &model.tokenizer, "simulated")?;
            let cact = held.score(&quantized.cact, quantized.head.as_ref(), &model.tokenizer, "cact")?;
            Some(QuantRows { float, simulated, cact })
        }
        _ => None,
    };
    let (accuracy, answers) = answered.unzip();
    let printed = Printed { loss, accuracy, quant_rows, answers: answers.unwrap_or_default() };
    let mut out = std::io::stdout().lock();
    match args.json {
        true => writeln!(out, "{}", serde_json::to_string(&printed)?).map_err(Into::into),
        false => print_summary(&mut out, &printed),
    }
}

/// The dataset file as `generation` reads it, its problems noted.
fn load_dataset(args: &Args, generation: Generation) -> Result<Dataset> {
    let dataset = Dataset::load(&args.data, generation)?;
    for problem in &dataset.problems {
        noteln!("  {:<9} {}: {problem}", "warning", args.data.display());
    }
    Ok(dataset)
}

/// The examples (with what goes with each) that are scored: those a training with `--val-split`
/// and `--seed` holds out, else all, at most `--max-examples` of them.
fn held_out<T>(args: &Args, mut examples: Vec<T>) -> Result<Vec<T>> {
    if let Some(fraction) = args.val_split {
        anyhow::ensure!((0.0..1.0).contains(&fraction), "--val-split {fraction}: use a fraction in [0, 1)");
        examples = split(examples, fraction, args.seed).1;
        anyhow::ensure!(!examples.is_empty(), "--val-split {fraction} holds out no example of {}", args.data.display());
    }
    examples.truncate(args.max_examples.unwrap_or(usize::MAX));
    Ok(examples)
}

/// The examples scored, their rows, and how the rows' loss is computed.
struct Held {
    rows: Vec<Encoded>,
    examples: Vec<Example>,
    seq_len: usize,
    rows_per_pass: usize,
}

impl Held {
    /// `network`'s answers to every example (read by `head` when it has a trained one): its
    /// accuracy, and the answers in file order.
    fn answer(
        &self,
        network: &Network,
        head: Option<&TurnHead>,
        tokenizer: &Tokenizer,
        what: &str,
    ) -> Result<(Accuracy, Vec<Answered>)> {
        let mut all = Vec::new();
        let score = accuracy(
            network,
            head,
            tokenizer,
            &self.examples,
            &AtomicBool::new(false),
            |done, total| report_progress(what, done, total),
            |answered| all.push(answered),
        )?;
        end_progress();
        all.sort_by_key(|answered| answered.line);
        Ok((score, all))
    }

    /// `network`'s loss over the rows and its answers, reported as `what`.
    fn score(
        &self,
        network: &Network,
        head: Option<&TurnHead>,
        tokenizer: &Tokenizer,
        what: &str,
    ) -> Result<ModelScore> {
        let progress = |done, total| report_progress(&format!("{what} loss"), done, total);
        let loss = evaluate(network, self.rows.iter().cloned(), self.seq_len, self.rows_per_pass, progress)
            .with_context(|| format!("evaluating the {what} row"))?
            .loss;
        end_progress();
        let (calls, all) = self.answer(network, head, tokenizer, &format!("{what} calls"))?;
        Ok(ModelScore { loss, calls, wrong: wrong_of(&all) })
    }
}

/// The networks of the two quantized rows: the given weights with the deployment's quantization
/// simulated, and the `.cact` built from them, run from its own codes as the Needle engine runs
/// it (W4A8), with the confidence head the `.cact` carries.
struct Quantized {
    simulated: Network,
    cact: Network,
    head: Option<TurnHead>,
}

impl Quantized {
    fn load(weights: &WeightsInputs, device: &Device, model: &Model, cact: &Path) -> Result<Self> {
        let simulated = weights.load_as(device, Precision::Simulated)?.network;
        let built = Weights::Cact(cact.to_path_buf()).load_as(device, Precision::W4a8)?;
        let (head, built) = (built.head, built.network);
        let (ours, theirs) = (model.network.config(), built.config());
        anyhow::ensure!(
            (ours.generation, ours.d_model, ours.vocab_size) == (theirs.generation, theirs.d_model, theirs.vocab_size),
            "{} is a {} model of width {} and vocabulary {}, not a build of {} ({}, {}, {}); pass the .cact built \
             from it",
            cact.display(),
            theirs.generation,
            theirs.d_model,
            theirs.vocab_size,
            model.label,
            ours.generation,
            ours.d_model,
            ours.vocab_size
        );
        Ok(Self { simulated, cact: built, head })
    }
}

/// The answers that are not exact.
fn wrong_of(answers: &[Answered]) -> Vec<Answered> {
    answers.iter().filter(|answer| !answer.exact).cloned().collect()
}

/// Answers as JSON lines, written atomically.
fn write_answers(path: &Path, answers: &[&Answered]) -> Result<()> {
    let mut text = String::new();
    for answered in answers {
        text.push_str(&serde_json::to_string(answered)?);
        text.push('\n');
    }
    needle_engine::atomic::write_atomically(path, text.as_bytes())
        .with_context(|| format!("cannot write {}; check that the directory exists and is writable", path.display()))
}

/// A progress line redrawn in place on a terminal; on a pipe or in a log, where a redraw would run
/// into the last, one line per update. [`end_progress`] ends it.
pub(crate) fn report_progress(what: &str, done: usize, total: usize) {
    if std::io::stderr().is_terminal() {
        note!("\r  {what:<9} {done}/{total} examples");
        // Progress is best-effort: a closed stderr must not fail the evaluation.
        let _ = std::io::stderr().flush();
    } else {
        noteln!("  {what:<9} {done}/{total} examples");
    }
}

/// Ends the progress line on a terminal (elsewhere each update ended its own).
pub(crate) fn end_progress() {
    if std::io::stderr().is_terminal() {
        noteln!();
    }
}

/// The loss, the accuracy and why answers are wrong (withheld calls among the kinds), and the
/// quantized rows, as text.
fn print_summary(out: &mut impl Write, printed: &Printed) -> Result<()> {
    let loss = &printed.loss;
    writeln!(
        out,
        "  {:<9} {:.4}  ({} answer tokens in {} examples, seq_len {}, {:.0} tokens/s)",
        "loss", loss.loss, loss.tokens, loss.examples, loss.seq_len, loss.tokens_per_s
    )?;
    if let Some(score) = &printed.accuracy {
        writeln!(
            out,
            "  {:<9} {}/{} exact calls ({:.1}%)  {:.1}% parse  {:.0} tokens/s decoding",
            "accuracy",
            score.exact,
            score.examples,
            100.0 * score.exact_rate,
            100.0 * score.parse_rate,
            score.tokens_per_s
        )?;
        let breakdown = &score.breakdown;
        for (tool, tally) in &score.per_tool {
            let line = format!("{tool}  {}/{}", tally.right, tally.total);
            match breakdown.per_tool.get(tool).and_then(wrong_kinds) {
                Some(wrong) => writeln!(out, "  {:<9} {line}  ({wrong})", "")?,
                None => writeln!(out, "  {:<9} {line}", "")?,
            }
        }
        let wrong = wrong_kinds(&breakdown.kinds);
        writeln!(out, "  {:<9} {}", "wrong", wrong.as_deref().unwrap_or("none"))?;
        let mut confused: Vec<(&String, &String, usize)> = (breakdown.confusion.iter())
            .flat_map(|(expected, called)| called.iter().map(move |(called, n)| (expected, called, *n)))
            .filter(|(expected, called, _)| expected != called)
            .collect();
        confused.sort_by_key(|(.., n)| std::cmp::Reverse(*n));
        for (expected, called, n) in confused.iter().take(CONFUSIONS_SHOWN) {
            writeln!(out, "  {:<9} {called} for {expected}  ×{n}", "called")?;
        }
        for answer in &printed.answers {
            let kind = answer.verdict.as_ref().map_or("", |verdict| verdict.kind().label());
            let confidence = answer.confidence.map_or("-".to_string(), |c| format!("{c:.3}"));
            writeln!(out, "  {:<9} line {:<5} confidence {confidence}  {kind}", "answer", answer.line)?;
        }
        if let Some(figures) = &score.confidence {
            print_reliability(out, figures)?;
        }
    }
    if let Some(rows) = &printed.quant_rows {
        let named = [("float", &rows.float), ("simulated", &rows.simulated), (".cact", &rows.cact)];
        for (i, (name, row)) in named.into_iter().enumerate() {
            let wrong = wrong_kinds(&row.calls.breakdown.kinds).map(|w| format!("  ({w})")).unwrap_or_default();
            writeln!(
                out,
                "  {:<9} {name:<9}  {}/{} exact calls  loss {:.4}{wrong}",
                if i == 0 { "rows" } else { "" },
                row.calls.exact,
                row.calls.examples,
                row.loss
            )?;
        }
    }
    Ok(())
}

/// How far the confidence can be relied on: AUROC and ECE with their intervals, the reliability
/// table and the trade-off of a gate at each threshold.
fn print_reliability(out: &mut impl Write, figures: &Reliability) -> Result<()> {
    let interval =
        |i: Option<Interval>| i.map_or(String::new(), |i| format!(" (90% interval {:.3}–{:.3})", i.low, i.high));
    let share = |x: Option<f64>| x.map_or("-".to_string(), |x| format!("{:.0}%", 100.0 * x));
    let auroc = figures.auroc.map_or("- (needs right and wrong answers)".to_string(), |a| format!("{a:.3}"));
    writeln!(
        out,
        "  {:<9} {auroc}{}  over {} answers, {} right",
        "AUROC",
        interval(figures.auroc_interval),
        figures.answers,
        figures.right
    )?;
    writeln!(out, "  {:<9} {:.3}{}", "ECE", figures.ece, interval(Some(figures.ece_interval)))?;
    for bin in &figures.bins {
        let right = share((bin.answers > 0).then(|| bin.right as f64 / bin.answers as f64));
        let mean = bin.confidence.map_or("-".to_string(), |c| format!("{c:.3}"));
        writeln!(
            out,
            "  {:<9} {:.1}–{:.1}  {:>4} answers  {right:>4} right  mean confidence {mean}",
            "bin", bin.from, bin.to, bin.answers
        )?;
    }
    for row in &figures.tradeoff {
        writeln!(
            out,
            "  {:<9} {:.2}  keeps {:>4} of right answers, stops {:>4} of wrong ones",
            "gate",
            row.threshold,
            share(row.kept_right),
            share(row.stopped_wrong)
        )?;
    }
    let proposed = figures.at(figures.proposed);
    writeln!(
        out,
        "  {:<9} {:.2}  (the highest that stops at most {:.0}% of right answers: keeps {}, stops {} of wrong ones)",
        "proposed",
        figures.proposed,
        100.0 * MAX_RIGHT_STOPPED,
        share(proposed.and_then(|row| row.kept_right)),
        share(proposed.and_then(|row| row.stopped_wrong))
    )?;
    Ok(())
}

/// The most frequent confusions of tools the text summary lists (the JSON has them all).
const CONFUSIONS_SHOWN: usize = 5;

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use needle_engine::calls::{AnswerKind, Breakdown, ToolScore};

    use super::*;

    #[test]
    fn answers_whose_calls_were_withheld_are_a_kind_of_their_own_in_the_summary() {
        let kinds = BTreeMap::from([(AnswerKind::Exact, 3), (AnswerKind::Withheld, 2), (AnswerKind::FalseFire, 1)]);
        let accuracy = Accuracy {
            examples: 6,
            exact: 3,
            parsed: 6,
            exact_rate: 0.5,
            parse_rate: 1.0,
            per_tool: BTreeMap::from([("set_thermostat".to_string(), ToolScore { right: 3, total: 6 })]),
            breakdown: Breakdown {
                per_tool: BTreeMap::from([("set_thermostat".to_string(), kinds.clone())]),
                kinds,
                ..Breakdown::default()
            },
            ..Accuracy::default()
        };
        let loss = EvalSummary { loss: 0.5, examples: 6, tokens: 60, seq_len: 64, tokens_per_s: 100.0 };
        let mut out = Vec::new();
        print_summary(&mut out, &Printed { loss, accuracy: Some(accuracy), quant_rows: None, answers: vec![] })
            .unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains("set_thermostat  3/6  (2 withheld, 1 false fire)"), "{text}");
        assert!(text.contains("wrong     2 withheld, 1 false fire"), "{text}");
    }
}
