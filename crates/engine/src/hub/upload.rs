//! Pushing a file to a model repository, as the reference's `needle build --upload` does through
//! `huggingface_hub` (`create_repo(exist_ok=True)`, then `upload_file`), over the hub's HTTP API:
//!
//! 1. `POST /api/repos/create`; a 409 means the repository is there already, which is fine;
//! 2. `POST /api/models/<repo>/preupload/<revision>`: the hub says how the file travels, `lfs` or
//!    `regular` (it refuses binary files over 1 MB in a plain commit, so a `.cact` goes by LFS);
//! 3. for `lfs`, the Git LFS batch API (`POST /<repo>.git/info/lfs/objects/batch`) names where the
//!    bytes go: one `PUT`, or one per part and a completion call; then its `verify` call, if any;
//! 4. `POST /api/models/<repo>/commit/<revision>`, an NDJSON commit that names the LFS object by its
//!    sha256 (or carries a regular file's bytes in base64).
//!
//! `huggingface_hub` sends large files by the Xet protocol where `hf_xet` is installed and by this
//! LFS path where it is not; the hub takes both, and only the LFS one is plain HTTP.
//!
//! Nothing is in the repository until the commit, the last step, so an upload cancelled before it
//! leaves the repository as it was (bytes sent to storage belong to no commit); a repository the
//! cancelled upload created itself is deleted again (`DELETE /api/repos/delete`).

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use base64::Engine as _;
use serde::Deserialize;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use ureq::http::Response;
use ureq::{Body, SendBody};

use super::transfer::{agent, authorized, header, hex, origin, Meter};
use super::{Hub, HubError, HubEvent, RepoFile, Uploaded};

/// Where the CLI and the app look for the repository to upload to, as the reference does.
pub const REPO_VAR: &str = "NEEDLE_HF_REPO";

/// The content types of the Git LFS API.
const LFS_JSON: &str = "application/vnd.git-lfs+json";
/// The hub looks at this much of the file's start to tell text from binary.
const SAMPLE_BYTES: usize = 512;

/// The local file as the hub's APIs describe it.
struct Local {
    size: u64,
    sha256: String,
    sample: Vec<u8>,
}

/// An answer worth reading, or the error that explains the status.
type Answer = Result<Response<Body>, HubError>;

/// Whether `repo` is a repository name the hub takes: `owner/name`, letters, digits, `-`, `_`, `.`.
pub fn is_repo_name(repo: &str) -> bool {
    let part = |p: &str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
    matches!(repo.split_once('/'), Some((owner, name)) if part(owner) && part(name))
}

/// Creates `target`'s repository unless it exists, then commits `local` at `target.path`. Setting
/// `cancel` stops the upload at its next step or chunk, before the commit: the hub is left as it was.
pub fn upload(
    hub: &Hub,
    local: &Path,
    target: &RepoFile,
    on_event: &mut dyn FnMut(HubEvent),
    cancel: &AtomicBool,
) -> Result<Uploaded, HubError> {
    if !is_repo_name(&target.repo) {
        return Err(HubError::RepoName { repo: target.repo.clone() });
    }
    if hub.token.is_none() {
        return Err(HubError::NoToken { repo: target.repo.clone() });
    }
    let described = describe(local)?;
    stop_if_cancelled(cancel, target)?;
    let created = create_repo(hub, &target.repo)?;
    match push(hub, local, target, &described, on_event, cancel) {
        Err(HubError::UploadCancelled { file, .. }) if created => {
            let leftover = delete_repo(hub, &target.repo).err().map(|error| error.to_string());
            Err(HubError::UploadCancelled { file, leftover })
        }
        pushed => pushed,
    }
}

/// [`HubError::UploadCancelled`] once `cancel` is set.
fn stop_if_cancelled(cancel: &AtomicBool, target: &RepoFile) -> Result<(), HubError> {
    match cancel.load(Ordering::Relaxed) {
        true => Err(HubError::UploadCancelled { file: target.name(), leftover: None }),
        false => Ok(()),
    }
}

