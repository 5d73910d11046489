//! The Evaluate step's scoring of a built `.cact`: the tuned model three ways in the worker, on the
//! examples the training held out (those its base and tuned scores used), so that a gap has a cause.

use std::path::Path;

use needle_engine::calls::QuantRows;
use needle_engine::train::finetune::SCORED_EXAMPLES;

use crate::record::trainings::HistoryEntry;
use crate::worker::job::Job;
use crate::worker::process::Worker;

/// `needle eval --accuracy --quant-rows CACT`: the training's checkpoint with its adapter as trained
/// (float), with the deployment's quantization simulated, and `cact` read back, each scored on the
/// held-out examples.
pub fn quant_rows(worker: &Worker, entry: &HistoryEntry, cact: &Path) -> Result<Option<QuantRows>, String> {
    // Only a training whose base and tuned models were scored has held-out examples to score on.
    let (Some(_), Some(adapter)) = (&entry.scores, &entry.adapter) else { return Ok(None) };
    let job = Job::Evaluate {
        checkpoint: entry.request.checkpoint.clone(),
        adapter: adapter.clone(),
        cact: cact.into(),
        tokenizer: entry.request.tokenizer.clone(),
        dataset: entry.request.dataset.clone(),
        settings: entry.request.settings,
        examples: SCORED_EXAMPLES,
    };
    #[derive(serde::Deserialize)]
    struct Printed {
        quant_rows: QuantRows,
    }
    let out = worker.output(&job)?;
    let printed: Printed = serde_json::from_str(out.trim())
        .map_err(|error| format!("the .cact's evaluation was not understood ({error}): {out}"))?;
    Ok(Some(printed.quant_rows))
}
