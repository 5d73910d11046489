//! A model hub on loopback for the download and upload tests: it serves files at the Hugging Face
//! hub's URL layout with its headers (`X-Repo-Commit`, `X-Linked-Etag`/`X-Linked-Size` and a redirect
//! to storage for large files, a git-blob `ETag` for small ones, `Range` requests), takes new ones
//! through the hub's upload API ([`writes`]), and can misbehave on request: cut a transfer part-way,
//! send wrong bytes, ask for a token, send slowly, refuse to write. No test touches the internet.

mod writes;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use sha1::Sha1;
use sha2::{Digest, Sha256};

/// The commit every revision of the fake repositories points at.
pub const COMMIT: &str = "5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed";

/// One file the hub serves.
#[derive(Debug, Clone)]
pub struct HubFile {
    pub repo: String,
    pub path: String,
    pub bytes: Vec<u8>,
    /// Served as the hub serves large files: announced by sha256 and redirected to storage.
    pub lfs: bool,
}

/// How the hub misbehaves, changed between requests by the test.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    /// Close the connection after this many bytes of the file (counted from its start).
    pub cut_at: Option<u64>,
    /// Flip a byte in the middle of what is sent.
    pub corrupt: bool,
    /// Answer 401 unless this bearer token is sent.
    pub token: Option<String>,
    /// Announce a size one byte short of what is then sent.
    pub short_size: bool,
    /// Send the body at about this many bytes per second (and take an upload's bytes as slowly).
    pub bytes_per_s: Option<u64>,
    /// Answer 403 to every write, as the hub does for a token that may only read.
    pub read_only: bool,
    /// Have LFS uploads sent in parts of this many bytes (the hub's multipart transfer).
    pub part_bytes: Option<usize>,
}

/// One request as the hub saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub range: Option<String>,
    pub authorization: Option<String>,
}

#[derive(Default)]
struct State {
    /// The hub's own origin.
    endpoint: String,
    /// The origin of the storage that large files redirect to (and uploads go to).
    storage: String,
    /// Repositories made through the API (those of `files` exist too).
    repos: std::collections::BTreeSet<String>,
    /// LFS objects in storage by sha256, uploaded and not yet (or already) committed.
    objects: BTreeMap<String, Vec<u8>>,
    /// Parts of multipart uploads, by sha256 and part number.
    parts: BTreeMap<(String, usize), Vec<u8>>,
    files: BTreeMap<String, HubFile>,
    faults: Faults,
    seen: Vec<Seen>,
}

/// The running hub; its threads end with the test process.
pub struct FakeHub {
    endpoint: String,
    state: Arc<Mutex<State>>,
}

impl HubFile {
    pub fn new(repo: &str, path: &str, bytes: Vec<u8>, lfs: bool) -> Self {
        Self { repo: repo.into(), path: path.into(), bytes, lfs }
    }

    /// The ETag the hub announces: sha256 of the bytes for LFS files, the git blob id for others.
    pub fn etag(&self) -> String {
        if self.lfs {
            hex(&Sha256::digest(&self.bytes))
        } else {
            let mut sha1 = Sha1::new();
            sha1.update(format!("blob {}\0", self.bytes.len()));
            sha1.update(&self.bytes);
            hex(&sha1.finalize())
        }
    }
}

impl FakeHub {
    /// Starts the hub and its storage, each on its own loopback port (so on its own origin, as the
    /// real hub's storage is on another host).
    pub fn start(files: impl IntoIterator<Item = HubFile>) -> Self {
        let state = Arc::new(Mutex::new(State::default()));
        lock(&state).files = files.into_iter().map(|file| (format!("{}/{}", file.repo, file.path), file)).collect();
        let storage = listen(&state);
        lock(&state).storage = storage;
        let endpoint = listen(&state);
        lock(&state).endpoint = endpoint.clone();
        Self { endpoint, state }
    }