/// Everything after the repository exists: the plan, the bytes, the commit.
fn push(
    hub: &Hub,
    local: &Path,
    target: &RepoFile,
    described: &Local,
    on_event: &mut dyn FnMut(HubEvent),
    cancel: &AtomicBool,
) -> Result<Uploaded, HubError> {
    let mode = preupload(hub, target, described)?;
    let uploaded = |commit| Uploaded {
        file: target.name(),
        bytes: described.size,
        url: format!("{}/{}", hub.endpoint, target.repo),
        commit,
    };
    if mode.remote_oid.as_deref() == Some(described.sha256.as_str()) {
        // As `huggingface_hub` does: the same bytes at the same path make an empty commit, which
        // the hub would refuse.
        let unchanged = uploaded(None);
        on_event(HubEvent::Uploaded(unchanged.clone()));
        return Ok(unchanged);
    }
    stop_if_cancelled(cancel, target)?;
    on_event(HubEvent::Uploading { file: target.name(), total: described.size });
    let operation = if mode.lfs {
        send_lfs(hub, local, target, described, on_event, cancel)?;
        json!({"key": "lfsFile", "value": {
            "path": target.path, "algo": "sha256", "oid": described.sha256, "size": described.size,
        }})
    } else {
        let bytes = std::fs::read(local).map_err(|source| read_error(local, source))?;
        let content = base64::engine::general_purpose::STANDARD.encode(bytes);
        json!({"key": "file", "value": {"content": content, "path": target.path, "encoding": "base64"}})
    };
    // The last moment to stop: once the commit is sent, the file is published.
    stop_if_cancelled(cancel, target)?;
    let commit = commit(hub, target, operation)?;
    let done = uploaded(Some(commit));
    on_event(HubEvent::Uploaded(done.clone()));
    Ok(done)
}

/// Size, sha256 and first bytes of the file, read once.
fn describe(path: &Path) -> Result<Local, HubError> {
    let mut file = File::open(path).map_err(|source| read_error(path, source))?;
    let mut hash = Sha256::new();
    let mut sample = Vec::new();
    let mut size = 0u64;
    let mut buffer = vec![0u8; 256 * 1024];
    loop {
        let n = file.read(&mut buffer).map_err(|source| read_error(path, source))?;
        if n == 0 {
            break;
        }
        let wanted = SAMPLE_BYTES.saturating_sub(sample.len()).min(n);
        sample.extend_from_slice(&buffer[..wanted]);
        hash.update(&buffer[..n]);
        size += n as u64;
    }
    Ok(Local { size, sha256: hex(&hash.finalize()), sample })
}

/// `create_repo(repo, repo_type="model", exist_ok=True)`: a 409 means it exists. A token that may
/// not create repositories (a fine-grained one) may still write to an existing one, so a refusal is
/// only final when the repository cannot be seen either. Whether this call made the repository.
fn create_repo(hub: &Hub, repo: &str) -> Result<bool, HubError> {
    let url = format!("{}/api/repos/create", hub.endpoint);
    let response = post(hub, &url, "application/json", &repo_body(repo))?;
    match response.status().as_u16() {
        409 => Ok(false),
        401..=403 if repo_exists(hub, repo)? => Ok(false),
        _ => answer(repo, "creating the repository", &url, response).map(|_| true),
    }
}

/// `delete_repo(repo, repo_type="model")`: what a cancelled upload does to the repository it made.
fn delete_repo(hub: &Hub, repo: &str) -> Result<(), HubError> {
    let url = format!("{}/api/repos/delete", hub.endpoint);
    let request = authorized(hub, agent().delete(&url), &url).force_send_body();
    let response = request
        .header("Content-Type", "application/json")
        .send(repo_body(repo).as_bytes())
        .map_err(|error| unreachable(&url, &error))?;
    answer(repo, "removing the repository the cancelled upload created", &url, response).map(drop)
}

/// The body that names a model repository to the hub's repository calls.
fn repo_body(repo: &str) -> String {
    let (organization, name) = repo.split_once('/').unwrap_or(("", repo));
    json!({"name": name, "organization": organization, "type": "model"}).to_string()
}

