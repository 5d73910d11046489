//! The Evaluate step's command: Try.

use tauri::State;

use crate::evaluate::step::EvaluateStep;
use crate::evaluate::tryout::{self, Answers, Question};
use crate::ground::{blocking, Answer};

#[tauri::command]
pub async fn try_model(evaluate: State<'_, EvaluateStep>, question: Question) -> Answer<Answers> {
    let evaluate = evaluate.inner().clone();
    blocking(move || tryout::ask(&evaluate.worker, &evaluate.records, &evaluate.base, &question)).await
}
