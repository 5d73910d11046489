//! `needle generate-data`: training rows written by an LLM through an OpenAI-compatible endpoint
//! (the reference's `generate_main` and `augment_jsonl`), every row checked by the dataset doctor
//! before it is kept, in the shares of no-call and parallel rows asked for; an acceptance suite for
//! the same tools when asked (`--suite`); and the rows for `needle finetune --generate N`.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use indicatif::ProgressBar;
use needle_engine::atomic::write_atomically;
use needle_engine::dataset::{query_key, Dataset, Example};
use needle_engine::generate::{
    self, Endpoint, GenerateEvent, GenerateSettings, Generated, GeneratedSuite, Mix, SuiteRequest,
};
use needle_engine::generation::Generation;
use serde::Serialize;
use serde_json::Value;

use crate::events::{cancel_on_stdin, print_json, EventFormat};
use crate::progress;

/// Write training data with an LLM: for tool schemas, or more of an existing dataset.
#[derive(Debug, clap::Args, serde::Serialize)]
#[command(group(clap::ArgGroup::new("source").required(true).args(["tools", "augment"])))]
pub struct Args {
    /// Tool schemas (a JSON list) to write examples for
    #[arg(long)]
    pub tools: Option<PathBuf>,
    /// A dataset to write more of: its rows' tools are asked for, and the output holds its rows, then the new ones
    #[arg(long)]
    pub augment: Option<PathBuf>,
    /// How many new rows to keep (0 with --suite: the suite alone)
    #[arg(long, default_value_t = generate::DEFAULT_NUM_SAMPLES)]
    pub num_samples: usize,
    /// The share of new rows that must get no call: requests missing a required value, negated, outside a
    /// tool's bounds or served by no tool, asked for about equally [default: the LLM's mix, as the reference]
    #[arg(long, value_name = "SHARE")]
    pub negative_share: Option<f64>,
    /// The share of new rows with two calls or more [default: the LLM's mix]
    #[arg(long, value_name = "SHARE")]
    pub parallel_share: Option<f64>,
    /// Also write an acceptance suite for the same tools (`needle suite` scores a model on it): six categories in
    /// upstream's proportions, no query of the dataset's
    #[arg(long, value_name = "OUT.suite.json")]
    pub suite: Option<PathBuf>,
    /// Cases in the suite (upstream's suites have 32: 18 positive, 4 missing, 3 irrelevant, 3 negation,
    /// 2 invalid, 2 parallel)
    #[arg(long, default_value_t = generate::DEFAULT_SUITE_CASES, requires = "suite")]
    pub suite_cases: usize,
    /// Rows asked for in one request
    #[arg(long, default_value_t = generate::DEFAULT_BATCH_SIZE)]
    pub batch_size: usize,
    /// Requests in flight at once
    #[arg(long, default_value_t = generate::DEFAULT_WORKERS)]
    pub workers: usize,
    #[command(flatten)]
    pub llm: Llm,
    /// Output JSONL [default: needle_data.jsonl with --tools, DATA.augmented.jsonl with --augment]
    #[arg(long)]
    pub output: Option<PathBuf>,
    /// Print progress as one JSON event per line on stdout; a line `cancel` on stdin then stops like Ctrl-C
    #[arg(long, value_enum)]
    pub events: Option<EventFormat>,
}

/// Which model writes the rows, and where it is asked.
#[derive(Debug, Clone, clap::Args, serde::Serialize)]
pub struct Llm {
    /// The model the endpoint serves
    #[arg(long, default_value = generate::DEFAULT_MODEL)]
    pub model: String,
    /// OpenAI-compatible chat-completions URL [default: OPENROUTER_URL, else OpenRouter's]; the key is read
    /// from OPENROUTER_API_KEY or OPENAI_API_KEY
    #[arg(long)]
    pub endpoint: Option<String>,
    /// Seconds one request may take before it counts as failed
    #[arg(long, default_value_t = generate::DEFAULT_TIMEOUT_S)]
    pub timeout: u64,
}

