//! Acceptance suites: a tool surface, its cases in six categories, and the production contract a
//! model (a base checkpoint, a tuned adapter, or the `.cact` that ships) must keep on them — the
//! rule of cactus-needle 3.x's frozen suites ([`contract`]). Each case is answered as `needle run`
//! answers (the prompt training renders, greedy decoding), its calls go through the checks
//! ([`CheckedAnswer`]) with the confidence gate, and what is acted on is held to the expected calls.

pub mod contract;
pub mod file;

use std::sync::atomic::AtomicBool;

use serde::Serialize;
use serde_json::Value;

use crate::calls::{answer_each, prompt_ids, Answer};
use crate::checks::{Call, CheckedAnswer, Turn, Withheld};
use crate::confidence::TurnHead;
use crate::dataset::{render, Example, Issue};
use crate::model::{Network, Stop};
use crate::tokenizer::Tokenizer;

pub use contract::Tally;
pub use file::{Case, Category, Suite, SuiteError};

/// New tokens a suite's answer may have when none is asked for: room for reasoning and a few calls.
pub const DEFAULT_MAX_NEW_TOKENS: usize = 256;

/// Why a case failed without its answer being compared: a prompt that does not fit the model's
/// context (never cut to fit), or an answer that ran out of room before its calls closed.
pub const PROMPT_TOO_LONG: &str = "prompt too long";
pub const ANSWER_CUT_OFF: &str = "answer cut off";

/// A suite scored: the contract's tally, and each case in file order.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub name: String,
    #[serde(flatten)]
    pub tally: Tally,
    pub min_confidence: f64,
    pub cases: Vec<CaseReport>,
}

/// One case: what it asked and expected, what the model's answer acted on and withheld, and the
/// verdict.
#[derive(Debug, Clone, Serialize)]
pub struct CaseReport {
    pub query: String,
    pub category: Category,
    pub critical: bool,
    pub expected: Vec<Call>,
    /// The calls acted on, after the schema check, the grounding check and the gate.
    pub calls: Vec<Call>,
    pub withheld: Vec<Withheld>,
    /// The turn's confidence; `null` for a case never answered.
    pub confidence: Option<f64>,
    pub pass: bool,
    /// Why a case failed before its calls were compared ([`PROMPT_TOO_LONG`], [`ANSWER_CUT_OFF`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<&'static str>,
    /// The model's whole answer, reasoning included (empty for a case never answered).
    pub text: String,
}

