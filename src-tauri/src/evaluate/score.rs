//! The Evaluate step's scoring of a built `.cact`: the file's own weights answer the held-out
//! examples in the worker, as the base and the tuned model did at the end of the training.

use std::path::Path;

use needle_engine::calls::{Accuracy, Answered, ModelScore};
use needle_engine::train::finetune::SCORED_EXAMPLES;

use crate::train::record::HistoryEntry;
use crate::worker::job::Job;
use crate::worker::process::Worker;

/// The built `.cact`'s own (dequantized) weights scored: `needle eval --weights FILE --accuracy` on the
/// examples the training held out (the same ones its base and tuned scores used), so the table
/// compares like with like.
pub fn score_cact(worker: &Worker, entry: &HistoryEntry, cact: &Path) -> Result<Option<ModelScore>, String> {
    // Only a training whose base and tuned models were scored has a row to compare the file with.
    if entry.scores.is_none() {
        return Ok(None);
    }
    let scratch = tempfile::tempdir().map_err(|error| format!("no scratch folder for the scoring: {error}"))?;
    let answers = scratch.path().join("wrong.jsonl");
    let job = Job::Evaluate {
        cact: cact.into(),
        tokenizer: entry.request.tokenizer.clone(),
        dataset: entry.request.dataset.clone(),
        settings: entry.request.settings,
        examples: SCORED_EXAMPLES,
        answers: answers.clone(),
    };
    #[derive(serde::Deserialize)]
    struct Printed {
        loss: f64,
        accuracy: Accuracy,
    }
    let out = worker.output(&job)?;
    let printed: Printed = serde_json::from_str(out.trim())
        .map_err(|error| format!("the .cact's evaluation was not understood ({error}): {out}"))?;
    let wrong = std::fs::read_to_string(&answers)
        .map_err(|error| format!("the .cact's wrong answers could not be read: {error}"))?
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<Vec<Answered>, _>>()
        .map_err(|error| format!("the .cact's wrong answers were not understood ({error})"))?;
    Ok(Some(ModelScore { loss: printed.loss, calls: printed.accuracy, wrong }))
}
