//! The base model in the app: Needle 2 from the Hugging Face cache, or downloaded on first start with
//! a progress bar and Cancel. The download runs on a thread of the app (it is network and disk, with
//! bounded memory) through the engine's [`hub`]; a cancelled or cut download resumes next time.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use needle_engine::hub::{self, BaseModel, Hub, HubError, HubEvent, RepoFile};
use serde::Serialize;
use tauri::ipc::Channel;

use crate::lock;
use crate::studio::Studio;

/// What the Base model panel shows.
#[derive(Debug, Clone, Serialize)]
pub struct BaseModelStatus {
    pub repo: &'static str,
    /// Needle 2's checkpoint and tokenizer, when both are in the cache.
    pub cached: Option<BaseModel>,
    /// Bytes of both files as the hub announces them; `None` when cached, or when the hub cannot be
    /// asked (then `note` says why).
    pub download_bytes: Option<u64>,
    /// Bytes already on disk from a cancelled or cut download, which the next one resumes from.
    pub partial_bytes: u64,
    pub note: Option<String>,
    pub download: DownloadState,
}

/// The download as the window last heard of it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum DownloadState {
    Idle,
    Running { file: String, bytes: u64, total: u64 },
    Done,
    Failed { message: String },
    Cancelled { message: String },
}

/// What the window hears while downloading: the hub's events as they are, then the outcome.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum DownloadMessage {
    Progress(HubEvent),
    Finished { state: DownloadState, base: Option<BaseModel> },
}

/// The answer to Cancel.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CancelDownload {
    /// Nothing was downloading.
    Idle,
    /// The transfer stops at its next chunk; what arrived is kept for next time.
    Stopping,
}

/// The one download slot: its state and its cancel flag.
#[derive(Default)]
pub struct Downloads {
    state: Mutex<Option<DownloadState>>,
    cancel: Mutex<Option<Arc<AtomicBool>>>,
}

impl Downloads {
    fn begin(&self) -> Result<Arc<AtomicBool>, String> {
        let mut cancel = lock(&self.cancel);
        if cancel.is_some() {
            return Err("the base model is already downloading".into());
        }
        let flag = Arc::new(AtomicBool::new(false));
        *cancel = Some(Arc::clone(&flag));
        *lock(&self.state) = Some(DownloadState::Running { file: String::new(), bytes: 0, total: 0 });
        Ok(flag)
    }

    fn progress(&self, event: &HubEvent) {
        let running = match event {
            HubEvent::Started { file, total, resumed_from } => (file, *resumed_from, *total),
            HubEvent::Progress { file, bytes, total, .. } => (file, *bytes, *total),
            _ => return,
        };
        *lock(&self.state) =
            Some(DownloadState::Running { file: running.0.clone(), bytes: running.1, total: running.2 });
    }

    fn finish(&self, state: DownloadState) {
        *lock(&self.state) = Some(state);
        *lock(&self.cancel) = None;
    }

    fn state(&self) -> DownloadState {
        lock(&self.state).clone().unwrap_or(DownloadState::Idle)
    }

    pub fn cancel(&self) -> CancelDownload {
        match lock(&self.cancel).as_ref() {
            Some(flag) => {
                flag.store(true, Ordering::Relaxed);
                CancelDownload::Stopping
            }
            None => CancelDownload::Idle,
        }
    }
}

/// The panel's facts: the cache (no network call when it has the model), else what a download
/// would fetch and how much of it is already here.
pub fn status(studio: &Studio) -> BaseModelStatus {
    let hub = studio.hub();
    let download = studio.downloads().state();
    let mut status = BaseModelStatus {
        repo: hub::NEEDLE2_REPO,
        cached: hub::cached_base_model(hub),
        download_bytes: None,
        partial_bytes: 0,
        note: None,
        download,
    };
    if status.cached.is_none() && !matches!(status.download, DownloadState::Running { .. }) {
        match announced_sizes(hub) {
            Ok((total, partial)) => (status.download_bytes, status.partial_bytes) = (Some(total), partial),
            Err(error) => status.note = Some(error.to_string()),
        }
    }
    status
}

/// The announced size of both files, and the bytes of them already on disk.
fn announced_sizes(hub: &Hub) -> Result<(u64, u64), HubError> {
    let mut sizes = (0, 0);
    for file in RepoFile::base_model(hub::NEEDLE2_REPO, hub::DEFAULT_REVISION) {
        let announced = hub.announce(&file)?;
        sizes.0 = u64::saturating_add(sizes.0, announced.size);
        sizes.1 = u64::saturating_add(sizes.1, hub.partial_bytes(&file, &announced));
    }
    Ok(sizes)
}

/// Downloads Needle 2 on a thread, reporting to `channel`; on success the app uses it from then on.
pub fn start(studio: &Studio, channel: Channel<DownloadMessage>) -> Result<(), String> {
    let cancel = studio.downloads().begin()?;
    let studio = studio.clone();
    std::thread::spawn(move || {
        // Frees the slot even if this thread panics, so Download works again.
        let slot = SlotGuard(studio.clone());
        let mut on_event = |event: HubEvent| {
            studio.downloads().progress(&event);
            // A window that went away stops listening; the download itself carries on to the cache.
            let _ = channel.send(DownloadMessage::Progress(event));
        };
        let result = hub::resolve_base_model(studio.hub(), None, None, &mut on_event, &cancel);
        let (state, base) = match result {
            Ok(base) => match studio.use_base_model(&base) {
                Ok(()) => (DownloadState::Done, Some(base)),
                Err(message) => (DownloadState::Failed { message }, Some(base)),
            },
            Err(error @ HubError::Cancelled { .. }) => (DownloadState::Cancelled { message: error.to_string() }, None),
            Err(error) => (DownloadState::Failed { message: error.to_string() }, None),
        };
        studio.downloads().finish(state.clone());
        drop(slot);
        let _ = channel.send(DownloadMessage::Finished { state, base });
    });
    Ok(())
}

/// Marks the download failed when its thread ends without saying how it ended (a panic): the slot
/// is still taken then, while a finished download has already freed it.
struct SlotGuard(Studio);

impl Drop for SlotGuard {
    fn drop(&mut self) {
        let downloads = self.0.downloads();
        if lock(&downloads.cancel).is_some() {
            let message = "the download stopped unexpectedly; press Download to resume it".to_string();
            downloads.finish(DownloadState::Failed { message });
        }
    }
}