fn repo_exists(hub: &Hub, repo: &str) -> Result<bool, HubError> {
    let url = format!("{}/api/models/{repo}", hub.endpoint);
    let response = authorized(hub, agent().get(&url), &url).call().map_err(|error| unreachable(&url, &error))?;
    Ok(response.status().is_success())
}

/// How the hub wants the file sent, and the id of what is at its path now.
struct Mode {
    lfs: bool,
    remote_oid: Option<String>,
}

fn preupload(hub: &Hub, target: &RepoFile, local: &Local) -> Result<Mode, HubError> {
    #[derive(Deserialize)]
    struct Answered {
        files: Vec<Planned>,
    }
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Planned {
        path: String,
        upload_mode: String,
        #[serde(default)]
        should_ignore: bool,
        #[serde(default)]
        oid: Option<String>,
    }
    let url = format!("{}/api/models/{}/preupload/{}", hub.endpoint, target.repo, target.revision);
    let sample = base64::engine::general_purpose::STANDARD.encode(&local.sample);
    let body = json!({"files": [{"path": target.path, "sample": sample, "size": local.size}]});
    let response =
        answer(&target.repo, "preparing the upload", &url, post(hub, &url, "application/json", &body.to_string())?)?;
    let answered: Answered = read_json(response, &url)?;
    let planned = answered
        .files
        .into_iter()
        .find(|file| file.path == target.path)
        .ok_or_else(|| HubError::Unexpected { url: url.clone(), what: "no plan for the file".into() })?;
    if planned.should_ignore {
        return Err(HubError::Ignored { file: target.name() });
    }
    // The hub sends empty files as regular ones (storage refuses an empty object).
    Ok(Mode { lfs: planned.upload_mode == "lfs" && local.size > 0, remote_oid: planned.oid })
}

/// The LFS batch call, then the bytes to where it says, then its check.
fn send_lfs(
    hub: &Hub,
    path: &Path,
    target: &RepoFile,
    local: &Local,
    on_event: &mut dyn FnMut(HubEvent),
    cancel: &AtomicBool,
) -> Result<(), HubError> {
    #[derive(Deserialize)]
    struct Batch {
        objects: Vec<Object>,
    }
    #[derive(Deserialize)]
    struct Object {
        #[serde(default)]
        actions: Option<Actions>,
        #[serde(default)]
        error: Option<ObjectError>,
    }
    #[derive(Deserialize)]
    struct ObjectError {
        message: String,
    }
    #[derive(Deserialize)]
    struct Actions {
        upload: Option<Action>,
        verify: Option<Action>,
    }
    let url = format!("{}/{}.git/info/lfs/objects/batch", hub.endpoint, target.repo);
    let body = json!({
        "operation": "upload",
        "transfers": ["basic", "multipart"],
        "objects": [{"oid": local.sha256, "size": local.size}],
        "hash_algo": "sha256",
        "ref": {"name": target.revision},
    });
    let response = answer(&target.repo, "asking where to upload", &url, post(hub, &url, LFS_JSON, &body.to_string())?)?;
    let batch: Batch = read_json(response, &url)?;
    let object = batch
        .objects
        .into_iter()
        .next()
        .ok_or_else(|| HubError::Unexpected { url: url.clone(), what: "no object in the LFS batch answer".into() })?;
    if let Some(error) = object.error {
        return Err(HubError::UploadRefused {
            step: "asking where to upload",
            status: 200,
            url,
            message: error.message,
        });
    }
    // No actions: the hub's storage has these bytes already.
    let Some(Actions { upload, verify }) = object.actions else {
        return Ok(());
    };
    let mut sender = Sender { hub, path, target, local, on_event, cancel, meter: Meter::new(0), sent: 0 };
    if let Some(upload) = upload {
        match upload.chunk_size() {
            Some(chunk_size) => sender.multipart(&upload, chunk_size)?,
            None => sender.put(&upload.href, 0, local.size).map(drop)?,
        }
    }
    if let Some(verify) = verify {
        stop_if_cancelled(cancel, target)?;
        let body = json!({"oid": local.sha256, "size": local.size}).to_string();
        answer(&target.repo, "checking the upload", &verify.href, post(hub, &verify.href, LFS_JSON, &body)?)?;
    }
    Ok(())
}

