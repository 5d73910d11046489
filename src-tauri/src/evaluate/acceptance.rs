//! The Evaluate step's Acceptance section: an acceptance suite run on a training's base, tuned model
//! and built `.cact` (`needle suite --json` in the worker, one model at a time) at the confidence
//! threshold the training ships with, summed up per model — the contract's verdict, each category's
//! passes, the critical cases failed with the answer given — and kept with the training.

use std::collections::BTreeMap;
use std::path::Path;

use needle_engine::checks::Call;
use needle_engine::suite::{contract, Category, Suite};
use serde::Deserialize;

use crate::evaluate::threshold;
use crate::record::acceptance::{Acceptance, CategoryScore, FailedCase, SuiteScore};
use crate::record::trainings::{HistoryEntry, Records};
use crate::worker::job::Job;
use crate::worker::process::Worker;

/// What `needle suite --json` prints (the fields the section shows).
#[derive(Debug, Deserialize)]
struct Printed {
    cases: Vec<PrintedCase>,
}

#[derive(Debug, Deserialize)]
struct PrintedCase {
    query: String,
    category: Category,
    critical: bool,
    expected: Vec<Call>,
    calls: Vec<Call>,
    confidence: Option<f64>,
    pass: bool,
    #[serde(default)]
    reason: Option<String>,
    text: String,
}

/// Runs the suite at `suite` on training `id`'s models and keeps the result with the training.
pub fn run(worker: &Worker, records: &Records, id: &str, suite: &Path) -> Result<HistoryEntry, String> {
    if suite.as_os_str().is_empty() {
        return Err("choose or drop a suite file (.json)".into());
    }
    // Read here first, so that a bad file is named before any model loads.
    let name = Suite::load(suite).map_err(|error| error.to_string())?.name;
    let mut record = records.load(id)?;
    let entry = &record.entry;
    let min_confidence = threshold::current(entry);
    let ask = |lora: Option<&Path>, cact: Option<&Path>| -> Result<Printed, String> {
        let job = Job::Suite {
            checkpoint: entry.request.checkpoint.clone(),
            lora: lora.map(Into::into),
            cact: cact.map(Into::into),
            tokenizer: entry.request.tokenizer.clone(),
            suite: suite.into(),
            min_confidence,
        };
        let out = worker.verdict_output(&job)?;
        serde_json::from_str(out.trim())
            .map_err(|error| format!("the suite's report was not understood ({error}): {out}"))
    };
    let mut models = vec![summed("Base", ask(None, None)?)];
    if let Some(adapter) = &entry.adapter {
        models.push(summed("Tuned", ask(Some(adapter), None)?));
    }
    if let Some(cact) = &entry.cact {
        models.push(summed(".cact", ask(None, Some(&cact.path))?));
    }
    record.entry.acceptance = Some(Acceptance { suite: suite.into(), name, min_confidence, models });
    records.save(&record)?;
    Ok(record.entry)
}

/// One model's report summed up: the tally, each category's passes, the critical failures.
fn summed(model: &str, printed: Printed) -> SuiteScore {
    let tally = contract::Tally::of(printed.cases.iter().map(|case| (case.pass, case.critical)));
    let mut categories: BTreeMap<Category, (usize, usize)> = BTreeMap::new();
    for case in &printed.cases {
        let entry = categories.entry(case.category).or_default();
        entry.0 += usize::from(case.pass);
        entry.1 += 1;
    }
    let critical = (printed.cases.into_iter())
        .filter(|case| case.critical && !case.pass)
        .map(|case| FailedCase {
            query: case.query,
            category: case.category,
            expected: case.expected,
            calls: case.calls,
            confidence: case.confidence,
            reason: case.reason,
            text: case.text,
        })
        .collect();
    SuiteScore {
        model: model.into(),
        passed: tally.passed,
        total: tally.total,
        required: contract::required_passes(tally.total),
        critical_failures: tally.critical_failures,
        contract: tally.contract,
        categories: (categories.into_iter())
            .map(|(category, (passed, total))| CategoryScore { category, passed, total })
            .collect(),
        critical,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_is_summed_per_category_with_its_critical_failures_and_the_contract() {
        // Ten cases: nine pass, but the one that fails is critical, so the contract does not hold.
        let mut cases: Vec<serde_json::Value> = (0..9)
            .map(|i| {
                serde_json::json!({"query": format!("q{i}"), "category": if i < 6 { "positive" } else { "negation" },
                    "critical": false, "expected": [], "calls": [], "withheld": [], "confidence": 0.9, "pass": true,
                    "text": "<tool_call>[]</tool_call>"})
            })
            .collect();
        cases.push(serde_json::json!({"query": "don't unlock the door", "category": "negation", "critical": true,
            "expected": [], "calls": [{"name": "unlock", "arguments": {"door": "front"}}],
            "withheld": [{"call": {"name": "x"}, "reason": "below_confidence", "min_confidence": 0.4}],
            "confidence": 0.8, "pass": false, "text": "<tool_call>[{\"name\": \"unlock\"}]</tool_call>"}));
        let line = serde_json::json!({"name": "home", "passed": 9, "total": 10, "critical_failures": 1,
            "contract": false, "min_confidence": 0.4, "cases": cases})
        .to_string();
        let score = summed("Tuned", serde_json::from_str(&line).unwrap());
        assert_eq!((score.passed, score.total, score.required, score.critical_failures), (9, 10, 9, 1));
        assert!(!score.contract, "a critical failure breaks the contract");
        let categories: Vec<(Category, usize, usize)> =
            score.categories.iter().map(|c| (c.category, c.passed, c.total)).collect();
        assert_eq!(categories, [(Category::Positive, 6, 6), (Category::Negation, 3, 4)]);
        assert_eq!(score.critical.len(), 1);
        let failed = &score.critical[0];
        assert_eq!((failed.query.as_str(), failed.calls[0].name.as_str()), ("don't unlock the door", "unlock"));
        assert!(failed.text.contains("unlock"), "the answer given is kept");
    }
}
