//! The base model from the hub, against a hub on loopback that the tests start ([`fake_hub`]): a
//! fresh download, the cache with no network call, resume after a cut, wrong bytes and sizes refused,
//! the 401 and 404 messages, offline with and without a cache, and each generation's base model from
//! its own repository — through the engine and the CLI.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::AtomicBool;

use needle_engine::generation::Generation;
use needle_engine::hub::{self, Hub, HubError, HubEvent, PublishedBase, RepoFile};
use needle_tests::fake_hub::{self, FakeHub, Faults, COMMIT};
use needle_tests::{needle, read};

const REPO: &str = "Cactus-Compute/needle2";

fn hub(fake: &FakeHub, cache: &Path) -> Hub {
    Hub { endpoint: fake.endpoint().into(), token: None, offline: false, cache: cache.to_path_buf() }
}

fn checkpoint() -> RepoFile {
    PublishedBase::of(Generation::Needle2).hub_files()[0].clone()
}

fn tokenizer() -> RepoFile {
    PublishedBase::of(Generation::Needle2).hub_files()[1].clone()
}

/// The base model of `generation`, from the cache or the hub.
fn resolve(hub: &Hub, generation: Generation, events: &mut Vec<HubEvent>) -> Result<hub::BaseModel, HubError> {
    hub::resolve_base_model(hub, generation, None, None, &mut |e| events.push(e), &AtomicBool::new(false))
}

/// Fetches `file`, returning what happened along the way.
fn fetch(hub: &Hub, file: &RepoFile) -> (Result<PathBuf, HubError>, Vec<HubEvent>) {
    let mut events = Vec::new();
    let result = hub.fetch(file, &mut |event| events.push(event), &AtomicBool::new(false));
    (result, events)
}

fn blobs(cache: &Path) -> Vec<String> {
    let dir = cache.join(format!("models--{}/blobs", REPO.replace('/', "--")));
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|entries| entries.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    names.sort();
    names
}

#[test]
fn a_fresh_download_lands_in_the_hub_cache_and_is_then_used_without_the_network() {
    let fake = fake_hub::published();
    let cache = tempfile::tempdir().unwrap();
    let hub = hub(&fake, cache.path());
    let mut events = Vec::new();
    let base = resolve(&hub, Generation::Needle2, &mut events).unwrap();
    assert_eq!(std::fs::read(&base.checkpoint).unwrap(), read("models/pretrained.pkl"));
    assert_eq!(std::fs::read(&base.tokenizer).unwrap(), read("models/tokenizer.model"));
    // The layout huggingface_hub uses, so either tool finds what the other fetched.
    let repo = cache.path().join("models--Cactus-Compute--needle2");
    assert_eq!(base.checkpoint, repo.join("snapshots").join(COMMIT).join("checkpoints/needle2.pkl"));
    assert_eq!(std::fs::read_to_string(repo.join("refs/main")).unwrap(), COMMIT);
    assert!(blobs(cache.path()).iter().all(|name| !name.ends_with(".incomplete")), "{:?}", blobs(cache.path()));
    let total = read("models/pretrained.pkl").len() as u64;
    assert!(events.contains(&HubEvent::Started { file: checkpoint().name(), total, resumed_from: 0 }), "{events:?}");
    assert!(events.iter().any(|e| matches!(e, HubEvent::Progress { bytes, .. } if *bytes == total)), "{events:?}");
    assert!(events.iter().any(|e| matches!(e, HubEvent::Downloaded { file, .. } if *file == tokenizer().name())));

    // Once cached: the same paths, and not one request.
    let asked = fake.seen().len();
    let mut again = Vec::new();
    let cached = resolve(&hub, Generation::Needle2, &mut again).unwrap();
    assert_eq!(cached, base);
    assert_eq!(fake.seen().len(), asked, "a cached base model needs no network call");
    assert!(again.iter().all(|e| matches!(e, HubEvent::Cached { .. })), "{again:?}");
    assert_eq!(hub::cached_base_model(&hub, Generation::Needle2), Some(base));
    assert_eq!(hub::cached_base_model(&hub, Generation::Needle3), None, "one generation is not the other");
}