    /// The base URL, for `HF_ENDPOINT`.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    pub fn set_faults(&self, faults: Faults) {
        lock(&self.state).faults = faults;
    }

    /// Every request so far, in order.
    pub fn seen(&self) -> Vec<Seen> {
        lock(&self.state).seen.clone()
    }

    /// The file at `path` in `repo`, as served (an uploaded one included).
    pub fn file(&self, repo: &str, path: &str) -> Option<HubFile> {
        lock(&self.state).files.get(&format!("{repo}/{path}")).cloned()
    }

    /// Whether the hub has the repository (made through the API, or holding a served file).
    pub fn has_repo(&self, repo: &str) -> bool {
        writes::exists(&lock(&self.state), repo)
    }

    /// The file's resolve URL, as error messages print it.
    pub fn url(&self, repo: &str, path: &str) -> String {
        format!("{}/{repo}/resolve/main/{path}", self.endpoint)
    }
}

/// Serves requests on a new loopback port, each connection on its own thread; returns its origin.
fn listen(state: &Arc<Mutex<State>>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
    let origin = format!("http://{}", listener.local_addr().expect("bound address"));
    let shared = Arc::clone(state);
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let state = Arc::clone(&shared);
            std::thread::spawn(move || {
                // A client that hangs up mid-answer is what several tests do on purpose.
                let _ = serve(stream, &state);
            });
        }
    });
    origin
}

pub(crate) fn lock<T>(state: &Mutex<T>) -> MutexGuard<'_, T> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn serve(stream: TcpStream, state: &Mutex<State>) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    let mut headers = BTreeMap::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 || line.trim().is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            headers.insert(name.trim().to_ascii_lowercase(), value.trim().to_string());
        }
    }
    let mut parts = request_line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or("").to_string(), parts.next().unwrap_or("").to_string());
    let (files, faults, storage) = {
        let mut state = lock(state);
        state.seen.push(Seen {
            method: method.clone(),
            path: target.clone(),
            range: headers.get("range").cloned(),
            authorization: headers.get("authorization").cloned(),
        });
        (state.files.clone(), state.faults.clone(), state.storage.clone())
    };
    let head = method == "HEAD";
    let mut out = stream;
    if writes::is_write(&method, &target) {
        let length = headers.get("content-length").and_then(|n| n.parse().ok()).unwrap_or(0);
        let mut body = vec![0; length];
        reader.read_exact(&mut body)?;
        return writes::serve(&mut out, state, &method, &target, &headers, &body);
    }

    // Storage: `/cdn/<sha256>` serves an LFS file's bytes, as the hub's redirect target does.
    if let Some(sha) = target.strip_prefix("/cdn/") {
        return match files.values().find(|file| file.lfs && file.etag() == sha) {
            Some(file) => send_bytes(&mut out, file, &faults, headers.get("range"), head, &[]),
            None => respond(&mut out, 404, &[], b"no such object"),
        };
    }
    // The hub: `/<org>/<name>/resolve/<revision>/<path>`.
    let segments: Vec<&str> = target.trim_start_matches('/').splitn(5, '/').collect();
    let [org, name, "resolve", _revision, path] = segments[..] else {
        return respond(&mut out, 404, &[], b"not a resolve URL");
    };
    let repo = format!("{org}/{name}");
    if let Some(token) = &faults.token {
        if headers.get("authorization") != Some(&format!("Bearer {token}")) {
            return respond(&mut out, 401, &[("X-Error-Code", "GatedRepo".into())], b"Access restricted");
        }
    }
    let Some(file) = files.get(&format!("{repo}/{path}")) else {
        let code = if files.values().any(|f| f.repo == repo) { "EntryNotFound" } else { "RepoNotFound" };
        return respond(&mut out, 404, &[("X-Error-Code", code.into())], b"Not found");
    };
    let mut announce = vec![("X-Repo-Commit", COMMIT.to_string())];
    if file.lfs {
        announce.push(("X-Linked-Etag", format!("\"{}\"", file.etag())));
        let size = file.bytes.len() - usize::from(faults.short_size);
        announce.push(("X-Linked-Size", size.to_string()));
        announce.push(("ETag", "\"pointer-file-etag\"".into()));
        announce.push(("Location", format!("{storage}/cdn/{}", file.etag())));
        respond(&mut out, 302, &announce, b"")
    } else {
        announce.push(("ETag", format!("\"{}\"", file.etag())));
        send_bytes(&mut out, file, &faults, headers.get("range"), head, &announce)
    }
}

