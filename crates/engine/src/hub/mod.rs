//! The base model from the Hugging Face hub: where it is cached, how it is fetched, and the one rule
//! every command and the app use to find the checkpoint and tokenizer.
//!
//! The reference downloads its generation's checkpoint and tokenizer from the hub when no checkpoint
//! is given (2.x: `checkpoints/needle2.pkl` of `Cactus-Compute/needle2`; 3.x:
//! `checkpoints/needle3.safetensors` of `Cactus-Compute/needle3`: [`PublishedBase::of`], from the generation's profile); so does
//! [`resolve_base_model`], into the
//! cache `huggingface_hub` uses ([`cache`]), with progress as [`HubEvent`]s, resume after a cut,
//! and the size and content hash the hub announces checked before the file takes its place
//! (`transfer`). The environment is read as `huggingface_hub` reads it: `HF_ENDPOINT`, `HF_TOKEN`,
//! `HF_HUB_OFFLINE`, `HF_HOME`, `HF_HUB_CACHE`.
//!
//! The other way, [`Hub::upload`] pushes a built `.cact` to the user's model repository
//! ([`upload`]), as the reference's `needle build --upload` does.

pub mod cache;
mod transfer;
pub mod upload;

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

use serde::Serialize;

use crate::generation::Generation;
use cache::RepoCache;
pub use transfer::Announced;
pub use upload::Uploaded;

/// A base model Cactus Compute publishes on the hub: its generation, its repository and the two
/// files the reference fetches from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PublishedBase {
    pub generation: Generation,
    pub repo: &'static str,
    pub checkpoint: &'static str,
    pub tokenizer: &'static str,
}

pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";
pub const DEFAULT_REVISION: &str = "main";

/// Where the hub is, who is asking, and where its files are kept.
#[derive(Debug, Clone)]
pub struct Hub {
    /// Base URL, `https://huggingface.co` unless `HF_ENDPOINT` says otherwise (a mirror, a test server).
    pub endpoint: String,
    /// Sent as a bearer token to the endpoint's host only, never to the storage it redirects to.
    pub token: Option<String>,
    /// `HF_HUB_OFFLINE=1`: the cache or a clear error, never a network call.
    pub offline: bool,
    /// The hub cache folder (`…/huggingface/hub`), shared with `huggingface_hub`.
    pub cache: PathBuf,
}

/// One file of one repository at one revision (a branch, a tag or a commit hash).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepoFile {
    pub repo: String,
    pub revision: String,
    pub path: String,
}

/// Paths to a base checkpoint and its tokenizer, wherever they came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BaseModel {
    pub checkpoint: PathBuf,
    pub tokenizer: PathBuf,
}

