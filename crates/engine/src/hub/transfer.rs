//! Talking to the hub over HTTP: what a file is (`HEAD` on its resolve URL), and its bytes (`GET`,
//! resumed with a `Range` from the partial file), checked against the announced size and hash before
//! the blob takes its name in the cache.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use sha1::Sha1;
use sha2::{Digest, Sha256};
use ureq::http::{Response, StatusCode};
use ureq::Body;

use super::cache::{is_commit_hash, RepoCache};
use super::{Hub, HubError, HubEvent, RepoFile};

/// A stalled connection fails after this long (and the next try resumes); a slow one never does.
const READ_TIMEOUT: Duration = Duration::from_secs(60);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(20);
/// Progress events at most this often: enough for a smooth bar, few enough for a JSON stream.
const PROGRESS_EVERY: Duration = Duration::from_millis(200);
/// Relative redirects followed when asking about a file (a renamed repository answers with one).
const MAX_RELATIVE_REDIRECTS: usize = 5;

/// What the hub says about a file before sending it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Announced {
    /// The commit the revision points at (`X-Repo-Commit`).
    pub commit: String,
    /// The content hash: sha256 for large (LFS) files, the git blob id for small ones.
    pub etag: String,
    pub size: u64,
    /// Where the bytes are: the resolve URL, or the storage it redirects to.
    pub url: String,
}

pub(super) fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        // Statuses are answers to explain, not transport failures.
        .http_status_as_error(false)
        .timeout_connect(Some(CONNECT_TIMEOUT))
        .timeout_per_read(Some(READ_TIMEOUT))
        .user_agent(concat!("needle-studio/", env!("CARGO_PKG_VERSION")))
        .build()
        .into()
}

