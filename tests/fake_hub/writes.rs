//! The fake hub's upload API, as `huggingface_hub`'s `create_repo` and `upload_file` use it: create a
//! repository (409 when it exists), see one, the preupload plan (`lfs` for a binary file, `regular`
//! for text), the LFS batch answer with storage URLs (one `PUT`, or parts and a completion call), the
//! verify call, and the NDJSON commit, after which the file is served like any other; and
//! `delete_repo`, which removes a repository with its files.

use std::collections::BTreeMap;
use std::net::TcpStream;
use std::sync::Mutex;

use base64::Engine as _;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use super::{hex, lock, respond, HubFile, State, COMMIT};

/// Whether the request is for this module: anything that is not a download.
pub(super) fn is_write(method: &str, target: &str) -> bool {
    !matches!(method, "GET" | "HEAD") || target.starts_with("/api/")
}

pub(super) fn serve(
    out: &mut TcpStream,
    state: &Mutex<State>,
    method: &str,
    target: &str,
    headers: &BTreeMap<String, String>,
    body: &[u8],
) -> std::io::Result<()> {
    // Storage: a presigned URL carries its own signature, so no token is asked for.
    if let Some(rest) = target.strip_prefix("/upload/") {
        return store(out, state, rest, body);
    }
    if let Some(oid) = target.strip_prefix("/lfs-complete/") {
        return complete(out, state, oid, body);
    }
    let faults = lock(state).faults.clone();
    let sent = headers.get("authorization").and_then(|value| value.strip_prefix("Bearer "));
    if sent.is_none() || faults.token.as_deref().is_some_and(|wanted| Some(wanted) != sent) {
        return respond(out, 401, &[("X-Error-Message", "Invalid credentials in Authorization header".into())], b"");
    }
    if faults.read_only && method != "GET" {
        let message = "You don't have the rights to create a model under this namespace";
        return json_answer(out, 403, &json!({"error": message}));
    }
    let segments: Vec<&str> = target.trim_start_matches('/').split('/').collect();
    match segments[..] {
        ["api", "repos", "create"] => create(out, state, body),
        ["api", "repos", "delete"] if method == "DELETE" => delete(out, state, body),
        ["api", "models", org, name] => {
            let known = exists(&lock(state), &format!("{org}/{name}"));
            respond(out, if known { 200 } else { 404 }, &[], b"{}")
        }
        ["api", "models", org, name, "preupload", _revision] => preupload(out, state, &format!("{org}/{name}"), body),
        ["api", "models", org, name, "commit", _revision] => commit(out, state, &format!("{org}/{name}"), body),
        [org, name, "info", "lfs", "objects", "batch"] => batch(out, state, org, name, body),
        [_org, _name, "info", "lfs", "objects", "verify"] => {
            let asked: Value = serde_json::from_slice(body).unwrap_or_default();
            let size = lock(state).objects.get(asked["oid"].as_str().unwrap_or("")).map(Vec::len);
            let verified = size.is_some() && size.map(|n| n as u64) == asked["size"].as_u64();
            respond(out, if verified { 200 } else { 404 }, &[], b"{}")
        }
        _ => respond(out, 404, &[], b"not an API the fake hub has"),
    }
}

pub(super) fn exists(state: &State, repo: &str) -> bool {
    state.repos.contains(repo) || state.files.values().any(|file| file.repo == repo)
}

fn json_answer(out: &mut TcpStream, status: u16, value: &Value) -> std::io::Result<()> {
    respond(out, status, &[("Content-Type", "application/json".into())], value.to_string().as_bytes())
}

fn create(out: &mut TcpStream, state: &Mutex<State>, body: &[u8]) -> std::io::Result<()> {
    let asked: Value = serde_json::from_slice(body).unwrap_or_default();
    let (Some(org), Some(name), Some("model")) =
        (asked["organization"].as_str(), asked["name"].as_str(), asked["type"].as_str())
    else {
        return json_answer(out, 400, &json!({"error": "name, organization and type are required"}));
    };
    let repo = format!("{org}/{name}");
    let mut state = lock(state);
    if exists(&state, &repo) {
        return json_answer(out, 409, &json!({"error": "You already created this model repo", "url": repo}));
    }
    state.repos.insert(repo.clone());
    let url = format!("{}/{repo}", state.endpoint);
    drop(state);
    json_answer(out, 200, &json!({"url": url, "name": repo}))
}

