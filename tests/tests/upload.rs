//! Pushing a file to the hub, against the loopback hub ([`fake_hub`]): the repository created (or
//! found), a binary file sent by LFS in one piece or in parts, a text file in the commit itself, the
//! same bytes again making no commit, a cancelled upload leaving the hub as it was; then `needle build
//! --upload` as a user runs it, and its errors: no repository named, no token, a token that may not
//! write, no hub.

use std::path::Path;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, Ordering};

use needle_engine::hub::{Hub, HubError, HubEvent, RepoFile};
use needle_tests::fake_hub::{self, FakeHub, Faults};
use needle_tests::{fixture, needle, read};

const REPO: &str = "alice/needle-home";
const TOKEN: &str = "hf_write";

fn hub(fake: &FakeHub, token: Option<&str>) -> Hub {
    // An upload never touches the cache.
    Hub { endpoint: fake.endpoint().into(), token: token.map(Into::into), offline: false, cache: Default::default() }
}

/// Uploads `local` to `path` in [`REPO`], returning what happened along the way.
fn upload(hub: &Hub, local: &Path, path: &str) -> (Result<needle_engine::hub::Uploaded, HubError>, Vec<HubEvent>) {
    let mut events = Vec::new();
    let never = AtomicBool::new(false);
    let result = hub.upload(local, &RepoFile::new(REPO, "main", path), &mut |event| events.push(event), &never);
    (result, events)
}

/// Uploads `local` to `path` in [`REPO`], cancelling it at the first event `stop_at` picks.
fn cancelled_upload(hub: &Hub, local: &Path, path: &str, stop_at: impl Fn(&HubEvent) -> bool) -> String {
    let cancel = AtomicBool::new(false);
    let mut on_event = |event: HubEvent| {
        if stop_at(&event) {
            cancel.store(true, Ordering::Relaxed);
        }
    };
    match hub.upload(local, &RepoFile::new(REPO, "main", path), &mut on_event, &cancel) {
        Err(error @ HubError::UploadCancelled { .. }) => error.to_string(),
        other => panic!("the upload was not cancelled: {other:?}"),
    }
}

#[test]
fn a_cancelled_upload_leaves_the_hub_as_it_was() {
    let fake = fake_hub::published();
    let hub = hub(&fake, Some(TOKEN));
    let local = fixture("models/pretrained.pkl");

    // Cut as the bytes start: the repository this upload created is deleted again.
    let message = cancelled_upload(&hub, &local, "model.pkl", |e| matches!(e, HubEvent::Uploading { .. }));
    assert!(message.contains("cancelled before its commit") && message.contains("nothing of it"), "{message}");
    assert!(!fake.has_repo(REPO), "the repository the cancelled upload made is still there");
    let puts = fake.seen().into_iter().filter(|s| s.method == "PUT").count();
    assert!(puts <= 1, "the bytes kept going after the cancel: {puts} PUTs");

    // Every part sent, cancelled before the commit: a repository that was there stays, as it was.
    let notes = tempfile::tempdir().unwrap();
    let readme = notes.path().join("README.md");
    std::fs::write(&readme, "# A tuned Needle\n").unwrap();
    upload(&hub, &readme, "README.md").0.unwrap();
    let size = std::fs::metadata(&local).unwrap().len() as usize;
    fake.set_faults(Faults { part_bytes: Some(size / 3 + 1), ..Faults::default() });
    let all_sent = |e: &HubEvent| matches!(e, HubEvent::Progress { bytes, total, .. } if bytes == total);
    cancelled_upload(&hub, &local, "model.pkl", all_sent);
    assert!(fake.file(REPO, "model.pkl").is_none(), "a cancelled upload was committed");
    assert_eq!(fake.file(REPO, "README.md").map(|file| file.bytes), Some(b"# A tuned Needle\n".to_vec()));
    let seen: Vec<String> = fake.seen().iter().map(|s| format!("{} {}", s.method, s.path)).collect();
    let commits = seen.iter().filter(|s| s.contains("/commit/")).count();
    assert_eq!(commits, 1, "only the earlier upload committed: {seen:?}");
    assert!(!seen.iter().any(|s| s.contains("lfs-complete")), "the parts were completed after the cancel: {seen:?}");
}

