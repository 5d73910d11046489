//! The Export step's commands: build a training's `.cact` (or a rung of its depth ladder, scored first),
//! publish it (or cancel that), show either file
//! in its folder.

use std::path::PathBuf;

use tauri::ipc::Channel;
use tauri::State;

use crate::export::build::{self, BuildMessage, BuildRequest};
use crate::export::ladder::{self, LadderMessage};
use crate::export::publish::{self, PublishMessage, PublishSetup, PublishState};
use crate::export::step::ExportStep;
use crate::ground::Answer;
use crate::worker::process::CancelAnswer;

#[tauri::command]
pub async fn build_cact(
    export: State<'_, ExportStep>,
    training_id: String,
    request: BuildRequest,
    on_event: Channel<BuildMessage>,
) -> Answer<()> {
    build::start(&export.worker, &export.records, &training_id, request, on_event)
}

/// Why training `training_id`'s model has no depth ladder to score (a Needle 2 model), or nothing when
/// it has one.
#[tauri::command]
pub fn ladder_refusal(export: State<'_, ExportStep>, training_id: String) -> Answer<Option<String>> {
    ladder::refusal(&export.records, &training_id)
}

/// Scores every rung of training `training_id`'s depth ladder; progress and the table follow on `on_event`.
#[tauri::command]
pub fn score_ladder(
    export: State<'_, ExportStep>,
    training_id: String,
    on_event: Channel<LadderMessage>,
) -> Answer<()> {
    ladder::start(&export.worker, &export.records, &export.ladder, &training_id, on_event)
}

/// Asks the ladder sweep going to stop (a second time: ends it now); its outcome follows on its channel.
#[tauri::command]
pub fn cancel_ladder(export: State<'_, ExportStep>) -> CancelAnswer {
    ladder::cancel(&export.ladder)
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