/// One action of the LFS batch answer: where to go and what the hub adds (for a multipart upload,
/// `chunk_size` and each part's URL under its number).
#[derive(Deserialize)]
struct Action {
    href: String,
    #[serde(default)]
    header: BTreeMap<String, Value>,
}

impl Action {
    fn chunk_size(&self) -> Option<u64> {
        let value = self.header.get("chunk_size")?;
        value.as_u64().or_else(|| value.as_str()?.parse().ok()).filter(|&size| size > 0)
    }

    /// The parts' URLs, in part order.
    fn part_urls(&self) -> Vec<&str> {
        let mut parts: Vec<(u64, &str)> =
            self.header.iter().filter_map(|(number, url)| Some((number.parse().ok()?, url.as_str()?))).collect();
        parts.sort_unstable();
        parts.into_iter().map(|(_, url)| url).collect()
    }
}

/// Sends the file's bytes, reporting progress across every request and stopping mid-request when
/// `cancel` is set.
struct Sender<'a> {
    hub: &'a Hub,
    path: &'a Path,
    target: &'a RepoFile,
    local: &'a Local,
    on_event: &'a mut dyn FnMut(HubEvent),
    cancel: &'a AtomicBool,
    meter: Meter,
    sent: u64,
}

impl Sender<'_> {
    /// The hub's multipart transfer: each `chunk_size` slice to its part URL, then the parts' ETags
    /// to the action's URL.
    fn multipart(&mut self, upload: &Action, chunk_size: u64) -> Result<(), HubError> {
        let urls = upload.part_urls();
        if urls.len() as u64 != self.local.size.div_ceil(chunk_size) {
            let what = format!("{} part URLs for {} bytes in parts of {chunk_size}", urls.len(), self.local.size);
            return Err(HubError::Unexpected { url: upload.href.clone(), what });
        }
        let mut parts = Vec::new();
        for (index, url) in urls.into_iter().enumerate() {
            stop_if_cancelled(self.cancel, self.target)?;
            let start = index as u64 * chunk_size;
            let response = self.put(url, start, chunk_size.min(self.local.size - start))?;
            let etag = header(&response, "etag")
                .ok_or_else(|| HubError::Unexpected { url: url.to_string(), what: "no ETag for the part".into() })?;
            parts.push(json!({"partNumber": index + 1, "etag": etag}));
        }
        stop_if_cancelled(self.cancel, self.target)?;
        let body = json!({"oid": self.local.sha256, "parts": parts}).to_string();
        let response = post(self.hub, &upload.href, LFS_JSON, &body)?;
        answer(&self.target.repo, "completing the upload", &upload.href, response).map(drop)
    }

    /// `PUT`s `len` bytes of the file from `start` to `url`.
    fn put(&mut self, url: &str, start: u64, len: u64) -> Answer {
        let mut file = File::open(self.path).map_err(|source| read_error(self.path, source))?;
        file.seek(SeekFrom::Start(start)).map_err(|source| read_error(self.path, source))?;
        let mut counted = Counted { inner: file.take(len), sender: self };
        let request = authorized(counted.sender.hub, agent().put(url), url).header("Content-Length", len.to_string());
        let sent = request.send(SendBody::from_reader(&mut counted));
        // A request the cancel cut short failed because of it, not because of the network.
        stop_if_cancelled(self.cancel, self.target)?;
        let response = sent.map_err(|error| unreachable(url, &error))?;
        answer(&self.target.repo, "uploading the file", url, response)
    }
}

/// A reader of the file that reports each chunk as sent.
struct Counted<'s, 'a, R> {
    inner: R,
    sender: &'s mut Sender<'a>,
}