#[test]
fn needle3_comes_from_its_own_repository_and_is_then_used_without_the_network() {
    let fake = fake_hub::published();
    let cache = tempfile::tempdir().unwrap();
    let hub = hub(&fake, cache.path());
    let mut events = Vec::new();
    let base = resolve(&hub, Generation::Needle3, &mut events).unwrap();
    let bytes = std::fs::read(&base.checkpoint).unwrap();
    assert_eq!(bytes, read("models/needle3_tiny.safetensors"));
    assert_eq!(needle_engine::checkpoint::generation(&bytes), Some(Generation::Needle3));
    assert_eq!(std::fs::read(&base.tokenizer).unwrap(), read("models/tokenizer.model"));
    let repo = cache.path().join("models--Cactus-Compute--needle3");
    assert_eq!(base.checkpoint, repo.join("snapshots").join(COMMIT).join("checkpoints/needle3.safetensors"));
    assert_eq!(base.tokenizer, repo.join("snapshots").join(COMMIT).join("tokenizer/tokenizer.model"));
    let [checkpoint, tokenizer] = PublishedBase::of(Generation::Needle3).hub_files();
    let total = read("models/needle3_tiny.safetensors").len() as u64;
    assert!(events.contains(&HubEvent::Started { file: checkpoint.name(), total, resumed_from: 0 }), "{events:?}");
    assert!(events.iter().any(|e| matches!(e, HubEvent::Downloaded { file, .. } if *file == tokenizer.name())));
    assert!(fake.seen().iter().all(|seen| !seen.path.contains("needle2")), "nothing of Needle 2 was asked for");

    // The announced size is what a download offer shows, and it is the file's.
    assert_eq!(hub.announce(&checkpoint).unwrap().size, total);
    let asked = fake.seen().len();
    assert_eq!(hub::cached_base_model(&hub, Generation::Needle3), Some(base.clone()));
    let offline = Hub { offline: true, ..hub.clone() };
    assert_eq!(resolve(&offline, Generation::Needle3, &mut Vec::new()).unwrap(), base);
    assert_eq!(fake.seen().len(), asked, "a cached base model needs no network call");
    assert_eq!(hub::cached_base_model(&hub, Generation::Needle2), None);
    // Offline, the other generation's message names its own file.
    let error = resolve(&offline, Generation::Needle2, &mut Vec::new()).unwrap_err().to_string();
    assert!(error.contains(&fake.url(REPO, "checkpoints/needle2.pkl")), "{error}");
}

#[test]
fn a_cut_download_resumes_from_its_partial_file_with_a_range_request() {
    let fake = fake_hub::published();
    let cache = tempfile::tempdir().unwrap();
    let hub = hub(&fake, cache.path());
    let total = read("models/pretrained.pkl").len() as u64;
    let half = total / 2;
    fake.set_faults(Faults { cut_at: Some(half), ..Faults::default() });
    let (cut, _) = fetch(&hub, &checkpoint());
    let message = cut.unwrap_err().to_string();
    assert!(
        message.contains(&format!("stopped at {half} of {total} bytes")) && message.contains("resume"),
        "{message}"
    );
    assert_eq!(hub.cached(&checkpoint()), None, "nothing at the final path after a cut");
    let partial = blobs(cache.path());
    assert!(partial.len() == 1 && partial[0].ends_with(".incomplete"), "{partial:?}");

    fake.set_faults(Faults::default());
    let (resumed, events) = fetch(&hub, &checkpoint());
    let path = resumed.unwrap();
    assert_eq!(std::fs::read(path).unwrap(), read("models/pretrained.pkl"));
    assert!(events.contains(&HubEvent::Started { file: checkpoint().name(), total, resumed_from: half }), "{events:?}");
    let range = fake.seen().into_iter().filter_map(|seen| seen.range).next_back();
    assert_eq!(range, Some(format!("bytes={half}-")), "the second try asks only for the rest");
    assert!(blobs(cache.path()).iter().all(|name| !name.ends_with(".incomplete")));
}