/// How many rows, in what batches, how many requests at once, asked of whom; how progress is shown
/// and what stops it.
pub struct Job<'a> {
    pub num_samples: usize,
    pub batch_size: usize,
    pub workers: usize,
    pub llm: &'a Llm,
    pub events: Option<EventFormat>,
    pub cancel: &'a AtomicBool,
    pub mix: Mix,
}

pub fn run(args: Args) -> Result<()> {
    let cancel = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&cancel);
    ctrlc::set_handler(move || flag.store(true, Ordering::Relaxed)).context("installing the Ctrl-C handler")?;
    if args.events.is_some() {
        cancel_on_stdin(&cancel);
    }
    let job = Job {
        num_samples: args.num_samples,
        batch_size: args.batch_size,
        workers: args.workers,
        llm: &args.llm,
        events: args.events,
        cancel: &cancel,
        mix: Mix { negative: args.negative_share, parallel: args.parallel_share },
    };
    job.mix.check()?;
    // With --suite, --num-samples 0 writes the suite alone.
    let rows_wanted = args.num_samples > 0 || args.suite.is_none();
    let (tools, wrote) = match (&args.tools, &args.augment) {
        (Some(tools), _) => {
            let text = std::fs::read_to_string(tools).with_context(|| format!("reading {}", tools.display()))?;
            let schemas: Value = serde_json::from_str(&text)
                .with_context(|| format!("{} is not JSON; it must hold a list of tool schemas", tools.display()))?;
            if schemas.as_array().is_none_or(Vec::is_empty) {
                bail!(
                    "{} must hold a non-empty JSON list of tool schemas ([{{\"name\": ..., \"parameters\": ...}}])",
                    tools.display()
                );
            }
            let output = args.output.clone().unwrap_or_else(|| PathBuf::from("needle_data.jsonl"));
            let wrote =
                if rows_wanted { write_generated(&job, &schemas, &[], &[], &output)? } else { Wrote::default() };
            (schemas, wrote)
        }
        (None, Some(data)) => {
            let dataset = Dataset::load(data, Generation::default())?;
            let tools = dataset_tools(&dataset, data)?;
            let mut wrote = if rows_wanted {
                let output = args.output.clone().unwrap_or_else(|| generate::augmented_path(data));
                write_generated(&job, &tools, &dataset.examples, &originals(data)?, &output)?
            } else {
                Wrote::default()
            };
            wrote.queries.extend(dataset.examples.iter().map(|example| query_key(&example.query)));
            (tools, wrote)
        }
        // clap's group requires one of them.
        (None, None) => bail!("pass --tools TOOLS.json or --augment DATA.jsonl"),
    };
    match &args.suite {
        Some(path) if !wrote.cancelled => write_suite(&job, &tools, &wrote.queries, args.suite_cases, path),
        _ => Ok(()),
    }
}

/// What writing the rows left: whether it was cancelled, and every query the file holds (as
/// [`query_key`] compares them), which no suite case may repeat.
#[derive(Default)]
struct Wrote {
    cancelled: bool,
    queries: HashSet<String>,
}

/// The tools of a dataset's rows; none is an error naming the file.
fn dataset_tools(dataset: &Dataset, data: &Path) -> Result<Value> {
    let tools = generate::tools_of_examples(&dataset.examples);
    if tools.is_empty() {
        return Err(generate::GenerateError::NoTools { path: data.display().to_string() }.into());
    }
    Ok(Value::Array(tools))
}

/// The file's non-empty lines, as written.
fn originals(data: &Path) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(data).with_context(|| format!("reading {}", data.display()))?;
    Ok(text.lines().filter(|line| !line.trim().is_empty()).map(str::to_owned).collect())
}

