//! The Data step's commands: the dataset's report and lines, and Generate.

use std::path::PathBuf;

use tauri::ipc::Channel;
use tauri::State;

use crate::data::generate::{self, GenerateMessage, GenerateRequest, GenerateSetup};
use crate::data::report;
use crate::data::step::DataStep;
use crate::ground::{blocking, Answer};
use crate::worker::process::CancelAnswer;

/// The report `needle data --json` prints, as it printed it; `max_len` as typed in the Train panel.
#[tauri::command]
pub async fn load_dataset(
    data: State<'_, DataStep>,
    path: PathBuf,
    tokenizer: Option<PathBuf>,
    checkpoint: Option<PathBuf>,
    max_len: serde_json::Value,
) -> Answer<serde_json::Value> {
    let data = data.inner().clone();
    blocking(move || data.report(&path, tokenizer.as_deref(), checkpoint.as_deref(), &max_len)).await
}

/// Line `line` of the dataset at `path`, as written (a doctor's finding, clicked).
#[tauri::command]
pub async fn dataset_line(path: PathBuf, line: usize) -> Answer<String> {
    blocking(move || report::line(&path, line)).await
}

#[tauri::command]
pub async fn generate_setup(data: State<'_, DataStep>) -> Answer<GenerateSetup> {
    let data = data.inner().clone();
    blocking(move || Ok(generate::setup(&data.key, &data.generations))).await
}

#[tauri::command]
pub async fn generate_examples(
    data: State<'_, DataStep>,
    request: GenerateRequest,
    on_event: Channel<GenerateMessage>,
) -> Answer<()> {
    let data = data.inner().clone();
    blocking(move || generate::start(&data.worker, &data.key, &data.generations, &request, on_event)).await
}

#[tauri::command]
pub fn cancel_generation(data: State<'_, DataStep>) -> CancelAnswer {
    data.generations.cancel()
}
