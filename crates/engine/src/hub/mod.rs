//! The base model from the Hugging Face hub: where it is cached, how it is fetched, and the one rule
//! every command and the app use to find the checkpoint and tokenizer.
//!
//! The reference downloads its generation's checkpoint and tokenizer from the hub when no checkpoint
//! is given (2.x: `checkpoints/needle2.pkl` of `Cactus-Compute/needle2`; 3.x:
//! `checkpoints/needle3.safetensors` of `Cactus-Compute/needle3`: [`PublishedBase::of`]); so does
//! [`resolve_base_model`], into the
//! cache `huggingface_hub` uses ([`cache`]), with progress as [`HubEvent`]s, resume after a cut,
//! and the size and content hash the hub announces checked before the file takes its place
//! (`transfer`). The environment is read as `huggingface_hub` reads it: `HF_ENDPOINT`, `HF_TOKEN`,
//! `HF_HUB_OFFLINE`, `HF_HOME`, `HF_HUB_CACHE`.
//!
//! The other way, [`Hub::upload`] pushes a built `.cact` to the user's model repository
//! ([`upload`]), as the reference's `needle build --upload` does.

pub mod cache;
mod repo;
mod transfer;
pub mod upload;

pub use repo::*;
pub use transfer::Announced;

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

use crate::generation::Generation;
use cache::RepoCache;

// The hub's entry points, each handed to the room that does it: the cache, a download, an upload.
impl Hub {
    /// The file as last fetched for its revision; no network call.
    pub fn cached(&self, file: &RepoFile) -> Option<PathBuf> {
        RepoCache::new(&self.cache, &file.repo).cached(file)
    }

    /// What the hub says the file is (commit, content hash, size) without fetching it.
    pub fn announce(&self, file: &RepoFile) -> Result<Announced, HubError> {
        if self.offline {
            return Err(self.offline_error(file));
        }
        transfer::announce(self, file)
    }

    /// Bytes of the announced file already on disk from a cancelled or cut download.
    pub fn partial_bytes(&self, file: &RepoFile, announced: &Announced) -> u64 {
        let partial = RepoCache::new(&self.cache, &file.repo).incomplete_path(&announced.etag);
        std::fs::metadata(partial).map_or(0, |m| m.len())
    }

    /// The cached file, or else the file fetched now.
    pub fn get(
        &self,
        file: &RepoFile,
        on_event: &mut dyn FnMut(HubEvent),
        cancel: &AtomicBool,
    ) -> Result<PathBuf, HubError> {
        match self.cached(file) {
            Some(path) => {
                let bytes = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
                on_event(HubEvent::Cached { file: file.name(), path: path.clone(), bytes });
                Ok(path)
            }
            None => self.fetch(file, on_event, cancel),
        }
    }

    /// Asks the hub for the file's current version and downloads it unless the cache has those bytes.
    pub fn fetch(
        &self,
        file: &RepoFile,
        on_event: &mut dyn FnMut(HubEvent),
        cancel: &AtomicBool,
    ) -> Result<PathBuf, HubError> {
        let announced = self.announce(file)?;
        transfer::download(self, file, &announced, on_event, cancel)
    }

    /// Creates `target`'s repository unless it exists and commits the file at `local` to
    /// `target.path` on `target.revision`, as `huggingface_hub`'s `create_repo(exist_ok=True)` and
    /// `upload_file` do; `cancel` stops it before the commit, the hub left as it was.
    pub fn upload(
        &self,
        local: &Path,
        target: &RepoFile,
        on_event: &mut dyn FnMut(HubEvent),
        cancel: &AtomicBool,
    ) -> Result<Uploaded, HubError> {
        if self.offline {
            return Err(HubError::OfflineUpload { file: target.name() });
        }
        upload::upload(self, local, target, on_event, cancel)
    }
}

/// The base model for a command or the app: the checkpoint given, else `generation`'s published
/// one from the cache, else from the hub; the tokenizer given, else the `tokenizer.model` beside a
/// given checkpoint, else from the hub that of the checkpoint's own generation (read from the file;
/// `generation` when it cannot be told).
pub fn resolve_base_model(
    hub: &Hub,
    generation: Generation,
    checkpoint: Option<&Path>,
    tokenizer: Option<&Path>,
    on_event: &mut dyn FnMut(HubEvent),
    cancel: &AtomicBool,
) -> Result<BaseModel, HubError> {
    let [hub_checkpoint, _] = PublishedBase::of(generation).hub_files();
    let (checkpoint, generation) = match checkpoint {
        // A checkpoint's own generation decides which tokenizer it falls back to.
        Some(path) => (path.to_path_buf(), crate::checkpoint::file_generation(path).unwrap_or(generation)),
        None => (hub.get(&hub_checkpoint, on_event, cancel)?, generation),
    };
    let tokenizer = resolve_tokenizer(hub, generation, tokenizer, Some(&checkpoint), on_event, cancel)?;
    Ok(BaseModel { checkpoint, tokenizer })
}

/// The tokenizer given, else the `tokenizer.model` beside `checkpoint`, else `generation`'s from
/// the hub.
pub fn resolve_tokenizer(
    hub: &Hub,
    generation: Generation,
    tokenizer: Option<&Path>,
    checkpoint: Option<&Path>,
    on_event: &mut dyn FnMut(HubEvent),
    cancel: &AtomicBool,
) -> Result<PathBuf, HubError> {
    if let Some(path) = tokenizer {
        return Ok(path.to_path_buf());
    }
    let beside = checkpoint.map(crate::tokenizer::default_path).filter(|path| path.is_file());
    match beside {
        Some(path) => Ok(path),
        None => {
            let [_, hub_tokenizer] = PublishedBase::of(generation).hub_files();
            hub.get(&hub_tokenizer, on_event, cancel)
        }
    }
}

/// `generation`'s published checkpoint and tokenizer if both are cached (no network call).
pub fn cached_base_model(hub: &Hub, generation: Generation) -> Option<BaseModel> {
    let [checkpoint, tokenizer] = PublishedBase::of(generation).hub_files();
    Some(BaseModel { checkpoint: hub.cached(&checkpoint)?, tokenizer: hub.cached(&tokenizer)? })
}
