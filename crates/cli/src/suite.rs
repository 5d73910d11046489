//! `needle suite`: a model — base, tuned or a built `.cact` — scored on an acceptance suite, case by
//! case, and held to the production contract (at least round(0.9 n) cases passed, no critical case
//! failed). The exit status says whether the contract holds.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result};
use needle_engine::backend::{self, DeviceRequest};
use needle_engine::checks::Call;
use needle_engine::suite::{contract, score, CaseReport, Category, Report, Suite, DEFAULT_MAX_NEW_TOKENS};
use serde::Serialize;

use crate::inputs::WeightsInputs;

/// Score a model on an acceptance suite (.json: name, system, tools, cases) and check the contract:
/// exit 0 when it holds, 1 when it does not, 2 on an error
#[derive(Debug, clap::Args, Serialize)]
pub struct Args {
    /// The suite file: {"name", "system", "tools", "cases": [{"query", "calls", "category", "critical"}]}
    pub suite: PathBuf,
    #[command(flatten)]
    pub weights: WeightsInputs,
    /// Act on a turn's calls only at or above this confidence; below it the turn is no call (the
    /// production contract uses 0.4)
    #[arg(long, default_value_t = 0.0)]
    pub min_confidence: f64,
    /// Most new tokens an answer may have; an answer cut off before its calls close fails its case
    #[arg(long, default_value_t = DEFAULT_MAX_NEW_TOKENS)]
    pub max_new: usize,
    /// auto, cpu, cuda or metal [default: NEEDLE_DEVICE, else auto]
    #[arg(long)]
    pub device: Option<String>,
    /// Print one JSON line {"name", "passed", "total", "critical_failures", "contract", "min_confidence",
    /// "cases": [{"query", "category", "critical", "expected", "calls", "withheld", "confidence", "pass", …}]}
    #[arg(long)]
    pub json: bool,
}

/// Scores the model and prints the report; whether the contract holds.
pub fn run(args: Args) -> Result<bool> {
    anyhow::ensure!(
        (0.0..=1.0).contains(&args.min_confidence),
        "--min-confidence {}: use a confidence in [0, 1] (0 gates nothing; the production contract uses 0.4)",
        args.min_confidence
    );
    let suite = Suite::load(&args.suite)?;
    let selected = backend::select(DeviceRequest::resolve(args.device.as_deref())?)?;
    let model = args.weights.load(&selected.device)?;
    let report = score(
        &model.network,
        model.head.as_ref(),
        &model.tokenizer,
        &suite,
        args.min_confidence,
        args.max_new,
        |done, total| crate::eval::report_progress("suite", done, total),
    )
    .with_context(|| format!("scoring {} on {}", model.label, args.suite.display()))?;
    crate::eval::end_progress();
    let mut out = std::io::stdout().lock();
    if args.json {
        writeln!(out, "{}", serde_json::to_string(&report)?)?;
    } else {
        print_report(&mut out, &model.label, &report)?;
    }
    Ok(report.tally.contract)
}

fn print_report(out: &mut impl Write, model: &str, report: &Report) -> std::io::Result<()> {
    writeln!(out, "  {:<9} {model}", "model")?;
    writeln!(out, "  {:<9} {} ({} cases)", "suite", report.name, report.tally.total)?;
    for case in report.cases.iter().filter(|case| !case.pass) {
        print_failure(out, case)?;
    }
    let mut per_category: BTreeMap<Category, (usize, usize)> = BTreeMap::new();
    for case in &report.cases {
        let entry = per_category.entry(case.category).or_default();
        entry.0 += usize::from(case.pass);
        entry.1 += 1;
    }
    let categories: Vec<String> =
        per_category.iter().map(|(category, (passed, total))| format!("{category} {passed}/{total}")).collect();
    writeln!(out, "  {:<9} {}", "category", categories.join("  "))?;
    let tally = &report.tally;
    writeln!(
        out,
        "  {:<9} {}/{} (needs {}), {} critical failures, confidence gate {}",
        "passed",
        tally.passed,
        tally.total,
        contract::required_passes(tally.total),
        tally.critical_failures,
        report.min_confidence
    )?;
    writeln!(out, "  {:<9} {}", "contract", if tally.contract { "PASS" } else { "FAIL" })
}

fn print_failure(out: &mut impl Write, case: &CaseReport) -> std::io::Result<()> {
    let critical = if case.critical { ", critical" } else { "" };
    writeln!(out, "  {:<9} [{}{critical}] {}", "FAIL", case.category, case.query)?;
    writeln!(out, "  {:<9}   want {}", "", calls_text(&case.expected))?;
    match case.reason {
        Some(reason) => writeln!(out, "  {:<9}   {reason}", "")?,
        None => writeln!(out, "  {:<9}   got  {}", "", calls_text(&case.calls))?,
    }
    for withheld in &case.withheld {
        writeln!(out, "  {:<9}   withheld {}: {}", "", withheld.call, withheld.reason)?;
    }
    Ok(())
}

/// Calls as JSON, or `no call`.
fn calls_text(calls: &[Call]) -> String {
    match calls {
        [] => "no call".to_string(),
        calls => serde_json::to_string(calls).unwrap_or_default(),
    }
}
