//! The Train step's commands: check, plan, start, resume and cancel a training.

use std::time::Duration;

use needle_engine::settings::FieldErrors;
use needle_engine::train::Plan;
use tauri::ipc::Channel;
use tauri::{AppHandle, Runtime, State};
use tauri_plugin_notification::NotificationExt;

use crate::ground::{blocking, Answer};
use crate::record::trainings::HistoryEntry;
use crate::train::draft::TrainingDraft;
use crate::train::job::{self, Notify, TrainingMessage};
use crate::train::step::TrainStep;
use crate::worker::process::CancelAnswer;

#[tauri::command]
pub fn validate_training(train: State<'_, TrainStep>, draft: TrainingDraft) -> FieldErrors {
    draft.check(&train.devices).err().unwrap_or_default()
}

#[tauri::command]
pub async fn plan_training(train: State<'_, TrainStep>, draft: TrainingDraft) -> Answer<Plan> {
    let train = train.inner().clone();
    blocking(move || train.plan(&draft)).await
}

#[tauri::command]
pub async fn start_training<R: Runtime>(
    app: AppHandle<R>,
    train: State<'_, TrainStep>,
    draft: TrainingDraft,
    on_event: Channel<TrainingMessage>,
) -> Answer<HistoryEntry> {
    let request = train.check(&draft)?;
    job::start(&train.place(), &request, on_event, notifier(app, &train))
}

#[tauri::command]
pub async fn resume_training<R: Runtime>(
    app: AppHandle<R>,
    train: State<'_, TrainStep>,
    id: String,
    on_event: Channel<TrainingMessage>,
) -> Answer<HistoryEntry> {
    job::resume(&train.place(), &id, on_event, notifier(app, &train))
}

/// Desktop notifications for the end of a training longer than the preferences' threshold.
fn notifier<R: Runtime>(app: AppHandle<R>, train: &TrainStep) -> Notify {
    Notify {
        after: Duration::from_secs(train.preferences.get().notify_after_s),
        show: Box::new(move |title, body| {
            // No notification service (a bare X session, say) is no reason to fail a finished training.
            let _ = app.notification().builder().title(title).body(body).show();
        }),
    }
}

#[tauri::command]
pub fn cancel_training(train: State<'_, TrainStep>) -> CancelAnswer {
    train.slot.cancel()
}