#[test]
fn a_binary_file_goes_by_lfs_into_a_new_repository_and_can_be_downloaded_back() {
    let fake = fake_hub::published();
    let hub = hub(&fake, Some(TOKEN));
    let local = fixture("models/pretrained.pkl");
    let (uploaded, events) = upload(&hub, &local, "weights/model.pkl");
    let uploaded = uploaded.unwrap();
    assert_eq!(uploaded.url, format!("{}/{REPO}", fake.endpoint()));
    assert_eq!(uploaded.file, format!("{REPO}/weights/model.pkl"));
    assert!(uploaded.commit.is_some());
    let pushed = fake.file(REPO, "weights/model.pkl").expect("the file is in the repository");
    assert!(pushed.lfs, "a binary file goes by LFS");
    assert_eq!(pushed.bytes, read("models/pretrained.pkl"));
    let total = pushed.bytes.len() as u64;
    assert_eq!(events.first(), Some(&HubEvent::Uploading { file: uploaded.file.clone(), total }));
    assert!(events.iter().any(|e| matches!(e, HubEvent::Progress { bytes, .. } if *bytes == total)), "{events:?}");
    assert_eq!(events.last(), Some(&HubEvent::Uploaded(uploaded.clone())));
    let seen: Vec<String> = fake.seen().iter().map(|s| format!("{} {}", s.method, s.path)).collect();
    assert!(seen[0] == "POST /api/repos/create" && seen.last().unwrap().contains("/commit/main"), "{seen:?}");
    let storage: Vec<_> = fake.seen().into_iter().filter(|s| s.path.starts_with("/upload/")).collect();
    assert!(storage.len() == 1 && storage[0].authorization.is_none(), "the token stays with the hub: {storage:?}");

    // The same bytes again: the repository exists (409) and already holds them, so no commit.
    let (again, _) = upload(&hub, &local, "weights/model.pkl");
    assert_eq!(again.unwrap().commit, None);

    // What was pushed downloads back as any hub file does.
    let mut back = Vec::new();
    let cache = tempfile::tempdir().unwrap();
    let reader = Hub { cache: cache.path().to_path_buf(), ..hub.clone() };
    let none = std::sync::atomic::AtomicBool::new(false);
    let path = reader.fetch(&RepoFile::new(REPO, "main", "weights/model.pkl"), &mut |e| back.push(e), &none).unwrap();
    assert_eq!(std::fs::read(path).unwrap(), read("models/pretrained.pkl"));
}

#[test]
fn a_large_file_goes_in_parts_and_a_text_file_in_the_commit() {
    let fake = fake_hub::published();
    let hub = hub(&fake, Some(TOKEN));
    let local = fixture("models/pretrained.pkl");
    let size = std::fs::metadata(&local).unwrap().len() as usize;
    fake.set_faults(Faults { part_bytes: Some(size / 3 + 1), ..Faults::default() });
    upload(&hub, &local, "model.pkl").0.unwrap();
    assert_eq!(fake.file(REPO, "model.pkl").unwrap().bytes, read("models/pretrained.pkl"));
    let parts = fake.seen().iter().filter(|s| s.method == "PUT" && s.path.contains("?part=")).count();
    assert_eq!(parts, 3);

    let notes = tempfile::tempdir().unwrap();
    let text = notes.path().join("README.md");
    std::fs::write(&text, "# A tuned Needle\n").unwrap();
    upload(&hub, &text, "README.md").0.unwrap();
    let pushed = fake.file(REPO, "README.md").unwrap();
    assert!(!pushed.lfs && pushed.bytes == b"# A tuned Needle\n", "{pushed:?}");
}

#[test]
fn refusals_say_what_to_do() {
    let fake = fake_hub::published();
    let local = fixture("models/pretrained.pkl");
    let message = upload(&hub(&fake, None), &local, "m.pkl").0.unwrap_err().to_string();
    assert!(message.contains("HF_TOKEN") && message.contains("write access"), "{message}");
    assert_eq!(fake.seen(), [], "nothing is asked without a token");
    let never = AtomicBool::new(false);
    let bad_name =
        hub(&fake, Some(TOKEN)).upload(&local, &RepoFile::new("needle", "main", "m.pkl"), &mut |_| {}, &never);
    assert!(bad_name.unwrap_err().to_string().contains("use <you>/<model>"));

    fake.set_faults(Faults { read_only: true, ..Faults::default() });
    let message = upload(&hub(&fake, Some("hf_read")), &local, "m.pkl").0.unwrap_err().to_string();
    assert!(message.contains("HTTP 403") && message.contains("lacks write access"), "{message}");
    fake.set_faults(Faults { token: Some(TOKEN.into()), ..Faults::default() });
    let message = upload(&hub(&fake, Some("hf_wrong")), &local, "m.pkl").0.unwrap_err().to_string();
    assert!(message.contains("HTTP 401") && message.contains("lacks write access"), "{message}");
    assert!(fake.file(REPO, "m.pkl").is_none());

    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let nowhere = Hub { endpoint: format!("http://{closed}"), ..hub(&fake, Some(TOKEN)) };
    let message = upload(&nowhere, &local, "m.pkl").0.unwrap_err().to_string();
    assert!(message.contains("could not reach") && message.contains("run it again"), "{message}");
}