/// Progress of fetching files from the hub (or pushing one to it), rendered as a bar by the CLI and
/// the app and printed as JSON lines by `needle download --events jsonl` (and `needle build --upload
/// --events jsonl`), like training's events.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum HubEvent {
    /// The file is in the cache: nothing was asked of the network.
    Cached {
        file: String,
        path: PathBuf,
        bytes: u64,
    },
    /// A transfer starts; `resumed_from` bytes are already on disk from an earlier, cut one.
    Started {
        file: String,
        total: u64,
        resumed_from: u64,
    },
    /// Bytes on disk so far (resumed ones included), or sent so far, with the rate of this transfer.
    Progress {
        file: String,
        bytes: u64,
        total: u64,
        bytes_per_s: f64,
        eta_s: f64,
    },
    /// The file arrived whole, matched the hub's size and hash, and is in the cache at `path`.
    Downloaded {
        file: String,
        path: PathBuf,
        bytes: u64,
    },
    /// A push starts: `total` bytes of a local file go to `file` (`org/model/path`).
    Uploading {
        file: String,
        total: u64,
    },
    /// The file is committed to its repository.
    Uploaded(Uploaded),
    Failed {
        message: String,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum HubError {
    #[error("HF_HUB_OFFLINE is set and {} is not in the hub cache at {}: {}", .file.name(), .cache.display(), by_hand(.url))]
    Offline { file: RepoFile, url: String, cache: PathBuf },
    #[error("could not reach the model hub at {endpoint} ({cause}); check the connection (or HF_ENDPOINT), or {}", by_hand(.url))]
    Unreachable { endpoint: String, url: String, cause: String },
    #[error("the hub refused {} (HTTP {status}): {}", .file.name(), refusal_fix(*.token_sent))]
    Refused { file: RepoFile, status: u16, token_sent: bool },
    #[error("the hub has no {what} (HTTP 404 for {url}); check the name and the revision")]
    NotFound { what: String, url: String },
    #[error("the hub answered HTTP {status} for {url}; try again later")]
    Status { url: String, status: u16 },
    #[error("the hub kept redirecting (last HTTP {status}, at {url}); check HF_ENDPOINT")]
    Redirects { url: String, status: u16 },
    #[error(
        "the hub's answer for {url} has no {what}, so the file cannot be verified; is HF_ENDPOINT a Hugging Face hub?"
    )]
    Unverifiable { url: String, what: &'static str },
    #[error("the download of {} stopped at {got} of {total} bytes ({cause}); run it again to resume from there", .file.name())]
    Cut { file: RepoFile, got: u64, total: u64, cause: String },
    #[error("the download of {} was cancelled at {got} of {total} bytes; it resumes from there next time", .file.name())]
    Cancelled { file: RepoFile, got: u64, total: u64 },
    #[error("the hub sent {} with {what} {actual} but announced {expected}; the damaged download was removed, try again", .file.name())]
    Mismatch { file: RepoFile, what: &'static str, expected: String, actual: String },
    #[error("{} is being downloaded by another process ({} is locked); wait for it to finish", .file.name(), .path.display())]
    Busy { file: RepoFile, path: PathBuf },
    #[error("{}: {source}; the hub cache must be a writable folder (set HF_HOME or HF_HUB_CACHE to move it)", .path.display())]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{repo:?} is not a model repository name: use <you>/<model> (letters, digits, '-', '_' and '.')")]
    RepoName { repo: String },
    #[error("uploading to {repo} needs an access token with write access: create one at https://huggingface.co/settings/tokens and set HF_TOKEN to it")]
    NoToken { repo: String },
    #[error("HF_HUB_OFFLINE is set, so {file} cannot be uploaded; unset it to upload")]
    OfflineUpload { file: String },
    #[error("could not read {}: {source}", .path.display())]
    Read { path: PathBuf, source: std::io::Error },
    #[error("the hub refused to write to {repo} (HTTP {status}): the token lacks write access to it; use a token with write access (https://huggingface.co/settings/tokens)")]
    WriteRefused { repo: String, status: u16 },
    #[error("{step} failed: the hub answered HTTP {status} for {url}: {message}")]
    UploadRefused { step: &'static str, status: u16, url: String, message: String },
    #[error("the repository's .gitignore excludes {file}, so the hub would not keep it; change the .gitignore or the file's name")]
    Ignored { file: String },
    #[error("the hub's answer to {url} was not understood ({what}); is HF_ENDPOINT a Hugging Face hub?")]
    Unexpected { url: String, what: String },
    #[error("the upload could not reach {endpoint} ({cause}); check the connection (or HF_ENDPOINT) and run it again")]
    UploadCut { endpoint: String, cause: String },
    /// `leftover`: why the repository the upload created could not be deleted again, if it could not.
    #[error("the upload of {file} was cancelled before its commit, so nothing of it was published{}", cancel_leftover(.leftover))]
    UploadCancelled { file: String, leftover: Option<String> },
}

/// The way around the hub: which address to fetch on a connected machine, and how to use the file.
fn by_hand(url: &str) -> String {
    format!(
        "fetch {url} on a connected machine and choose that file (--checkpoint for a .pkl or .safetensors, \
         --tokenizer for a .model; a tokenizer.model beside the checkpoint is found by itself)"
    )
}

fn cancel_leftover(leftover: &Option<String>) -> String {
    match leftover {
        None => String::new(),
        Some(cause) => format!(
            "; the empty repository it had created is still there ({cause}): delete it on the hub if it is not wanted"
        ),
    }
}

fn refusal_fix(token_sent: bool) -> &'static str {
    if token_sent {
        "the token in HF_TOKEN cannot read it; check its access, or accept the model's terms on its page"
    } else {
        "it is private or gated; set HF_TOKEN to an access token that can read it (https://huggingface.co/settings/tokens)"
    }
}

impl RepoFile {
    pub fn new(repo: &str, revision: &str, path: &str) -> Self {
        Self { repo: repo.into(), revision: revision.into(), path: path.into() }
    }

    /// `org/model/path/in/repo`, as a user would name it.
    pub fn name(&self) -> String {
        format!("{}/{}", self.repo, self.path)
    }
}

impl PublishedBase {
    /// The published base model of `generation`.
    pub fn of(generation: Generation) -> &'static Self {
        &generation.profile().hub
    }

    /// Every published base model, oldest generation first.
    pub fn all() -> impl DoubleEndedIterator<Item = &'static Self> {
        Generation::ALL.into_iter().map(Self::of)
    }

    /// The published base model whose repository is `repo`, if any.
    pub fn in_repo(repo: &str) -> Option<&'static Self> {
        Self::all().find(|base| base.repo == repo)
    }

    /// Its checkpoint and tokenizer in `repo` (its own, or a mirror of it) at `revision`.
    pub fn files(&self, repo: &str, revision: &str) -> [RepoFile; 2] {
        [RepoFile::new(repo, revision, self.checkpoint), RepoFile::new(repo, revision, self.tokenizer)]
    }

    /// Its checkpoint and tokenizer in its own repository, at the default revision.
    pub fn hub_files(&self) -> [RepoFile; 2] {
        self.files(self.repo, DEFAULT_REVISION)
    }
}

