//! The Evaluate step's commands: a training's evaluation drawn and worded, and Try.

use tauri::State;

use crate::evaluate::step::EvaluateStep;
use crate::evaluate::tryout::{self, Answers, Question};
use crate::evaluate::view::{self, Evaluation};
use crate::ground::{blocking, Answer};

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
