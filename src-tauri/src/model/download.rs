//! The base model in the app: each published generation (Needle 3, Needle 2) from the Hugging Face
//! cache, or downloaded with a progress bar and Cancel. The download runs on a thread of the app (it
//! is network and disk, with bounded memory) through the engine's [`hub`]; a cancelled or cut
//! download resumes next time. One download at a time.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use needle_engine::generation::Generation;
use needle_engine::hub::{self, BaseModel, Hub, HubError, HubEvent, PublishedBase};
use serde::Serialize;
use tauri::ipc::Channel;

use crate::ground::lock;
use crate::model::preferences::Remembered;

/// What the Model step shows of the base models: every published one, newest first.
#[derive(Debug, Clone, Serialize)]
pub struct BaseModelStatus {
    /// The generation last chosen by Download or Use (Needle 3 until then).
    pub chosen: Generation,
    pub models: Vec<BaseModelOffer>,
}

/// One published base model as the panel offers it.
#[derive(Debug, Clone, Serialize)]
pub struct BaseModelOffer {
    pub generation: Generation,
    /// "Needle 3", as the generation is displayed.
    pub label: String,
    pub repo: &'static str,
    /// Its checkpoint and tokenizer, when both are in the cache.
    pub cached: Option<BaseModel>,
    /// Bytes of both files: on disk when cached, else as the hub announces them; `None` while it
    /// downloads, or when the hub cannot be asked (then `trouble` says why).
    pub bytes: Option<u64>,
    /// Bytes already on disk from a cancelled or cut download, which the next one resumes from.
    pub partial_bytes: u64,
    pub trouble: Option<HubTrouble>,
    /// Its download as the window last heard of it (idle while another generation downloads).
    pub download: DownloadState,
}

/// Why the hub could not say what a download would fetch.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HubTrouble {
    /// The hub cannot be reached (no connection, or `HF_HUB_OFFLINE` set): the panel says "offline" in
    /// one line rather than one message per model.
    pub offline: bool,
    /// The whole message (the address, the cause, the way around), which the panel keeps folded.
    pub details: String,
}

impl From<HubError> for HubTrouble {
    fn from(error: HubError) -> Self {
        let offline = matches!(error, HubError::Offline { .. } | HubError::Unreachable { .. });
        Self { offline, details: error.to_string() }
    }
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

/// The one download slot: the generation it is for, its state and its cancel flag.
#[derive(Default)]
pub struct Downloads {
    state: Mutex<Option<(Generation, DownloadState)>>,
    cancel: Mutex<Option<Arc<AtomicBool>>>,
}

impl Downloads {
    fn begin(&self, generation: Generation) -> Result<Arc<AtomicBool>, String> {
        let mut cancel = lock(&self.cancel);
        if cancel.is_some() {
            let downloading = lock(&self.state).as_ref().map_or(generation, |(running, _)| *running);
            return Err(format!("{downloading} is already downloading; wait for it or cancel it"));
        }
        let flag = Arc::new(AtomicBool::new(false));
        *cancel = Some(Arc::clone(&flag));
        *lock(&self.state) = Some((generation, DownloadState::Running { file: String::new(), bytes: 0, total: 0 }));
        Ok(flag)
    }

    fn progress(&self, event: &HubEvent) {
        let (file, bytes, total) = match event {
            HubEvent::Started { file, total, resumed_from } => (file, *resumed_from, *total),
            HubEvent::Progress { file, bytes, total, .. } => (file, *bytes, *total),
            _ => return,
        };
        if let Some((_, state)) = lock(&self.state).as_mut() {
            *state = DownloadState::Running { file: file.clone(), bytes, total };
        }
    }

    fn finish(&self, finished: DownloadState) {
        if let Some((_, state)) = lock(&self.state).as_mut() {
            *state = finished;
        }
        *lock(&self.cancel) = None;
    }