fn delete(out: &mut TcpStream, state: &Mutex<State>, body: &[u8]) -> std::io::Result<()> {
    let asked: Value = serde_json::from_slice(body).unwrap_or_default();
    let (Some(org), Some(name)) = (asked["organization"].as_str(), asked["name"].as_str()) else {
        return json_answer(out, 400, &json!({"error": "name and organization are required"}));
    };
    let repo = format!("{org}/{name}");
    let mut state = lock(state);
    if !exists(&state, &repo) {
        return respond(out, 404, &[("X-Error-Code", "RepoNotFound".into())], b"Repository not found");
    }
    state.repos.remove(&repo);
    state.files.retain(|_, file| file.repo != repo);
    drop(state);
    respond(out, 200, &[], b"")
}

/// `lfs` for a file whose first bytes hold a NUL (binary), as the hub decides; the oid of what is at
/// the path now.
fn preupload(out: &mut TcpStream, state: &Mutex<State>, repo: &str, body: &[u8]) -> std::io::Result<()> {
    let state = lock(state);
    if !exists(&state, repo) {
        return respond(out, 404, &[("X-Error-Code", "RepoNotFound".into())], b"Repository not found");
    }
    let asked: Value = serde_json::from_slice(body).unwrap_or_default();
    let files: Vec<Value> = asked["files"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|file| {
            let path = file["path"].as_str().unwrap_or("");
            let sample = base64::engine::general_purpose::STANDARD.decode(file["sample"].as_str().unwrap_or(""));
            let binary = sample.map_or(true, |bytes| bytes.contains(&0));
            let oid = state.files.get(&format!("{repo}/{path}")).map(HubFile::etag);
            json!({"path": path, "uploadMode": if binary { "lfs" } else { "regular" }, "shouldIgnore": false, "oid": oid})
        })
        .collect();
    drop(state);
    json_answer(out, 200, &json!({"files": files}))
}

/// Where each object goes: nowhere when storage has it, else one URL (or, with `part_bytes`, one per
/// part and a completion URL).
fn batch(out: &mut TcpStream, state: &Mutex<State>, org: &str, name: &str, body: &[u8]) -> std::io::Result<()> {
    let state = lock(state);
    let repo = format!("{org}/{}", name.trim_end_matches(".git"));
    if !exists(&state, &repo) {
        return respond(out, 404, &[("X-Error-Code", "RepoNotFound".into())], b"Repository not found");
    }
    let asked: Value = serde_json::from_slice(body).unwrap_or_default();
    let objects: Vec<Value> = asked["objects"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|object| {
            let (oid, size) = (object["oid"].as_str().unwrap_or(""), object["size"].as_u64().unwrap_or(0));
            if state.objects.contains_key(oid) {
                return json!({"oid": oid, "size": size});
            }
            let verify = json!({"href": format!("{}/{repo}.git/info/lfs/objects/verify", state.endpoint)});
            let upload = match state.faults.part_bytes {
                Some(part) => {
                    let mut header = json!({"chunk_size": part.to_string()});
                    for number in 1..=(size as usize).div_ceil(part) {
                        header[number.to_string()] = format!("{}/upload/{oid}?part={number}", state.storage).into();
                    }
                    json!({"href": format!("{}/lfs-complete/{oid}", state.endpoint), "header": header})
                }
                None => json!({"href": format!("{}/upload/{oid}", state.storage)}),
            };
            json!({"oid": oid, "size": size, "actions": {"upload": upload, "verify": verify}})
        })
        .collect();
    drop(state);
    json_answer(out, 200, &json!({"transfer": "basic", "objects": objects}))
}