/// `HEAD` on the resolve URL, without following the redirect to storage: the hub's own headers carry
/// the commit, the hash and the size.
pub fn announce(hub: &Hub, file: &RepoFile) -> Result<Announced, HubError> {
    let agent = agent();
    let mut url = hub.url(file);
    let mut last_status = 0;
    for _ in 0..=MAX_RELATIVE_REDIRECTS {
        let request = authorized(hub, agent.head(&url), &url)
            .header("Accept-Encoding", "identity")
            .config()
            .max_redirects(0)
            .max_redirects_will_error(false)
            .build();
        let response = request.call().map_err(|error| unreachable(hub, file, &error))?;
        let location = header(&response, "location");
        let status = response.status();
        last_status = status.as_u16();
        if status.is_redirection() {
            if let Some(relative) = location.as_deref().filter(|l| l.starts_with('/')) {
                url = format!("{}{relative}", origin(&url));
                continue;
            }
        } else if !status.is_success() {
            return Err(refusal(hub, file, &url, &response));
        }
        // The commit names a folder of the cache: only a real commit hash may.
        let commit = header(&response, "x-repo-commit")
            .filter(|commit| is_commit_hash(commit))
            .ok_or(HubError::Unverifiable { url: url.clone(), what: "X-Repo-Commit header (a commit hash)" })?;
        let etag = header(&response, "x-linked-etag")
            .or_else(|| header(&response, "etag"))
            .map(|tag| tag.trim_start_matches("W/").trim_matches('"').to_string())
            .filter(|tag| !tag.is_empty() && tag.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'))
            .ok_or(HubError::Unverifiable { url: url.clone(), what: "ETag" })?;
        let size = header(&response, "x-linked-size")
            .or_else(|| header(&response, "content-length"))
            .and_then(|size| size.parse().ok())
            .ok_or(HubError::Unverifiable { url: url.clone(), what: "size (X-Linked-Size or Content-Length)" })?;
        let url = match location {
            Some(location) if status.is_redirection() => location,
            _ => url,
        };
        return Ok(Announced { commit, etag, size, url });
    }
    Err(HubError::Redirects { url, status: last_status })
}

/// Brings the announced file into the cache (unless its blob is already there, from another
/// revision) and links it under its commit.
pub fn download(
    hub: &Hub,
    file: &RepoFile,
    announced: &Announced,
    on_event: &mut dyn FnMut(HubEvent),
    cancel: &AtomicBool,
) -> Result<std::path::PathBuf, HubError> {
    let cache = RepoCache::new(&hub.cache, &file.repo);
    let blob = cache.blob_path(&announced.etag);
    let have_blob = std::fs::metadata(&blob).is_ok_and(|m| m.len() == announced.size);
    if !have_blob {
        receive(hub, file, announced, &cache, on_event, cancel)?;
    }
    let path = cache
        .commit(&file.revision, &announced.commit, &file.path, &announced.etag)
        .map_err(|source| HubError::Io { path: cache.snapshot_path(&announced.commit, &file.path), source })?;
    on_event(HubEvent::Downloaded { file: file.name(), path: path.clone(), bytes: announced.size });
    Ok(path)
}

/// The transfer itself, into `<etag>.incomplete`, locked against a second process, resumed from
/// its length, then checked and renamed to the blob.
fn receive(
    hub: &Hub,
    file: &RepoFile,
    announced: &Announced,
    cache: &RepoCache,
    on_event: &mut dyn FnMut(HubEvent),
    cancel: &AtomicBool,
) -> Result<(), HubError> {
    let partial_path = cache.incomplete_path(&announced.etag);
    let io = |source| HubError::Io { path: partial_path.clone(), source };
    if let Some(dir) = partial_path.parent() {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    // Not opened in append mode: Windows refuses to truncate an append handle, and a restart
    // truncates. Writes go to the end by seeking there.
    let mut partial =
        File::options().create(true).truncate(false).read(true).write(true).open(&partial_path).map_err(io)?;
    match partial.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            return Err(HubError::Busy { file: file.clone(), path: partial_path })
        }
        Err(std::fs::TryLockError::Error(source)) => return Err(io(source)),
    }
    let total = announced.size;
    let mut check = Check::for_etag(&announced.etag, total);
    let mut have = partial.metadata().map_err(io)?.len();
    if have > total {
        partial.set_len(0).map_err(io)?;
        have = 0;
    }
    // The bytes of an earlier try count towards the hash: it covers the whole file.
    partial.seek(SeekFrom::Start(0)).map_err(io)?;
    check.update_from(&mut (&partial).take(have), cancel).map_err(io)?;
    if cancel.load(Ordering::Relaxed) {
        return Err(HubError::Cancelled { file: file.clone(), got: have, total });
    }
    partial.seek(SeekFrom::Start(have)).map_err(io)?;
    on_event(HubEvent::Started { file: file.name(), total, resumed_from: have });

    // A server that ignores the Range (200) or refuses it (416) sends the file from the start.
    for _ in 0..2 {
        if have == total {
            break;
        }
        let mut request =
            authorized(hub, agent().get(&announced.url), &announced.url).header("Accept-Encoding", "identity");
        if have > 0 {
            request = request.header("Range", format!("bytes={have}-"));
        }
        let mut response = request.call().map_err(|error| unreachable(hub, file, &error))?;
        match response.status() {
            StatusCode::PARTIAL_CONTENT if have > 0 && range_start(&response) == Some(have) => {}
            StatusCode::OK | StatusCode::PARTIAL_CONTENT | StatusCode::RANGE_NOT_SATISFIABLE if have > 0 => {
                partial.set_len(0).map_err(io)?;
                partial.seek(SeekFrom::Start(0)).map_err(io)?;
                have = 0;
                check = Check::for_etag(&announced.etag, total);
                if response.status() != StatusCode::OK {
                    continue;
                }
            }
            StatusCode::OK => {}
            _ => return Err(refusal(hub, file, &announced.url, &response)),
        }
        let mut body = response.body_mut().as_reader();
        stream(&mut body, &mut partial, &mut check, &mut have, file, total, on_event, cancel)
            .map_err(|failure| failure.into_error(file, have, total, &partial_path))?;
        break;
    }
    if have < total {
        let cause = "the connection closed early".to_string();
        return Err(HubError::Cut { file: file.clone(), got: have, total, cause });
    }
    if let Some((what, expected, actual)) = check.mismatch() {
        drop(partial);
        let _ = std::fs::remove_file(&partial_path);
        return Err(HubError::Mismatch { file: Box::new(file.clone()), what, expected, actual });
    }
    partial.sync_all().map_err(io)?;
    // Closed (and unlocked) before the rename, which Windows refuses on an open file.
    drop(partial);
    std::fs::rename(&partial_path, cache.blob_path(&announced.etag)).map_err(io)
}