    /// The state of `generation`'s download: idle unless the slot's last download was its.
    fn state(&self, generation: Generation) -> DownloadState {
        match lock(&self.state).as_ref() {
            Some((of, state)) if *of == generation => state.clone(),
            _ => DownloadState::Idle,
        }
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

/// The panel's facts: for each published base model the cache (no network call when it has the
/// model), else what a download would fetch and how much of it is already here. The hub is asked
/// about every generation at once, so an unreachable one costs one timeout, not one per model.
pub fn status(hub: &Hub, downloads: &Downloads, chosen: Generation) -> BaseModelStatus {
    let models = std::thread::scope(|scope| {
        // Newest generation first.
        let asked: Vec<_> = PublishedBase::all()
            .rev()
            .map(|published| (published, scope.spawn(|| offer(hub, downloads, published))))
            .collect();
        asked
            .into_iter()
            .map(|(published, asking)| {
                asking.join().unwrap_or_else(|_| BaseModelOffer {
                    trouble: Some(HubTrouble {
                        offline: false,
                        details: "could not look this model up; press Retry".into(),
                    }),
                    ..blank_offer(published, downloads.state(published.generation))
                })
            })
            .collect()
    });
    BaseModelStatus { chosen, models }
}

fn blank_offer(published: &PublishedBase, download: DownloadState) -> BaseModelOffer {
    BaseModelOffer {
        generation: published.generation,
        label: published.generation.to_string(),
        repo: published.repo,
        cached: None,
        bytes: None,
        partial_bytes: 0,
        trouble: None,
        download,
    }
}

fn offer(hub: &Hub, downloads: &Downloads, published: &PublishedBase) -> BaseModelOffer {
    let download = downloads.state(published.generation);
    let running = matches!(download, DownloadState::Running { .. });
    let mut offer = blank_offer(published, download);
    offer.cached = hub::cached_base_model(hub, published.generation);
    if let Some(cached) = &offer.cached {
        offer.bytes = Some(file_size(&cached.checkpoint).saturating_add(file_size(&cached.tokenizer)));
    } else if !running {
        match announced_sizes(hub, published) {
            Ok((total, partial)) => (offer.bytes, offer.partial_bytes) = (Some(total), partial),
            Err(trouble) => offer.trouble = Some(trouble),
        }
    }
    offer
}

fn file_size(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.len())
}

/// The announced size of both files, and the bytes of them already on disk; else why the hub could
/// not say.
fn announced_sizes(hub: &Hub, published: &PublishedBase) -> Result<(u64, u64), HubTrouble> {
    let mut sizes = (0, 0);
    for file in published.hub_files() {
        let announced = hub.announce(&file).map_err(HubTrouble::from)?;
        sizes.0 = u64::saturating_add(sizes.0, announced.size);
        sizes.1 = u64::saturating_add(sizes.1, hub.partial_bytes(&file, &announced));
    }
    Ok(sizes)
}

/// `generation`'s cached base model, made the one the app uses (Use).
pub fn use_cached(hub: &Hub, preferences: &Remembered, generation: Generation) -> Result<BaseModel, String> {
    let base = hub::cached_base_model(hub, generation)
        .ok_or_else(|| format!("{generation} is not on this computer; download it first"))?;
    preferences.use_base_model(generation, &base)?;
    Ok(base)
}

/// Downloads `generation`'s base model on a thread, reporting to `channel`; on success the app uses
/// it from then on.
pub fn start(
    hub: Hub,
    downloads: Arc<Downloads>,
    preferences: Arc<Remembered>,
    generation: Generation,
    channel: Channel<DownloadMessage>,
) -> Result<(), String> {
    let cancel = downloads.begin(generation)?;
    std::thread::spawn(move || {
        // Frees the slot even if this thread panics, so Download works again.
        let slot = SlotGuard(Arc::clone(&downloads));
        let mut on_event = |event: HubEvent| {
            downloads.progress(&event);
            // A window that went away stops listening; the download itself carries on to the cache.
            let _ = channel.send(DownloadMessage::Progress(event));
        };
        let result = hub::resolve_base_model(&hub, generation, None, None, &mut on_event, &cancel);
        let (state, base) = match result {
            Ok(base) => match preferences.use_base_model(generation, &base) {
                Ok(()) => (DownloadState::Done, Some(base)),
                Err(message) => (DownloadState::Failed { message }, Some(base)),
            },
            Err(error @ HubError::Cancelled { .. }) => (DownloadState::Cancelled { message: error.to_string() }, None),
            Err(error) => (DownloadState::Failed { message: error.to_string() }, None),
        };
        downloads.finish(state.clone());
        drop(slot);
        let _ = channel.send(DownloadMessage::Finished { state, base });
    });
    Ok(())
}

/// Marks the download failed when its thread ends without saying how it ended (a panic): the slot
/// is still taken then, while a finished download has already freed it.
struct SlotGuard(Arc<Downloads>);

impl Drop for SlotGuard {
    fn drop(&mut self) {
        if lock(&self.0.cancel).is_some() {
            let message = "the download stopped unexpectedly; press Download to resume it".to_string();
            self.0.finish(DownloadState::Failed { message });
        }
    }
}
