//! The `#[tauri::command]` glue: each command hands its arguments to [`Studio`] (or a module named for
//! the job) and returns. Anything slower than a glance runs off the main thread.

use std::path::PathBuf;

use needle_engine::generation::Generation;
use needle_engine::hub::BaseModel;
use needle_engine::settings::FieldErrors;
use needle_engine::train::Plan;
use tauri::ipc::Channel;
use tauri::{AppHandle, Runtime, State};
use tauri_plugin_notification::NotificationExt;

use crate::api_key::{KeySource, SecretName};
use crate::base_model::{BaseModelStatus, CancelDownload, DownloadMessage};
use crate::building::BuildMessage;
use crate::generating::{GenerateMessage, GenerateRequest, GenerateSetup};
use crate::history::HistoryEntry;
use crate::preferences::Preferences;
use crate::publishing::{PublishMessage, PublishSetup};
use crate::studio::{Opened, Startup, Studio};
use crate::training::{Notify, TrainingMessage};
use crate::training_request::TrainingDraft;
use crate::training_slot::CancelAnswer;
use crate::tryout::{Answers, Question};

type Result<T> = std::result::Result<T, String>;

/// Runs `work` on the blocking pool, keeping the window responsive.
async fn blocking<T: Send + 'static>(work: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tauri::async_runtime::spawn_blocking(work).await.map_err(|error| format!("internal error: {error}"))?
}

#[tauri::command]
pub async fn startup(studio: State<'_, Studio>) -> Result<Startup> {
    let studio = studio.inner().clone();
    blocking(move || Ok(studio.startup())).await
}

#[tauri::command]
pub async fn save_preferences(studio: State<'_, Studio>, preferences: Preferences) -> Result<()> {
    let studio = studio.inner().clone();
    blocking(move || studio.save_preferences(preferences)).await
}

#[tauri::command]
pub async fn base_model(studio: State<'_, Studio>) -> Result<BaseModelStatus> {
    let studio = studio.inner().clone();
    blocking(move || Ok(crate::base_model::status(&studio))).await
}

#[tauri::command]
pub fn download_base_model(
    studio: State<'_, Studio>,
    generation: Generation,
    on_event: Channel<DownloadMessage>,
) -> Result<()> {
    crate::base_model::start(&studio, generation, on_event)
}

#[tauri::command]
pub async fn use_base_model(studio: State<'_, Studio>, generation: Generation) -> Result<BaseModel> {
    let studio = studio.inner().clone();
    blocking(move || crate::base_model::use_cached(&studio, generation)).await
}

#[tauri::command]
pub fn cancel_download(studio: State<'_, Studio>) -> CancelDownload {
    studio.downloads().cancel()
}

/// The report `needle data --json` prints, as it printed it; `max_len` as typed in the Run panel.
#[tauri::command]
pub async fn load_dataset(
    studio: State<'_, Studio>,
    path: PathBuf,
    tokenizer: Option<PathBuf>,
    checkpoint: Option<PathBuf>,
    max_len: serde_json::Value,
) -> Result<serde_json::Value> {
    let studio = studio.inner().clone();
    blocking(move || studio.dataset_report(&path, tokenizer.as_deref(), checkpoint.as_deref(), &max_len)).await
}

/// Line `line` of the dataset at `path`, as written (a doctor's finding, clicked).
#[tauri::command]
pub async fn dataset_line(studio: State<'_, Studio>, path: PathBuf, line: usize) -> Result<String> {
    let studio = studio.inner().clone();
    blocking(move || studio.dataset_line(&path, line)).await
}

#[tauri::command]
pub async fn generate_setup(studio: State<'_, Studio>) -> Result<GenerateSetup> {
    let studio = studio.inner().clone();
    blocking(move || Ok(crate::generating::setup(&studio))).await
}

/// Keeps a typed key or token in the keychain (or, without one, in memory until the app closes).
#[tauri::command]
pub async fn remember_key(studio: State<'_, Studio>, name: SecretName, key: String) -> Result<KeySource> {
    let studio = studio.inner().clone();
    blocking(move || studio.secret(name).remember(&key)).await
}