/// The file's bytes from the requested offset, with the faults applied.
fn send_bytes(
    out: &mut TcpStream,
    file: &HubFile,
    faults: &Faults,
    range: Option<&String>,
    head: bool,
    extra: &[(&str, String)],
) -> std::io::Result<()> {
    let len = file.bytes.len() as u64;
    let start: u64 = range
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| r.strip_suffix('-'))
        .and_then(|r| r.parse().ok())
        .unwrap_or(0);
    if start > len {
        return respond(out, 416, &[("Content-Range", format!("bytes */{len}"))], b"");
    }
    let mut headers = extra.to_vec();
    headers.push(("Content-Length", (len - start).to_string()));
    let status = if range.is_some() {
        headers.push(("Content-Range", format!("bytes {start}-{}/{len}", len.saturating_sub(1))));
        206
    } else {
        200
    };
    write_head(out, status, &headers)?;
    if head {
        return Ok(());
    }
    let mut body = file.bytes[start as usize..].to_vec();
    if faults.corrupt && !body.is_empty() {
        let middle = body.len() / 2;
        body[middle] ^= 0xff;
    }
    let end = faults.cut_at.map_or(len, |cut| cut.clamp(start, len));
    let body = &body[..(end - start) as usize];
    for chunk in body.chunks(16 * 1024) {
        out.write_all(chunk)?;
        if let Some(rate) = faults.bytes_per_s {
            std::thread::sleep(Duration::from_secs_f64(chunk.len() as f64 / rate as f64));
        }
    }
    out.flush()?;
    out.shutdown(std::net::Shutdown::Both)
}

pub(crate) fn respond(
    out: &mut TcpStream,
    status: u16,
    headers: &[(&str, String)],
    body: &[u8],
) -> std::io::Result<()> {
    let mut headers = headers.to_vec();
    headers.push(("Content-Length", body.len().to_string()));
    write_head(out, status, &headers)?;
    out.write_all(body)?;
    out.flush()
}

fn write_head(out: &mut TcpStream, status: u16, headers: &[(&str, String)]) -> std::io::Result<()> {
    let mut head = format!("HTTP/1.1 {status} {}\r\nConnection: close\r\n", reason(status));
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    out.write_all(head.as_bytes())
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        206 => "Partial Content",
        302 => "Found",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        409 => "Conflict",
        416 => "Range Not Satisfiable",
        _ => "Status",
    }
}

/// A hub serving the tiny fixtures as the published base models, each checkpoint as a large (LFS)
/// file and the fixture tokenizer (which both tiny models use) as a small one:
/// `Cactus-Compute/needle2` holds the pre-trained pickle at `checkpoints/needle2.pkl`,
/// `Cactus-Compute/needle3` the Needle 3 checkpoint at `checkpoints/needle3.safetensors`, each with
/// `tokenizer/tokenizer.model`.
pub fn published() -> FakeHub {
    FakeHub::start(PUBLISHED.iter().flat_map(|(repo, checkpoint, fixture)| {
        [
            HubFile::new(repo, checkpoint, crate::read(fixture), true),
            HubFile::new(repo, "tokenizer/tokenizer.model", crate::read("models/tokenizer.model"), false),
        ]
    }))
}

/// What [`published`] serves as each base model: repository, checkpoint path, and the fixture that
/// plays it.
pub const PUBLISHED: [(&str, &str, &str); 2] = [
    ("Cactus-Compute/needle2", "checkpoints/needle2.pkl", "models/pretrained.pkl"),
    ("Cactus-Compute/needle3", "checkpoints/needle3.safetensors", "models/needle3_tiny.safetensors"),
];
