//! Publishing a training's built `.cact` from the Export step, as `needle build --upload` does: pushed to
//! a model repository on the hub by the engine ([`Hub::upload`]) on a thread of the app (network and
//! disk, like a download), its progress kept here for the window. The repository's name starts as
//! `NEEDLE_HF_REPO` says; the token is `HF_TOKEN`'s, or one typed once and kept in the keychain
//! ([`crate::secrets`]), else the one `huggingface-cli login` saved. One upload at a time; Cancel stops
//! it before its commit, so nothing is half-published and the hub is left as it was.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use needle_engine::hub::upload::{is_repo_name, REPO_VAR};
use needle_engine::hub::{Hub, HubError, HubEvent, RepoFile, Uploaded, DEFAULT_REVISION};
use serde::Serialize;
use tauri::ipc::Channel;

use crate::ground::lock;
use crate::record::trainings::Records;
use crate::secrets::keys::{KeySource, Keys};

/// What the Publish form starts with.
#[derive(Debug, Clone, Serialize)]
pub struct PublishSetup {
    /// `NEEDLE_HF_REPO`, when it is set.
    pub repo: Option<String>,
    pub token: KeySource,
    pub state: PublishState,
}

/// The upload as the app last heard of it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum PublishState {
    Idle,
    Running {
        file: String,
        bytes: u64,
        total: u64,
    },
    Published(Uploaded),
    /// Stopped before the commit: the message says what (if anything) is left on the hub.
    Cancelled {
        message: String,
    },
    Failed {
        message: String,
    },
}

/// What the window hears: the hub's events as they are, then the outcome.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum PublishMessage {
    Progress(HubEvent),
    Finished { state: PublishState },
}

/// The one upload slot, and the flag that cancels the upload in it.
#[derive(Default)]
pub struct Publishing {
    state: Mutex<Option<PublishState>>,
    cancel: Arc<AtomicBool>,
}

impl Publishing {
    pub fn state(&self) -> PublishState {
        lock(&self.state).clone().unwrap_or(PublishState::Idle)
    }

    fn begin(&self, file: String) -> Result<(), String> {
        let mut state = lock(&self.state);
        if let Some(PublishState::Running { file, .. }) = &*state {
            return Err(format!("{file} is being uploaded; wait for it to finish"));
        }
        self.cancel.store(false, Ordering::Relaxed);
        *state = Some(PublishState::Running { file, bytes: 0, total: 0 });
        Ok(())
    }

    /// Asks the upload going to stop before its commit; the state as it is now (the outcome
    /// follows on the upload's channel).
    pub fn cancel(&self) -> PublishState {
        let state = lock(&self.state);
        if let Some(PublishState::Running { .. }) = &*state {
            self.cancel.store(true, Ordering::Relaxed);
        }
        state.clone().unwrap_or(PublishState::Idle)
    }

    fn progress(&self, event: &HubEvent) {
        let (file, bytes, total) = match event {
            HubEvent::Uploading { file, total } => (file, 0, *total),
            HubEvent::Progress { file, bytes, total, .. } => (file, *bytes, *total),
            _ => return,
        };
        *lock(&self.state) = Some(PublishState::Running { file: file.clone(), bytes, total });
    }

    fn finish(&self, state: PublishState) {
        *lock(&self.state) = Some(state);
    }
}

pub fn setup(token: &Keys, publishing: &Publishing) -> PublishSetup {
    let repo = std::env::var(REPO_VAR).ok().map(|repo| repo.trim().to_string()).filter(|repo| !repo.is_empty());
    PublishSetup { repo, token: token.source(), state: publishing.state() }
}

/// Where an upload goes from and to: the records (the built file, and where it went), the hub and
/// its token, and the one upload slot.
pub struct Place<'a> {
    pub records: &'a Records,
    pub hub: &'a Hub,
    pub token: &'a Keys,
    pub publishing: &'a Arc<Publishing>,
}

/// Uploads training `training_id`'s built `.cact` to `repo` under its file name, on a thread, reporting to
/// `channel`.
pub fn start(place: &Place, training_id: &str, repo: &str, channel: Channel<PublishMessage>) -> Result<(), String> {
    let repo = repo.trim();
    if !is_repo_name(repo) {
        return Err("type the model repository as <you>/<model>".into());
    }
    let cact = place.records.load(training_id)?.entry.cact.ok_or("build the .cact first, then publish it")?;
    let name = cact.path.file_name().ok_or("the built file has no name")?.to_string_lossy().into_owned();
    let token = place.token.value().or_else(|| place.hub.token.clone());
    let token = token.ok_or("type a Hugging Face token with write access (https://huggingface.co/settings/tokens)")?;
    let hub = Hub { token: Some(token), ..place.hub.clone() };
    let target = RepoFile::new(repo, DEFAULT_REVISION, &name);
    place.publishing.begin(target.name())?;
    let (records, publishing, training_id) =
        (place.records.clone(), Arc::clone(place.publishing), training_id.to_owned());
    std::thread::spawn(move || {
        let mut on_event = |event: HubEvent| {
            publishing.progress(&event);
            // A window that went away stops listening; the upload carries on.
            let _ = channel.send(PublishMessage::Progress(event));
        };
        let state = match hub.upload(&cact.path, &target, &mut on_event, &publishing.cancel) {
            Ok(uploaded) => match remember(&records, &training_id, &cact.path, &uploaded) {
                Ok(()) => PublishState::Published(uploaded),
                Err(error) => PublishState::Failed {
                    message: format!(
                        "published at {}, but the training's history could not be updated: {error}",
                        uploaded.url
                    ),
                },
            },
            Err(error @ HubError::UploadCancelled { .. }) => PublishState::Cancelled { message: error.to_string() },
            Err(error) => PublishState::Failed { message: error.to_string() },
        };
        publishing.finish(state.clone());
        let _ = channel.send(PublishMessage::Finished { state });
    });
    Ok(())
}

/// Keeps where the file went with its training, for History and for the Export step when the training is opened
/// again. A `.cact` built again since the upload began is another file, and stays unpublished.
fn remember(records: &Records, training_id: &str, path: &Path, uploaded: &Uploaded) -> Result<(), String> {
    let mut record = records.load(training_id)?;
    match &mut record.entry.cact {
        Some(cact) if cact.path == path => cact.published = Some(uploaded.clone()),
        _ => return Ok(()),
    }
    records.save(&record)
}