impl<R: Read> Read for Counted<'_, '_, R> {
    fn read(&mut self, buffer: &mut [u8]) -> std::io::Result<usize> {
        if self.sender.cancel.load(Ordering::Relaxed) {
            return Err(std::io::Error::other("the upload was cancelled"));
        }
        let n = self.inner.read(buffer)?;
        let sender = &mut *self.sender;
        sender.sent += n as u64;
        sender.meter.tick(sender.target, sender.sent, sender.local.size, sender.on_event);
        Ok(n)
    }
}

/// The NDJSON commit: a header line, then the one operation. Returns the commit's id.
fn commit(hub: &Hub, target: &RepoFile, operation: Value) -> Result<String, HubError> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Committed {
        commit_oid: String,
    }
    let url = format!("{}/api/models/{}/commit/{}", hub.endpoint, target.repo, target.revision);
    let summary = format!("Upload {} with needle", target.path);
    let header = json!({"key": "header", "value": {"summary": summary, "description": ""}});
    let body = format!("{header}\n{operation}\n");
    let response = answer(&target.repo, "committing the file", &url, post(hub, &url, "application/x-ndjson", &body)?)?;
    Ok(read_json::<Committed>(response, &url)?.commit_oid)
}

/// `POST`s `body` with the token (to the hub's own host only).
fn post(hub: &Hub, url: &str, content_type: &str, body: &str) -> Answer {
    let request = authorized(hub, agent().post(url), url).header("Content-Type", content_type);
    let request = if content_type == LFS_JSON { request.header("Accept", LFS_JSON) } else { request };
    request.send(body.as_bytes()).map_err(|error| unreachable(url, &error))
}

/// The response when it is a success; else why not, in the hub's words.
fn answer(repo: &str, step: &'static str, url: &str, mut response: Response<Body>) -> Answer {
    let status = response.status().as_u16();
    match status {
        200..=299 => Ok(response),
        401 | 403 => Err(HubError::WriteRefused { repo: repo.to_string(), status }),
        _ => {
            let message = header(&response, "x-error-message").unwrap_or_else(|| {
                let text = response.body_mut().read_to_string().unwrap_or_default();
                let error =
                    serde_json::from_str::<Value>(&text).ok().and_then(|v| Some(v.get("error")?.as_str()?.to_string()));
                error.unwrap_or_else(|| text.chars().take(300).collect())
            });
            Err(HubError::UploadRefused { step, status, url: url.to_string(), message })
        }
    }
}

fn read_json<T: serde::de::DeserializeOwned>(mut response: Response<Body>, url: &str) -> Result<T, HubError> {
    let text = response
        .body_mut()
        .read_to_string()
        .map_err(|error| HubError::Unexpected { url: url.to_string(), what: error.to_string() })?;
    serde_json::from_str(&text).map_err(|error| HubError::Unexpected { url: url.to_string(), what: error.to_string() })
}

fn unreachable(url: &str, error: &ureq::Error) -> HubError {
    HubError::UploadCut { endpoint: origin(url).to_string(), cause: error.to_string() }
}

fn read_error(path: &Path, source: std::io::Error) -> HubError {
    HubError::Read { path: path.to_path_buf(), source }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repository_names_are_owner_slash_name() {
        for good in ["alice/needle-home", "org_1/model.v2"] {
            assert!(is_repo_name(good), "{good}");
        }
        for bad in ["needle", "a/b/c", "/model", "alice/", "alice/my model", ""] {
            assert!(!is_repo_name(bad), "{bad}");
        }
    }

    #[test]
    fn multipart_parts_are_read_in_number_order() {
        let action: Action = serde_json::from_value(json!({
            "href": "https://hub/complete",
            "header": {"chunk_size": "4", "10": "u10", "2": "u2", "1": "u1"},
        }))
        .unwrap();
        assert_eq!(action.chunk_size(), Some(4));
        assert_eq!(action.part_urls(), ["u1", "u2", "u10"]);
        let basic: Action = serde_json::from_value(json!({"href": "https://storage/put"})).unwrap();
        assert_eq!(basic.chunk_size(), None);
    }
}