/// `needle build` of the tiny fixture with its adapter, with the hub at `fake` and the environment
/// a user would set.
fn build(fake: &FakeHub, home: &Path, out: &Path) -> Command {
    let mut command = needle!();
    command
        .env("HF_ENDPOINT", fake.endpoint())
        .env("HF_HOME", home)
        .env("HF_TOKEN", TOKEN)
        .env("NEEDLE_HF_REPO", REPO)
        .env_remove("HF_HUB_OFFLINE")
        .arg("build")
        .arg(fixture("models/tiny_f16.pkl"))
        .arg("--lora")
        .arg(fixture("golden/tiny_f16/adapter.pkl"))
        .arg("--out")
        .arg(out)
        .arg("--upload");
    command
}

fn text(output: &Output) -> (String, String) {
    (String::from_utf8_lossy(&output.stdout).into_owned(), String::from_utf8_lossy(&output.stderr).into_owned())
}

#[test]
fn needle_build_upload_pushes_the_built_file_to_the_named_repository() {
    let fake = fake_hub::published();
    let home = tempfile::tempdir().unwrap();
    let out = home.path().join("tuned.cact");
    let output = build(&fake, home.path(), &out).output().unwrap();
    let (stdout, stderr) = text(&output);
    assert!(output.status.success(), "{stderr}");
    assert!(stdout.lines().last().unwrap().contains(&format!("uploaded  tuned.cact  {REPO}")), "{stdout}");
    assert!(stderr.contains(&format!("push      {REPO}/tuned.cact")), "{stderr}");
    let pushed = fake.file(REPO, "tuned.cact").expect("the .cact is in the repository, under its own name");
    assert!(pushed.lfs);
    assert_eq!(pushed.bytes, std::fs::read(&out).unwrap());

    // As JSON events, the upload's follow the build's.
    let output = build(&fake, home.path(), &out).args(["--events", "jsonl"]).output().unwrap();
    let (stdout, stderr) = text(&output);
    assert!(output.status.success(), "{stderr}");
    let last: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(last["event"], "uploaded", "{stdout}");
    assert_eq!(last["url"], format!("{}/{REPO}", fake.endpoint()));
}

#[test]
fn needle_build_upload_errors_name_the_fix() {
    let fake = fake_hub::published();
    let home = tempfile::tempdir().unwrap();
    let out = home.path().join("tuned.cact");
    let fails = |command: &mut Command| {
        let output = command.output().unwrap();
        assert!(!output.status.success());
        text(&output).1
    };

    let stderr = fails(build(&fake, home.path(), &out).env_remove("NEEDLE_HF_REPO"));
    assert!(stderr.contains("set NEEDLE_HF_REPO=<you>/<model> to upload"), "{stderr}");
    assert!(!out.exists(), "nothing is built when the upload cannot happen");

    let stderr = fails(build(&fake, home.path(), &out).env_remove("HF_TOKEN"));
    assert!(stderr.contains("needs an access token with write access"), "{stderr}");
    assert!(out.exists(), "the build itself is kept");

    fake.set_faults(Faults { read_only: true, ..Faults::default() });
    let stderr = fails(&mut build(&fake, home.path(), &out));
    assert!(stderr.contains("lacks write access"), "{stderr}");
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let stderr = fails(build(&fake, home.path(), &out).env("HF_ENDPOINT", format!("http://{closed}")));
    assert!(stderr.contains("could not reach") && !stderr.contains("panicked"), "{stderr}");
    assert!(fake.file(REPO, "tuned.cact").is_none());
}