/// Why a transfer stopped before its end.
enum Stop {
    Read(std::io::Error),
    Write(std::io::Error),
    TooLong,
    Cancelled,
}

impl Stop {
    fn into_error(self, file: &RepoFile, got: u64, total: u64, partial: &Path) -> HubError {
        match self {
            Stop::Read(error) => HubError::Cut { file: file.clone(), got, total, cause: error.to_string() },
            Stop::Write(source) => HubError::Io { path: partial.to_path_buf(), source },
            Stop::TooLong => {
                let _ = std::fs::remove_file(partial);
                HubError::Mismatch {
                    file: Box::new(file.clone()),
                    what: "size",
                    expected: format!("{total} bytes"),
                    actual: format!("over {total} bytes"),
                }
            }
            Stop::Cancelled => HubError::Cancelled { file: file.clone(), got, total },
        }
    }
}

/// Copies the body to the partial file, hashing as it goes, with progress and cancel checks.
#[allow(clippy::too_many_arguments)]
fn stream(
    body: &mut impl Read,
    partial: &mut File,
    check: &mut Check,
    have: &mut u64,
    file: &RepoFile,
    total: u64,
    on_event: &mut dyn FnMut(HubEvent),
    cancel: &AtomicBool,
) -> Result<(), Stop> {
    let mut meter = Meter::new(*have);
    let mut buffer = vec![0u8; 256 * 1024];
    loop {
        if cancel.load(Ordering::Relaxed) {
            return Err(Stop::Cancelled);
        }
        let n = match body.read(&mut buffer) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(error) => return Err(Stop::Read(error)),
        };
        if *have + n as u64 > total {
            return Err(Stop::TooLong);
        }
        partial.write_all(&buffer[..n]).map_err(Stop::Write)?;
        check.update(&buffer[..n]);
        *have += n as u64;
        meter.tick(file, *have, total, on_event);
    }
}

/// Progress of bytes moving either way, as [`HubEvent::Progress`] at most every [`PROGRESS_EVERY`]
/// (and at the end), with the rate of this transfer: bytes an earlier, cut one moved do not count.
pub(super) struct Meter {
    start: Instant,
    last: Instant,
    from: u64,
}

impl Meter {
    pub(super) fn new(from: u64) -> Self {
        let now = Instant::now();
        Self { start: now, last: now, from }
    }

    /// `done` of `total` bytes of `file` have moved.
    pub(super) fn tick(&mut self, file: &RepoFile, done: u64, total: u64, on_event: &mut dyn FnMut(HubEvent)) {
        if self.last.elapsed() < PROGRESS_EVERY && done != total {
            return;
        }
        self.last = Instant::now();
        let bytes_per_s = (done - self.from) as f64 / self.start.elapsed().as_secs_f64().max(1e-3);
        let eta_s = (total - done) as f64 / bytes_per_s.max(1.0);
        on_event(HubEvent::Progress { file: file.name(), bytes: done, total, bytes_per_s, eta_s });
    }
}

/// The content hash to check a download against, chosen by the form of the hub's ETag: a sha256 of
/// the bytes for large files, the git blob id (sha1 of `blob <size>\0` and the bytes) for small ones.
enum Check {
    Sha256(Sha256, String),
    GitBlob(Sha1, String),
    /// Another form of ETag (a mirror's): only the size is checked.
    SizeOnly,
}

impl Check {
    fn for_etag(etag: &str, size: u64) -> Self {
        let hex = etag.bytes().all(|b| b.is_ascii_hexdigit());
        match etag.len() {
            64 if hex => Check::Sha256(Sha256::new(), etag.to_ascii_lowercase()),
            40 if hex => {
                let mut sha1 = Sha1::new();
                sha1.update(format!("blob {size}\0"));
                Check::GitBlob(sha1, etag.to_ascii_lowercase())
            }
            _ => Check::SizeOnly,
        }
    }

    fn update(&mut self, bytes: &[u8]) {
        match self {
            Check::Sha256(hash, _) => hash.update(bytes),
            Check::GitBlob(hash, _) => hash.update(bytes),
            Check::SizeOnly => {}
        }
    }