#[test]
fn wrong_bytes_and_wrong_sizes_are_refused_and_leave_nothing_behind() {
    let fake = fake_hub::published();
    let cache = tempfile::tempdir().unwrap();
    let hub = hub(&fake, cache.path());
    fake.set_faults(Faults { corrupt: true, ..Faults::default() });
    for (file, hash) in [(checkpoint(), "sha256"), (tokenizer(), "git blob id")] {
        let (result, _) = fetch(&hub, &file);
        let message = result.unwrap_err().to_string();
        assert!(message.contains(hash) && message.contains("removed"), "{message}");
        assert_eq!(hub.cached(&file), None);
        assert_eq!(blobs(cache.path()), Vec::<String>::new(), "a damaged download is not kept to resume from");
    }

    // A file longer than the size the hub announced.
    fake.set_faults(Faults { short_size: true, ..Faults::default() });
    let message = fetch(&hub, &checkpoint()).0.unwrap_err().to_string();
    assert!(message.contains("with size over") && message.contains("removed"), "{message}");
    assert_eq!(blobs(cache.path()), Vec::<String>::new());
    assert_eq!(hub.cached(&checkpoint()), None);
}

#[test]
fn refusals_and_missing_files_say_what_to_do() {
    let fake = fake_hub::published();
    let cache = tempfile::tempdir().unwrap();
    let anonymous = hub(&fake, cache.path());
    fake.set_faults(Faults { token: Some("hf_secret".into()), ..Faults::default() });
    let (refused, _) = fetch(&anonymous, &checkpoint());
    let message = refused.unwrap_err().to_string();
    assert!(message.contains("HTTP 401") && message.contains("set HF_TOKEN"), "{message}");
    let wrong = Hub { token: Some("hf_wrong".into()), ..anonymous.clone() };
    let message = fetch(&wrong, &checkpoint()).0.unwrap_err().to_string();
    assert!(message.contains("HTTP 401") && message.contains("token in HF_TOKEN cannot read it"), "{message}");

    let signed_in = Hub { token: Some("hf_secret".into()), ..anonymous.clone() };
    let before = fake.seen().len();
    fetch(&signed_in, &checkpoint()).0.unwrap();
    let seen = fake.seen().split_off(before);
    let sent =
        |path_start: &str| seen.iter().filter(|s| s.path.starts_with(path_start)).all(|s| s.authorization.is_some());
    assert!(sent("/Cactus-Compute"), "the token goes to the hub: {seen:?}");
    let storage: Vec<_> = seen.iter().filter(|s| s.path.starts_with("/cdn/")).collect();
    assert!(!storage.is_empty() && storage.iter().all(|s| s.authorization.is_none()), "but not to storage: {seen:?}");

    fake.set_faults(Faults::default());
    let no_repo = fetch(&anonymous, &RepoFile { repo: "Cactus-Compute/needle9".into(), ..checkpoint() }).0;
    let message = no_repo.unwrap_err().to_string();
    assert!(message.contains("no repository Cactus-Compute/needle9") && message.contains("404"), "{message}");
    let no_file = fetch(&anonymous, &RepoFile::new(REPO, "main", "checkpoints/needle3.pkl")).0;
    let message = no_file.unwrap_err().to_string();
    assert!(message.contains("no file checkpoints/needle3.pkl in Cactus-Compute/needle2"), "{message}");
}

#[test]
fn offline_uses_the_cache_and_without_one_says_which_files_to_fetch() {
    let fake = fake_hub::published();
    let cache = tempfile::tempdir().unwrap();
    let offline = Hub { offline: true, ..hub(&fake, cache.path()) };
    let error = resolve(&offline, Generation::Needle2, &mut Vec::new()).unwrap_err().to_string();
    assert!(error.contains("HF_HUB_OFFLINE") && error.contains(&fake.url(REPO, &checkpoint().path)), "{error}");
    assert!(error.contains("--checkpoint"), "{error}");
    assert_eq!(fake.seen(), [], "offline means no network call");

    resolve(&hub(&fake, cache.path()), Generation::Needle2, &mut Vec::new()).unwrap();
    let asked = fake.seen().len();
    let base = resolve(&offline, Generation::Needle2, &mut Vec::new()).unwrap();
    assert_eq!(std::fs::read(base.tokenizer).unwrap(), read("models/tokenizer.model"));
    assert_eq!(fake.seen().len(), asked);

    // No hub at all: the message names the address and the way around it.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let unreachable = Hub { endpoint: format!("http://{closed}"), ..hub(&fake, tempfile::tempdir().unwrap().path()) };
    let error = fetch(&unreachable, &checkpoint()).0.unwrap_err().to_string();
    assert!(error.contains("could not reach the model hub") && error.contains("on a connected machine"), "{error}");
}

