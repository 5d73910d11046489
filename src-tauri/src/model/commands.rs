//! The Model step's commands: the base models offered, their download, and the remembered choices.

use needle_engine::generation::Generation;
use needle_engine::hub::BaseModel;
use tauri::ipc::Channel;
use tauri::State;

use crate::ground::{blocking, Answer};
use crate::model::download::{self, BaseModelStatus, CancelDownload, DownloadMessage};
use crate::model::preferences::Preferences;
use crate::model::step::ModelStep;

#[tauri::command]
pub async fn save_preferences(model: State<'_, ModelStep>, preferences: Preferences) -> Answer<()> {
    let model = model.inner().clone();
    blocking(move || model.preferences.save_window(preferences)).await
}

#[tauri::command]
pub async fn base_model(model: State<'_, ModelStep>) -> Answer<BaseModelStatus> {
    let model = model.inner().clone();
    blocking(move || Ok(download::status(&model.hub, &model.downloads, model.preferences.generation()))).await
}

#[tauri::command]
pub fn download_base_model(
    model: State<'_, ModelStep>,
    generation: Generation,
    on_event: Channel<DownloadMessage>,
) -> Answer<()> {
    let (hub, downloads, preferences) = (model.hub.clone(), model.downloads.clone(), model.preferences.clone());
    download::start(hub, downloads, preferences, generation, on_event)
}

#[tauri::command]
pub async fn use_base_model(model: State<'_, ModelStep>, generation: Generation) -> Answer<BaseModel> {
    let model = model.inner().clone();
    blocking(move || download::use_cached(&model.hub, &model.preferences, generation)).await
}

#[tauri::command]
pub fn cancel_download(model: State<'_, ModelStep>) -> CancelDownload {
    model.downloads.cancel()
}