#[tauri::command]
pub async fn forget_key(studio: State<'_, Studio>, name: SecretName) -> Result<KeySource> {
    let studio = studio.inner().clone();
    blocking(move || Ok(studio.secret(name).forget())).await
}

#[tauri::command]
pub async fn generate_examples(
    studio: State<'_, Studio>,
    request: GenerateRequest,
    on_event: Channel<GenerateMessage>,
) -> Result<()> {
    let studio = studio.inner().clone();
    blocking(move || crate::generating::start(&studio, &request, on_event)).await
}

#[tauri::command]
pub fn cancel_generation(studio: State<'_, Studio>) -> CancelAnswer {
    studio.generations().cancel()
}

#[tauri::command]
pub fn validate_training(studio: State<'_, Studio>, draft: TrainingDraft) -> FieldErrors {
    draft.check(&studio.devices()).err().unwrap_or_default()
}

#[tauri::command]
pub async fn plan_training(studio: State<'_, Studio>, draft: TrainingDraft) -> Result<Plan> {
    let studio = studio.inner().clone();
    blocking(move || studio.plan(&draft)).await
}

#[tauri::command]
pub async fn start_training<R: Runtime>(
    app: AppHandle<R>,
    studio: State<'_, Studio>,
    draft: TrainingDraft,
    on_event: Channel<TrainingMessage>,
) -> Result<HistoryEntry> {
    let request = studio.check(&draft)?;
    crate::training::start(&studio, &request, on_event, notifier(app))
}

#[tauri::command]
pub async fn resume_training<R: Runtime>(
    app: AppHandle<R>,
    studio: State<'_, Studio>,
    id: String,
    on_event: Channel<TrainingMessage>,
) -> Result<HistoryEntry> {
    crate::training::resume(&studio, &id, on_event, notifier(app))
}

/// Desktop notifications for the end of a long run.
fn notifier<R: Runtime>(app: AppHandle<R>) -> Notify {
    Box::new(move |title, body| {
        // No notification service (a bare X session, say) is no reason to fail a finished run.
        let _ = app.notification().builder().title(title).body(body).show();
    })
}

#[tauri::command]
pub fn cancel_training(studio: State<'_, Studio>) -> CancelAnswer {
    studio.training_slot().cancel()
}

#[tauri::command]
pub async fn build_cact(
    studio: State<'_, Studio>,
    run_id: String,
    bits: u8,
    out: PathBuf,
    on_event: Channel<BuildMessage>,
) -> Result<()> {
    crate::building::start(&studio, &run_id, bits, out, on_event)
}

#[tauri::command]
pub fn publish_setup(studio: State<'_, Studio>) -> PublishSetup {
    crate::publishing::setup(&studio)
}

#[tauri::command]
pub fn publish_cact(
    studio: State<'_, Studio>,
    run_id: String,
    repo: String,
    on_event: Channel<PublishMessage>,
) -> Result<()> {
    crate::publishing::start(&studio, &run_id, &repo, on_event)
}

#[tauri::command]
pub async fn try_model(studio: State<'_, Studio>, question: Question) -> Result<Answers> {
    let studio = studio.inner().clone();
    blocking(move || crate::tryout::ask(&studio, &question)).await
}

#[tauri::command]
pub async fn history(studio: State<'_, Studio>) -> Result<Vec<HistoryEntry>> {
    let studio = studio.inner().clone();
    blocking(move || Ok(studio.list_history())).await
}

#[tauri::command]
pub async fn open_training(studio: State<'_, Studio>, id: String) -> Result<Opened> {
    let studio = studio.inner().clone();
    blocking(move || studio.open_training(&id)).await
}

#[tauri::command]
pub fn reveal(path: PathBuf) -> Result<()> {
    tauri_plugin_opener::reveal_item_in_dir(&path)
        .map_err(|error| format!("could not show {}: {error}", path.display()))
}
