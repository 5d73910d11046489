//! The hub's repositories and the files in them: the published base models, where the hub is and who
//! is asking, and finding (or fetching) a generation's checkpoint and tokenizer.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::generation::Generation;

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
    // The file boxed: with both values it would make every `Result<_, HubError>` over clippy's size bound.
    Mismatch { file: Box<RepoFile>, what: &'static str, expected: String, actual: String },
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

static NEEDLE2_BASE: PublishedBase = PublishedBase {
    generation: Generation::Needle2,
    repo: "Cactus-Compute/needle2",
    checkpoint: "checkpoints/needle2.pkl",
    tokenizer: "tokenizer/tokenizer.model",
};

static NEEDLE3_BASE: PublishedBase = PublishedBase {
    generation: Generation::Needle3,
    repo: "Cactus-Compute/needle3",
    checkpoint: "checkpoints/needle3.safetensors",
    tokenizer: "tokenizer/tokenizer.model",
};

impl PublishedBase {
    /// The published base model of `generation`.
    pub fn of(generation: Generation) -> &'static Self {
        match generation {
            Generation::Needle2 => &NEEDLE2_BASE,
            Generation::Needle3 => &NEEDLE3_BASE,
        }
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

    pub(super) fn offline_error(&self, file: &RepoFile) -> HubError {
        HubError::Offline { file: file.clone(), url: self.url(file), cache: self.cache.clone() }
    }
}

/// A file committed to a repository on the hub.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Uploaded {
    /// `org/model/path`, as [`RepoFile::name`] writes it.
    pub file: String,
    pub bytes: u64,
    /// The repository's page on the hub.
    pub url: String,
    /// The commit that added the file; `None` when the repository already held these bytes there.
    pub commit: Option<String>,
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