/// Asks for the suite, then writes it to `path` atomically; says so on stdout.
fn write_suite(job: &Job, tools: &Value, avoid: &HashSet<String>, cases: usize, path: &Path) -> Result<()> {
    let endpoint = Endpoint::resolve(job.llm.endpoint.as_deref())?;
    let name = suite_name(path);
    let request = SuiteRequest {
        name: &name,
        tools,
        cases,
        avoid,
        model: &job.llm.model,
        timeout: Duration::from_secs(job.llm.timeout),
    };
    let generated = match job.events {
        Some(EventFormat::Jsonl) => generate::generate_suite(&request, &endpoint, job.cancel, |event| {
            let _ = print_json(event);
        }),
        None => {
            let view = Bar::new(cases, "cases");
            let generated = generate::generate_suite(&request, &endpoint, job.cancel, |event| view.show(event));
            view.bar.finish_and_clear();
            generated
        }
    }?;
    let text = serde_json::to_string_pretty(&generated.suite.to_json())? + "\n";
    write_atomically(path, text.as_bytes()).with_context(|| format!("writing {}", path.display()))?;
    match job.events {
        Some(EventFormat::Jsonl) => print_json(&SuiteWritten {
            event: "suite_written",
            path,
            cases: generated.suite.cases.len(),
            summary: &generated,
        })?,
        None => print_suite_summary(&generated, path)?,
    }
    Ok(())
}

/// The suite's name: its file's, without `.suite.json` (or `.json`).
fn suite_name(path: &Path) -> String {
    let file = path.file_name().map_or_else(|| "suite".into(), |name| name.to_string_lossy().into_owned());
    let name = file.strip_suffix(".json").unwrap_or(&file);
    name.strip_suffix(".suite").unwrap_or(name).to_owned()
}

/// The `--events` line after the suite is written.
#[derive(Serialize)]
struct SuiteWritten<'a> {
    event: &'static str,
    path: &'a Path,
    cases: usize,
    #[serde(flatten)]
    summary: &'a GeneratedSuite,
}

fn print_suite_summary(generated: &GeneratedSuite, path: &Path) -> Result<()> {
    let stopped = if generated.cancelled { "  (cancelled: the cases that arrived are kept)" } else { "" };
    let per: Vec<String> = (generated.wanted.iter())
        .map(|(category, wanted)| {
            format!("{category} {}/{wanted}", generated.written.get(category).copied().unwrap_or(0))
        })
        .collect();
    let wanted: usize = generated.wanted.values().sum();
    outln!("  {:<9} {}/{wanted} cases: {}{stopped}", "suite", generated.suite.cases.len(), per.join(", "))?;
    if !generated.wanted.contains_key(&needle_engine::suite::Category::Invalid) {
        outln!("  {:<9} no invalid case: no tool has an enum or a bound a value could break", "")?;
    }
    if generated.failed_requests > 0 {
        outln!("  {:<9} {} request(s)", "failed", generated.failed_requests)?;
    }
    if !generated.rejected.is_empty() {
        outln!("  {:<9} {}", "rejected", counts(&generated.rejected))?;
    }
    outln!("  {:<9} {}", "wrote", path.display())?;
    Ok(())
}

/// Writes `data`'s lines and then new rows for its tools to `output` (default `DATA.augmented.jsonl`, as
/// the reference names it); returns the path, and whether generation was cancelled.
pub fn augment(job: &Job, data: &Path, output: Option<&Path>) -> Result<(PathBuf, bool)> {
    // The rows are the user's, for whichever generation they train; read them as the default's.
    let dataset = Dataset::load(data, Generation::default())?;
    let tools = dataset_tools(&dataset, data)?;
    let output = output.map_or_else(|| generate::augmented_path(data), Path::to_owned);
    let wrote = write_generated(job, &tools, &dataset.examples, &originals(data)?, &output)?;
    Ok((output, wrote.cancelled))
}

