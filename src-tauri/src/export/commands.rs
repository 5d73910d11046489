//! The Export step's commands: build a training's `.cact`, publish it (or cancel that), show either file
//! in its folder.

use std::path::PathBuf;

use tauri::ipc::Channel;
use tauri::State;

use crate::export::build::{self, BuildMessage};
use crate::export::publish::{self, PublishMessage, PublishSetup, PublishState};
use crate::export::step::ExportStep;
use crate::ground::Answer;

#[tauri::command]
pub async fn build_cact(
    export: State<'_, ExportStep>,
    training_id: String,
    bits: u8,
    out: PathBuf,
    on_event: Channel<BuildMessage>,
) -> Answer<()> {
    build::start(&export.worker, &export.records, &training_id, bits, out, on_event)
}

#[tauri::command]
pub fn publish_setup(export: State<'_, ExportStep>) -> PublishSetup {
    publish::setup(&export.token, &export.publishing)
}

#[tauri::command]
pub fn publish_cact(
    export: State<'_, ExportStep>,
    training_id: String,
    repo: String,
    on_event: Channel<PublishMessage>,
) -> Answer<()> {
    publish::start(&export.publish_place(), &training_id, &repo, on_event)
}

/// Stops the upload going before its commit; the outcome follows on its channel.
#[tauri::command]
pub fn cancel_publish(export: State<'_, ExportStep>) -> PublishState {
    export.publishing.cancel()
}

/// "Show in folder" for the adapter and the built file.
#[tauri::command]
pub fn reveal(path: PathBuf) -> Answer<()> {
    tauri_plugin_opener::reveal_item_in_dir(&path)
        .map_err(|error| format!("could not show {}: {error}", path.display()))
}
