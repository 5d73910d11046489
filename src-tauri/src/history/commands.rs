//! The History step's commands: the list, and one training opened.

use tauri::State;

use crate::ground::{blocking, Answer};
use crate::history::step::{HistoryStep, Opened};
use crate::record::trainings::HistoryEntry;

#[tauri::command]
pub async fn history(history: State<'_, HistoryStep>) -> Answer<Vec<HistoryEntry>> {
    let history = history.inner().clone();
    blocking(move || Ok(history.list())).await
}

#[tauri::command]
pub async fn open_training(history: State<'_, HistoryStep>, id: String) -> Answer<Opened> {
    let history = history.inner().clone();
    blocking(move || history.open(&id)).await
}