/// Generates, then writes `originals` and the new rows to `output` atomically; says so on stdout.
fn write_generated(
    job: &Job,
    tools: &Value,
    existing: &[Example],
    originals: &[String],
    output: &Path,
) -> Result<Wrote> {
    let endpoint = Endpoint::resolve(job.llm.endpoint.as_deref())?;
    let settings = GenerateSettings {
        num_samples: job.num_samples,
        batch_size: job.batch_size,
        workers: job.workers,
        model: job.llm.model.clone(),
        timeout: Duration::from_secs(job.llm.timeout),
        mix: job.mix,
    };
    let cancel = job.cancel;
    let generated = match job.events {
        Some(EventFormat::Jsonl) => generate::generate(tools, existing, &settings, &endpoint, cancel, |event| {
            let _ = print_json(event);
        }),
        None => {
            let view = Bar::new(settings.num_samples, "rows");
            let generated = generate::generate(tools, existing, &settings, &endpoint, cancel, |event| view.show(event));
            view.bar.finish_and_clear();
            generated
        }
    }?;
    let mut text = String::new();
    for line in originals {
        text.push_str(line);
        text.push('\n');
    }
    for row in &generated.rows {
        text.push_str(&serde_json::to_string(row)?);
        text.push('\n');
    }
    write_atomically(output, text.as_bytes()).with_context(|| format!("writing {}", output.display()))?;
    let written = originals.len() + generated.rows.len();
    match job.events {
        Some(EventFormat::Jsonl) => {
            print_json(&Written {
                event: "written",
                path: output,
                written,
                generated: generated.rows.len(),
                summary: &generated,
            })?;
        }
        None => print_summary(&generated, written, output)?,
    }
    let queries = generated.rows.iter().filter_map(|row| row.get("query")?.as_str()).map(query_key).collect();
    Ok(Wrote { cancelled: generated.cancelled, queries })
}

/// The last `--events` line: the file is written. Not `finished`, which `finetune --generate` sends
/// when training ends.
#[derive(Serialize)]
struct Written<'a> {
    event: &'static str,
    path: &'a Path,
    /// Rows in the file: the originals (with --augment) and the new ones.
    written: usize,
    generated: usize,
    #[serde(flatten)]
    summary: &'a Generated,
}

fn print_summary(generated: &Generated, written: usize, output: &Path) -> Result<()> {
    let stopped = if generated.cancelled { "  (cancelled: what arrived is kept)" } else { "" };
    outln!("  {:<9} {}/{} new rows{stopped}", "generated", generated.rows.len(), generated.wanted)?;
    if generated.failed_requests > 0 {
        outln!("  {:<9} {} request(s)", "failed", generated.failed_requests)?;
    }
    if !generated.rejected.is_empty() {
        outln!("  {:<9} {}", "rejected", counts(&generated.rejected))?;
    }
    if !generated.advice.is_empty() {
        outln!("  {:<9} kept, but check: {} (`needle data` lists the lines)", "advice", counts(&generated.advice))?;
    }
    outln!("  {:<9} {written} examples  {}", "wrote", output.display())?;
    Ok(())
}

fn counts(by_reason: &std::collections::BTreeMap<&'static str, usize>) -> String {
    by_reason.iter().map(|(reason, n)| format!("{n} {reason}")).collect::<Vec<_>>().join(", ")
}

/// The terminal view: new rows against the count, failed requests and rejected rows beside it.
struct Bar {
    bar: ProgressBar,
}

impl Bar {
    /// A bar counting `wanted` of `what` (rows, cases).
    fn new(wanted: usize, what: &str) -> Self {
        Self { bar: progress::bar(wanted as u64, &format!("{{pos}}/{{len}} {what}  {{msg}}")) }
    }

    fn show(&self, event: &GenerateEvent) {
        match event {
            GenerateEvent::Progress { generated, failed_requests, rejected, .. } => {
                self.bar.set_position(*generated as u64);
                let rejected: usize = rejected.values().sum();
                self.bar.set_message(format!("failed requests {failed_requests}  rejected rows {rejected}"));
            }
            GenerateEvent::SuiteProgress { cases, failed_requests, rejected, .. } => {
                self.bar.set_position(*cases as u64);
                let rejected: usize = rejected.values().sum();
                self.bar.set_message(format!("failed requests {failed_requests}  rejected cases {rejected}"));
            }
            GenerateEvent::RequestFailed { message } => self.bar.println(format!("  {:<9} {message}", "failed")),
        }
    }
}
