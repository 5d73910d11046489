//! The Evaluate step's commands: a training's evaluation drawn and worded, Try, the confidence
//! threshold picked, and an acceptance suite run.

use std::path::PathBuf;

use tauri::State;

use crate::evaluate::step::EvaluateStep;
use crate::evaluate::tryout::{self, Answers, Question};
use crate::evaluate::view::{self, Evaluation};
use crate::evaluate::{acceptance, threshold};
use crate::ground::{blocking, Answer};
use crate::record::trainings::HistoryEntry;

#[tauri::command]
pub async fn evaluation(evaluate: State<'_, EvaluateStep>, training_id: String) -> Answer<Evaluation> {
    let evaluate = evaluate.inner().clone();
    blocking(move || Ok(view::evaluation(&evaluate.records.load(&training_id)?.entry))).await
}

#[tauri::command]
pub async fn try_model(evaluate: State<'_, EvaluateStep>, question: Question) -> Answer<Answers> {
    let evaluate = evaluate.inner().clone();
    blocking(move || tryout::ask(&evaluate.worker, &evaluate.records, &evaluate.base, &question)).await
}

/// Keeps `threshold` as the confidence training `training_id`'s model ships with, and writes it beside its `.cact`.
#[tauri::command]
pub async fn pick_threshold(
    evaluate: State<'_, EvaluateStep>,
    training_id: String,
    threshold: f64,
) -> Answer<HistoryEntry> {
    let evaluate = evaluate.inner().clone();
    blocking(move || threshold::pick(&evaluate.records, &training_id, threshold)).await
}

/// Runs the acceptance suite at `suite` on training `training_id`'s base, tuned model and `.cact`, at its threshold.
#[tauri::command]
pub async fn run_acceptance(
    evaluate: State<'_, EvaluateStep>,
    training_id: String,
    suite: PathBuf,
) -> Answer<HistoryEntry> {
    let evaluate = evaluate.inner().clone();
    blocking(move || acceptance::run(&evaluate.worker, &evaluate.records, &training_id, &suite)).await
}