/// A `PUT` to storage: a whole object (kept only if its bytes hash to its name) or one part of one;
/// with `bytes_per_s`, answered only after the time the bytes would take at that rate.
fn store(out: &mut TcpStream, state: &Mutex<State>, rest: &str, body: &[u8]) -> std::io::Result<()> {
    let rate = lock(state).faults.bytes_per_s;
    if let Some(rate) = rate {
        std::thread::sleep(std::time::Duration::from_secs_f64(body.len() as f64 / rate.max(1) as f64));
    }
    let mut state = lock(state);
    match rest.split_once("?part=") {
        Some((oid, part)) => {
            let number: usize = part.parse().unwrap_or(0);
            state.parts.insert((oid.to_string(), number), body.to_vec());
            drop(state);
            respond(out, 200, &[("ETag", format!("\"etag-{number}\""))], b"")
        }
        None if hex(&Sha256::digest(body)) == rest => {
            state.objects.insert(rest.to_string(), body.to_vec());
            drop(state);
            respond(out, 200, &[], b"")
        }
        None => respond(out, 400, &[], b"the bytes do not hash to the object's name"),
    }
}

/// The multipart completion: the parts, in the order and with the ETags the client lists, make the
/// object.
fn complete(out: &mut TcpStream, state: &Mutex<State>, oid: &str, body: &[u8]) -> std::io::Result<()> {
    let asked: Value = serde_json::from_slice(body).unwrap_or_default();
    let mut state = lock(state);
    let mut bytes = Vec::new();
    for part in asked["parts"].as_array().into_iter().flatten() {
        let number = part["partNumber"].as_u64().unwrap_or(0) as usize;
        let sent = state.parts.get(&(oid.to_string(), number));
        match sent {
            Some(sent) if part["etag"] == format!("\"etag-{number}\"") => bytes.extend_from_slice(sent),
            _ => return respond(out, 400, &[], format!("part {number} was not uploaded").as_bytes()),
        }
    }
    if asked["oid"] != oid || hex(&Sha256::digest(&bytes)) != oid {
        return respond(out, 400, &[], b"the parts do not hash to the object's name");
    }
    state.objects.insert(oid.to_string(), bytes);
    drop(state);
    respond(out, 200, &[], b"{}")
}

/// The NDJSON commit: a header line, then `lfsFile` (an uploaded object) or `file` (base64) lines.
fn commit(out: &mut TcpStream, state: &Mutex<State>, repo: &str, body: &[u8]) -> std::io::Result<()> {
    let mut state = lock(state);
    if !exists(&state, repo) {
        return respond(out, 404, &[("X-Error-Code", "RepoNotFound".into())], b"Repository not found");
    }
    let lines: Vec<Value> = body.split(|&b| b == b'\n').filter_map(|line| serde_json::from_slice(line).ok()).collect();
    if lines.first().map(|line| &line["key"]) != Some(&json!("header")) {
        return json_answer(out, 400, &json!({"error": "the commit starts with its header"}));
    }
    for line in &lines[1..] {
        let value = &line["value"];
        let path = value["path"].as_str().unwrap_or("").to_string();
        let file = match line["key"].as_str() {
            Some("lfsFile") => match state.objects.get(value["oid"].as_str().unwrap_or("")) {
                Some(bytes) if value["size"].as_u64() == Some(bytes.len() as u64) => {
                    HubFile::new(repo, &path, bytes.clone(), true)
                }
                _ => return json_answer(out, 422, &json!({"error": format!("no uploaded object for {path}")})),
            },
            Some("file") => {
                let content = base64::engine::general_purpose::STANDARD.decode(value["content"].as_str().unwrap_or(""));
                match content {
                    Ok(bytes) => HubFile::new(repo, &path, bytes, false),
                    Err(_) => return json_answer(out, 400, &json!({"error": "the content is not base64"})),
                }
            }
            _ => return json_answer(out, 400, &json!({"error": "an operation the fake hub does not know"})),
        };
        state.files.insert(format!("{repo}/{path}"), file);
    }
    let url = format!("{}/{repo}/commit/{COMMIT}", state.endpoint);
    drop(state);
    json_answer(out, 200, &json!({"commitOid": COMMIT, "commitUrl": url}))
}