#[derive(Debug, thiserror::Error)]
pub enum ScoreError {
    /// A case's query and the suite's tools cannot make a prompt (the dataset's rules).
    #[error("case {index} ({query:?}): {issue}")]
    Case { index: usize, query: String, issue: Issue },
    #[error(transparent)]
    Model(#[from] crate::model::ModelError),
}

/// Scores `network` on every case of `suite`, each answer read by `head` when the model has a
/// trained one: at most `max_new_tokens` new tokens an answer, the
/// gate at `min_confidence`; `progress(done, total)` after each answer.
pub fn score(
    network: &Network,
    head: Option<&TurnHead>,
    tokenizer: &Tokenizer,
    suite: &Suite,
    min_confidence: f64,
    max_new_tokens: usize,
    mut progress: impl FnMut(usize, usize),
) -> Result<Report, ScoreError> {
    let config = network.config();
    let tools = Value::Array(suite.tools.clone());
    let prompts = (suite.cases.iter().enumerate())
        .map(|(index, case)| {
            let question = Example::question(&tools, &case.query, &suite.system, config.generation)
                .map_err(|issue| ScoreError::Case { index, query: case.query.clone(), issue })?;
            Ok((prompt_ids(tokenizer, &render(&question).0), max_new_tokens))
        })
        .collect::<Result<Vec<_>, ScoreError>>()?;
    // Decoding keeps at most max_seq_len − 1 prompt tokens: a longer prompt would be cut.
    let fits = |ids: &Vec<u32>| ids.len() < config.max_seq_len.max(2);
    let fitting: Vec<usize> = (0..prompts.len()).filter(|&i| fits(&prompts[i].0)).collect();
    let asked: Vec<(Vec<u32>, usize)> = fitting.iter().map(|&i| prompts[i].clone()).collect();
    let mut answers: Vec<Option<Answer>> = vec![None; suite.cases.len()];
    let mut done = 0;
    answer_each(network, head, tokenizer, &asked, &AtomicBool::new(false), |at, answer| {
        answers[fitting[at]] = Some(answer);
        done += 1;
        progress(done, asked.len());
    })?;
    let cases: Vec<CaseReport> =
        suite.cases.iter().zip(answers).map(|(case, answer)| judge(suite, case, answer, min_confidence)).collect();
    Ok(Report {
        name: suite.name.clone(),
        tally: Tally::of(cases.iter().map(|case| (case.pass, case.critical))),
        min_confidence,
        cases,
    })
}

/// A case's verdict on its answer (`None`: its prompt did not fit).
fn judge(suite: &Suite, case: &Case, answer: Option<Answer>, min_confidence: f64) -> CaseReport {
    let turn = Turn { tools: &suite.tools, query: &case.query, system: &suite.system };
    let report = |checked: Option<CheckedAnswer>, reason: Option<&'static str>, text: String| {
        let pass = reason.is_none() && checked.as_ref().is_some_and(|c| contract::same_calls(&c.calls, &case.calls));
        let (calls, withheld, confidence) = match checked {
            Some(c) => (c.calls, c.withheld, Some(c.confidence)),
            None => (Vec::new(), Vec::new(), None),
        };
        CaseReport {
            query: case.query.clone(),
            category: case.category,
            critical: case.critical,
            expected: case.calls.clone(),
            calls,
            withheld,
            confidence,
            pass,
            reason,
            text,
        }
    };
    let Some(answer) = answer else { return report(None, Some(PROMPT_TOO_LONG), String::new()) };
    let checked = CheckedAnswer::check(answer.calls.as_deref(), answer.confidence, turn, min_confidence);
    // An answer stopped by a limit before a call list closed says nothing; read as no call, it
    // would pass every case that wants none.
    let cut = answer.calls.is_none() && matches!(answer.completion.stop, Stop::MaxLength | Stop::MaxNewTokens);
    report(Some(checked), cut.then_some(ANSWER_CUT_OFF), answer.text)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use serde_json::json;

    use super::*;
    use crate::fixtures::fixture;

    #[test]
    fn verdicts_and_contract_are_the_reference_harness_s_on_hand_made_answers() {
        // The reference's harness judged these answers (tests/fixtures/make_suite_goldens.py): here
        // each goes through the checks with the gate and is compared as `judge` compares it. The
        // tools declare no parameters, so the schema check lets every hand-made call through.
        let golden: Value =
            serde_json::from_slice(&std::fs::read(fixture("golden/suite_contract.json")).unwrap()).unwrap();
        for suite in golden["suites"].as_array().unwrap() {
            let cases = suite["cases"].as_array().unwrap();
            let names: BTreeSet<&str> = (cases.iter())
                .flat_map(|case| case["calls"].as_array().unwrap().iter().chain(case["given"].as_array().unwrap()))
                .map(|call| call["name"].as_str().unwrap())
                .collect();
            let tools: Vec<Value> = names.into_iter().map(|name| json!({"name": name})).collect();
            let min_confidence = suite["min_confidence"].as_f64().unwrap();
            let verdicts: Vec<(bool, bool)> = (cases.iter())
                .map(|case| {
                    let turn = Turn { tools: &tools, query: case["query"].as_str().unwrap(), system: "" };
                    let given = case["given"].as_array().unwrap();
                    let answer =
                        CheckedAnswer::check(Some(given), case["confidence"].as_f64().unwrap(), turn, min_confidence);
                    let expected: Vec<Call> = serde_json::from_value(case["calls"].clone()).unwrap();
                    (contract::same_calls(&answer.calls, &expected), case["critical"].as_bool().unwrap())
                })
                .collect();
            let name = suite["name"].as_str().unwrap();
            let want: Vec<bool> = serde_json::from_value(suite["verdicts"].clone()).unwrap();
            assert_eq!(verdicts.iter().map(|(pass, _)| *pass).collect::<Vec<_>>(), want, "{name}");
            let tally = Tally::of(verdicts);
            let want_tally =
                (suite["passed"].as_u64().unwrap() as usize, suite["critical_failures"].as_u64().unwrap() as usize);
            assert_eq!((tally.passed, tally.critical_failures), want_tally, "{name}");
            assert_eq!(tally.contract, suite["contract"].as_bool().unwrap(), "{name}");
        }
    }
}
