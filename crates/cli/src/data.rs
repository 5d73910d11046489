//! `needle data`: the dataset as a training run will see it, before anything trains.

use std::io::Write;
use std::path::PathBuf;

use needle_engine::dataset::{Checkup, Dataset, DatasetReport, RowCategory, Severity};
use needle_engine::generation::Generation;
use needle_engine::tokenizer::Tokenizer;

#[derive(clap::Args, serde::Serialize)]
pub struct Args {
    /// The JSONL dataset (one example per line).
    pub data: PathBuf,
    /// SentencePiece `tokenizer.model` [default: the --generation's, from the Hugging Face cache or the hub]
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// Longest sequence a run may use (the reference's `--max-len`).
    #[arg(long, default_value_t = 1024)]
    pub max_len: usize,
    /// Print the report as one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Read and render the lines as this Needle generation's package does (3 also reads
    /// single-turn chat lines and strips the reasoning), with its tokenizer unless --tokenizer is given
    #[arg(long, default_value = Generation::default().number().to_string())]
    #[serde(serialize_with = "crate::inputs::as_number")]
    pub generation: Generation,
    /// Also write the rows the doctor passes to this file: usable, calls that match their schemas, no
    /// repeats, within --max-len (its advice, such as ungrounded values, leaves rows in)
    #[arg(long, value_name = "OUT.jsonl")]
    pub fix: Option<PathBuf>,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let tokenizer = Tokenizer::load(&crate::download::tokenizer(args.generation, args.tokenizer.as_deref())?)?;
    let dataset = Dataset::load(&args.data, args.generation)?;
    let report = dataset.prepare(&tokenizer, args.max_len)?.report;
    if args.json {
        writeln!(std::io::stdout().lock(), "{}", serde_json::to_string(&report)?)?;
    } else {
        print_report(&mut std::io::stdout().lock(), &report)?;
    }
    if let Some(out) = &args.fix {
        let kept = dataset.write_passing(&report.doctor, out)?;
        let left_out = report.usable_examples + report.skipped_lines - kept;
        noteln!("  {:<9} {kept} rows written to {} ({left_out} left out)", "fixed", out.display());
    }
    Ok(())
}

/// The reference's two-column style: a short label, then the facts.
/// Written, not `println!`'d: a closed pipe (`needle data … | head -1`) is an error, not a panic.
fn print_report(out: &mut impl Write, report: &DatasetReport) -> std::io::Result<()> {
    writeln!(out, "  {:<9} {}", "data", report.path)?;
    writeln!(out, "  {:<9} {} usable, {} lines skipped", "examples", report.usable_examples, report.skipped_lines)?;
    let lengths = &report.token_lengths;
    writeln!(out, "  {:<9} min {}  median {}  max {}", "tokens", lengths.min, lengths.median, lengths.max)?;
    for bin in &report.histogram {
        writeln!(out, "  {:<9} ≤{:<6} {}", "", bin.up_to, bin.count)?;
    }
    writeln!(out, "  {:<9} {}  (cap {})", "seq_len", report.seq_len, report.cap)?;
    if report.truncated > 0 {
        writeln!(out, "  {:<9} {} examples longer than seq_len are cut at the end", "truncated", report.truncated)?;
    }
    for problem in &report.problems {
        writeln!(out, "  {:<9} {problem}", "problem")?;
    }
    let unlisted = report.problems.total - report.problems.len();
    if unlisted > 0 {
        let counts: Vec<String> = report.problems.counts.iter().map(|(kind, n)| format!("{n} {kind}")).collect();
        writeln!(out, "  {:<9} … and {unlisted} more; in all: {}", "problem", counts.join(", "))?;
    }
    print_doctor(out, &report.doctor)
}

/// The doctor's summary first, then each finding, then the calls per tool.
fn print_doctor(out: &mut impl Write, doctor: &Checkup) -> std::io::Result<()> {
    writeln!(out, "  {:<9} {}", "doctor", doctor.summary)?;
    for finding in &doctor.findings {
        let label = match finding.severity {
            Severity::Error => "error",
            Severity::Advice => "advice",
        };
        writeln!(out, "  {label:<9} {}", finding.message)?;
    }
    if doctor.unlisted_findings > 0 {
        writeln!(out, "  {:<9} … and {} more", "", doctor.unlisted_findings)?;
    }
    let mut tools: Vec<String> = doctor.calls_per_tool.iter().map(|(tool, n)| format!("{tool} {n}")).collect();
    if doctor.unlisted_tools > 0 {
        tools.push(format!("… and {} more tools", doctor.unlisted_tools));
    }
    writeln!(out, "  {:<9} {}", "calls", tools.join(", "))?;
    let categories: Vec<String> = doctor
        .categories
        .iter()
        .map(|c| format!("{} {} ({:.0}%)", c.rows, category_name(c.category), 100.0 * c.share))
        .collect();
    // A row with no call does not say whether its request left out a value, was negated, invalid or
    // served by no tool: the report can only count them together.
    writeln!(
        out,
        "  {:<9} {} of {} rows (no call: missing, negated, invalid and irrelevant requests alike)",
        "rows",
        categories.join(", "),
        doctor.rows
    )
}

fn category_name(category: RowCategory) -> &'static str {
    match category {
        RowCategory::Positive => "one call",
        RowCategory::Parallel => "parallel calls",
        RowCategory::NoCall => "no call",
    }
}