#[test]
fn a_given_checkpoint_is_used_as_is_and_finds_its_tokenizer_beside_it() {
    let fake = fake_hub::published();
    let cache = tempfile::tempdir().unwrap();
    let hub = hub(&fake, cache.path());
    let given = needle_tests::fixture("models/pretrained.pkl");
    let none = AtomicBool::new(false);
    let base = hub::resolve_base_model(&hub, Generation::Needle3, Some(&given), None, &mut |_| {}, &none).unwrap();
    assert_eq!(base.checkpoint, given);
    assert_eq!(base.tokenizer, needle_tests::fixture("models/tokenizer.model"));
    assert_eq!(fake.seen(), []);
}

/// `needle` with the hub at `fake` and its cache under `home`, as a user's environment would say.
fn needle_at(fake: &FakeHub, home: &Path) -> Command {
    let mut command = needle!();
    command
        .env("HF_ENDPOINT", fake.endpoint())
        .env("HF_HOME", home)
        .env_remove("HF_HUB_CACHE")
        .env_remove("HF_TOKEN")
        .env_remove("HF_HUB_OFFLINE");
    command
}

fn text(output: &Output) -> (String, String) {
    (String::from_utf8_lossy(&output.stdout).into_owned(), String::from_utf8_lossy(&output.stderr).into_owned())
}

#[test]
fn needle_download_fetches_the_base_model_and_says_where_it_went() {
    let fake = fake_hub::published();
    let home = tempfile::tempdir().unwrap();
    let out = home.path().join("copies");
    let output =
        needle_at(&fake, home.path()).args(["download", "--generation", "2", "--out"]).arg(&out).output().unwrap();
    let (stdout, stderr) = text(&output);
    assert!(output.status.success(), "{stderr}");
    assert!(stdout.contains(&out.join("needle2.pkl").display().to_string()), "{stdout}");
    assert_eq!(std::fs::read(out.join("needle2.pkl")).unwrap(), read("models/pretrained.pkl"));
    assert_eq!(std::fs::read(out.join("tokenizer.model")).unwrap(), read("models/tokenizer.model"));
    assert!(home.path().join("hub/models--Cactus-Compute--needle2/refs/main").is_file(), "into the HF_HOME cache");

    // One file by its spec, as JSON events.
    let output = needle_at(&fake, home.path())
        .args(["download", "Cactus-Compute/needle2/tokenizer/tokenizer.model", "--events", "jsonl"])
        .output()
        .unwrap();
    let (stdout, stderr) = text(&output);
    assert!(output.status.success(), "{stderr}");
    let last: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(last["event"], "downloaded", "{stdout}");

    let output = needle_at(&fake, home.path()).args(["download", "Cactus-Compute/nothing"]).output().unwrap();
    let (_, stderr) = text(&output);
    assert!(!output.status.success() && stderr.contains("no repository Cactus-Compute/nothing"), "{stderr}");
}