    /// Hashes what `reader` holds, until its end or until `cancel` is set.
    fn update_from(&mut self, reader: &mut impl Read, cancel: &AtomicBool) -> std::io::Result<()> {
        let mut buffer = vec![0u8; 256 * 1024];
        while !cancel.load(Ordering::Relaxed) {
            match reader.read(&mut buffer)? {
                0 => return Ok(()),
                n => self.update(&buffer[..n]),
            }
        }
        Ok(())
    }

    /// What differs, if anything: the hash's name, the announced value and the received one.
    fn mismatch(self) -> Option<(&'static str, String, String)> {
        let (what, actual, expected) = match self {
            Check::Sha256(hash, expected) => ("sha256", hex(&hash.finalize()), expected),
            Check::GitBlob(hash, expected) => ("git blob id", hex(&hash.finalize()), expected),
            Check::SizeOnly => return None,
        };
        (actual != expected).then_some((what, expected, actual))
    }
}

pub(super) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The token goes to the hub's own host only; storage URLs it redirects to carry their own signature.
pub(super) fn authorized<B>(hub: &Hub, request: ureq::RequestBuilder<B>, url: &str) -> ureq::RequestBuilder<B> {
    match &hub.token {
        Some(token) if origin(url) == origin(&hub.endpoint) => {
            request.header("Authorization", format!("Bearer {token}"))
        }
        _ => request,
    }
}

/// `scheme://host[:port]` of a URL.
pub(super) fn origin(url: &str) -> &str {
    let after_scheme = url.find("://").map_or(0, |i| i + 3);
    url[after_scheme..].find('/').map_or(url, |i| &url[..after_scheme + i])
}

pub(super) fn header(response: &Response<Body>, name: &str) -> Option<String> {
    response.headers().get(name)?.to_str().ok().map(|value| value.trim().to_string())
}

/// The first byte of a `206`'s `Content-Range: bytes <start>-<end>/<size>`.
fn range_start(response: &Response<Body>) -> Option<u64> {
    let range = header(response, "content-range")?;
    range.strip_prefix("bytes ")?.split('-').next()?.trim().parse().ok()
}

fn unreachable(hub: &Hub, file: &RepoFile, error: &ureq::Error) -> HubError {
    HubError::Unreachable { endpoint: hub.endpoint.clone(), url: hub.url(file), cause: error.to_string() }
}

/// A non-success status, explained: the hub says in `X-Error-Code` what was not found.
fn refusal(hub: &Hub, file: &RepoFile, url: &str, response: &Response<Body>) -> HubError {
    let status = response.status().as_u16();
    match status {
        401 | 403 => HubError::Refused { file: file.clone(), status, token_sent: hub.token.is_some() },
        404 => {
            let what = match header(response, "x-error-code").as_deref() {
                Some("RepoNotFound") => format!("repository {}", file.repo),
                Some("RevisionNotFound") => format!("revision {} in {}", file.revision, file.repo),
                _ => format!("file {} in {} at revision {}", file.path, file.repo, file.revision),
            };
            HubError::NotFound { what, url: url.to_string() }
        }
        _ => HubError::Status { url: url.to_string(), status },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_check_follows_the_form_of_the_etag() {
        // `git hash-object` of "hello\n" and the sha256 of the same bytes.
        let bytes = b"hello\n";
        let git = "ce013625030ba8dba906f756967f9e9ca394464a";
        let sha256 = "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03";
        for etag in [git, sha256] {
            let mut check = Check::for_etag(etag, bytes.len() as u64);
            check.update(bytes);
            assert_eq!(check.mismatch(), None, "{etag}");
            let mut wrong = Check::for_etag(etag, bytes.len() as u64);
            wrong.update(b"jello\n");
            assert!(wrong.mismatch().is_some(), "{etag}");
        }
        assert_eq!(Check::for_etag("mirror-tag", 6).mismatch(), None);
    }

    #[test]
    fn origins_compare_scheme_host_and_port() {
        assert_eq!(origin("https://huggingface.co/org/m/resolve/main/f"), "https://huggingface.co");
        assert_eq!(origin("http://127.0.0.1:8080"), "http://127.0.0.1:8080");
        assert_ne!(origin("https://cdn.example/x"), origin("https://huggingface.co"));
    }
}