impl Hub {
    /// The hub as `huggingface_hub` would configure itself from the environment.
    pub fn from_env() -> Self {
        let var = |name: &str| std::env::var(name).ok().filter(|value| !value.trim().is_empty());
        let hf_home = var("HF_HOME").map(PathBuf::from).unwrap_or_else(|| {
            let cache = var("XDG_CACHE_HOME").map(PathBuf::from);
            cache.or_else(|| dirs::home_dir().map(|home| home.join(".cache"))).unwrap_or_default().join("huggingface")
        });
        let token_file = var("HF_TOKEN_PATH").map(PathBuf::from).unwrap_or_else(|| hf_home.join("token"));
        let saved_token =
            || std::fs::read_to_string(&token_file).ok().map(|t| t.trim().to_string()).filter(|t| !t.is_empty());
        Self {
            endpoint: var("HF_ENDPOINT").unwrap_or_else(|| DEFAULT_ENDPOINT.into()).trim_end_matches('/').to_string(),
            token: var("HF_TOKEN").or_else(saved_token),
            offline: var("HF_HUB_OFFLINE")
                .is_some_and(|v| matches!(v.to_ascii_lowercase().as_str(), "1" | "true" | "yes" | "on")),
            cache: var("HF_HUB_CACHE").map(PathBuf::from).unwrap_or_else(|| hf_home.join("hub")),
        }
    }

    /// The address the file is fetched from.
    pub fn url(&self, file: &RepoFile) -> String {
        format!("{}/{}/resolve/{}/{}", self.endpoint, file.repo, file.revision, file.path)
    }

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

    fn offline_error(&self, file: &RepoFile) -> HubError {
        HubError::Offline { file: file.clone(), url: self.url(file), cache: self.cache.clone() }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_generation_has_one_published_base_model() {
        for generation in Generation::ALL {
            let rows: Vec<_> = PublishedBase::all().filter(|base| base.generation == generation).collect();
            assert_eq!(rows.len(), 1, "{generation}");
            assert_eq!(PublishedBase::of(generation), rows[0]);
            assert_eq!(PublishedBase::in_repo(rows[0].repo), Some(rows[0]));
        }
        let [checkpoint, tokenizer] = PublishedBase::of(Generation::Needle3).hub_files();
        assert_eq!(checkpoint.name(), "Cactus-Compute/needle3/checkpoints/needle3.safetensors");
        assert_eq!(tokenizer.name(), "Cactus-Compute/needle3/tokenizer/tokenizer.model");
        assert_eq!(PublishedBase::in_repo("someone/mirror"), None);
    }
}