#[test]
fn model_commands_without_a_checkpoint_fetch_their_generation_and_then_work_offline() {
    let fake = fake_hub::published();
    let home = tempfile::tempdir().unwrap();
    let data = needle_tests::fixture("data/tool_calls.jsonl");

    // Offline with nothing cached: a clear error that says what to fetch.
    let needle2 = ["--generation", "2"];
    let output =
        needle_at(&fake, home.path()).env("HF_HUB_OFFLINE", "1").arg("eval").arg(&data).args(needle2).output().unwrap();
    let (_, stderr) = text(&output);
    assert!(!output.status.success() && stderr.contains("HF_HUB_OFFLINE is set"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");

    // Connected: the first command downloads, with the bar's header line on stderr.
    let output = needle_at(&fake, home.path())
        .arg("eval")
        .arg(&data)
        .args(needle2)
        .args(["--json", "--max-len", "256"])
        .output()
        .unwrap();
    let (stdout, stderr) = text(&output);
    assert!(output.status.success(), "{stderr}");
    assert!(stderr.contains("fetch") && stderr.contains("checkpoints/needle2.pkl"), "{stderr}");
    let eval: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert!(eval["loss"].as_f64().unwrap().is_finite(), "{stdout}");

    // Then offline, from the cache: finetune's plan and build need nothing more.
    let asked = fake.seen().len();
    let output = needle_at(&fake, home.path())
        .env("HF_HUB_OFFLINE", "1")
        .arg("finetune")
        .arg(&data)
        .args(needle2)
        .args(["--dry-run", "--events", "jsonl", "--max-len", "256"])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", text(&output).1);
    let out = home.path().join("needle2.cact");
    let output = needle_at(&fake, home.path())
        .env("HF_HUB_OFFLINE", "1")
        .args(["build", "--out"])
        .arg(&out)
        .args(needle2)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", text(&output).1);
    assert_eq!(needle_engine::cact::CactFile::open(&out).unwrap().header.generation, Generation::Needle2);
    assert_eq!(fake.seen().len(), asked, "offline commands made no request");
}

#[test]
fn the_default_generation_3_is_fetched_for_download_and_the_model_commands() {
    let fake = fake_hub::published();
    let home = tempfile::tempdir().unwrap();
    let out = home.path().join("copies");
    let output = needle_at(&fake, home.path()).args(["download", "--out"]).arg(&out).output().unwrap();
    let (stdout, stderr) = text(&output);
    assert!(output.status.success(), "{stderr}");
    assert!(stdout.contains(&out.join("needle3.safetensors").display().to_string()), "{stdout}");
    assert_eq!(std::fs::read(out.join("needle3.safetensors")).unwrap(), read("models/needle3_tiny.safetensors"));
    assert!(home.path().join("hub/models--Cactus-Compute--needle3/refs/main").is_file(), "into the HF_HOME cache");
    assert!(!home.path().join("hub/models--Cactus-Compute--needle2").exists(), "and nothing of Needle 2");

    // Its repository named alone means its own files; a bad generation is refused by name.
    let output = needle_at(&fake, home.path())
        .env("HF_HUB_OFFLINE", "1")
        .args(["download", "Cactus-Compute/needle3", "--events", "jsonl"])
        .output()
        .unwrap();
    let (stdout, stderr) = text(&output);
    assert!(output.status.success() && stdout.contains("needle3.safetensors"), "{stdout}{stderr}");
    let output = needle_at(&fake, home.path()).args(["download", "--generation", "4"]).output().unwrap();
    let (_, stderr) = text(&output);
    assert!(!output.status.success() && stderr.contains("use 2 or 3"), "{stderr}");

    // A model command without a checkpoint, offline from the cache: Needle 3 without --generation (as
    // cactus-needle 3.x) or with --generation 3, and Needle 2 (not cached) with --generation 2.
    let data = needle_tests::fixture("data/tool_calls.jsonl");
    let eval = |generation: &[&str]| {
        needle_at(&fake, home.path())
            .env("HF_HUB_OFFLINE", "1")
            .arg("eval")
            .arg(&data)
            .args(generation)
            .args(["--json", "--max-len", "256", "--max-examples", "4"])
            .output()
            .unwrap()
    };
    for generation in [&[][..], &["--generation", "3"]] {
        let output = eval(generation);
        let (stdout, stderr) = text(&output);
        assert!(output.status.success(), "{generation:?}: {stderr}");
        let loss: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
        assert!(loss["loss"].as_f64().unwrap().is_finite(), "{stdout}");
    }
    let output = eval(&["--generation", "2"]);
    let (_, stderr) = text(&output);
    assert!(!output.status.success() && stderr.contains("checkpoints/needle2.pkl"), "{stderr}");
    let help = text(&needle_at(&fake, home.path()).args(["eval", "--help"]).output().unwrap()).0;
    assert!(help.contains("cactus-needle 3.x") && help.contains("[default: 3]"), "{help}");
}
