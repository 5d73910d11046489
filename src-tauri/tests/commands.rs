//! The app's commands through Tauri's IPC on the mock runtime: what the window sends, what it gets
//! back, and the trainings, builds and generations they start in a real worker (this package's binary in
//! worker mode; generations ask an OpenAI-compatible endpoint on loopback).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use needle_engine::cact::CactFile;
use needle_engine::hub::Hub;
use needle_studio::{with_commands, Launch, Start, Studio, Worker};
use needle_tests::fake_hub::{self, Faults};
use needle_tests::fake_llm::{Answer, FakeLlm};
use serde_json::{json, Value};
use tauri::ipc::{CallbackFn, InvokeBody};
use tauri::test::{get_ipc_response, mock_builder, mock_context, noop_assets, MockRuntime, INVOKE_KEY};
use tauri::webview::InvokeRequest;
use tauri::{Manager, WebviewWindow};

/// A training on the tiny fixture model takes seconds; this bounds a slow CI machine.
const TRAINING_TIMEOUT: Duration = Duration::from_secs(300);

fn repo(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(relative)
}

/// A mock app with the real commands, its data in `data_dir`, started with the bundled example.
struct App {
    _app: tauri::App<MockRuntime>,
    window: WebviewWindow<MockRuntime>,
}

impl App {
    /// Opened with the fixture model, and a hub that is offline with an empty cache.
    fn open(data_dir: &Path) -> Self {
        let hub =
            Hub { endpoint: "http://127.0.0.1:9".into(), token: None, offline: true, cache: data_dir.join("hub") };
        Self::open_on(data_dir, hub)
    }

    /// Opened with the fixture model, and `hub`.
    fn open_on(data_dir: &Path, hub: Hub) -> Self {
        let launch = Launch {
            dataset: Some(repo("examples/smart_home.jsonl")),
            checkpoint: Some(repo("tests/fixtures/models/pretrained.pkl")),
            tokenizer: None,
            preset: None,
        };
        Self::open_with(data_dir, launch, hub)
    }

    fn open_with(data_dir: &Path, launch: Launch, hub: Hub) -> Self {
        Self::with(|app| {
            let worker = Worker::app(PathBuf::from(env!("CARGO_BIN_EXE_needle-studio")));
            let hardware = needle_engine::backend::auto().info;
            Studio::open(data_dir.to_path_buf(), launch, worker, hardware, hub).expect("studio opens").manage(app);
        })
    }

    /// A mock app and its window, `open` opening its rooms as the real app's setup does.
    fn with(open: impl FnOnce(&tauri::App<MockRuntime>)) -> Self {
        let app = with_commands(mock_builder()).build(mock_context(noop_assets())).expect("mock app builds");
        open(&app);
        let window = tauri::WebviewWindowBuilder::new(&app, "main", Default::default()).build().expect("window");
        Self { _app: app, window }
    }

    /// Calls `cmd` as the UI does; the command's value, or its error.
    fn invoke(&self, cmd: &str, args: Value) -> Result<Value, Value> {
        let request = InvokeRequest {
            cmd: cmd.into(),
            callback: CallbackFn(0),
            error: CallbackFn(1),
            url: "tauri://localhost".parse().expect("url"),
            body: InvokeBody::Json(args),
            headers: Default::default(),
            invoke_key: INVOKE_KEY.to_string(),
        };
        get_ipc_response(&self.window, request).map(|body| body.deserialize::<Value>().expect("JSON response"))
    }

    /// Closes the window as the user would, running the app's real exit handling.
    fn close(self) {
        let App { _app: app, window } = self;
        app.run(move |handle, event| {
            if let tauri::RunEvent::Ready = event {
                window.destroy().expect("the window closes");
            }
            needle_studio::on_run_event(handle, event);
        });
    }

    fn studio(&self) -> Studio {
        self.window.state::<Studio>().inner().clone()
    }

    fn ok(&self, cmd: &str, args: Value) -> Value {
        self.invoke(cmd, args).unwrap_or_else(|error| panic!("{cmd} failed: {error}"))
    }

    fn error(&self, cmd: &str, args: Value) -> String {
        match self.invoke(cmd, args) {
            Ok(value) => panic!("{cmd} should have failed, got {value}"),
            Err(Value::String(message)) => message,
            Err(other) => panic!("{cmd} failed with a non-string error {other}"),
        }
    }

    /// Polls `history` until training `id` satisfies `done`, and returns its entry.
    fn wait_for(&self, id: &str, what: &str, done: impl Fn(&Value) -> bool) -> Value {
        let start = Instant::now();
        loop {
            let history = self.ok("history", json!({}));
            let entry = history.as_array().expect("a list").iter().find(|e| e["id"] == id).cloned();
            if let Some(entry) = entry.filter(|entry| done(entry)) {
                return entry;
            }
            assert!(start.elapsed() < TRAINING_TIMEOUT, "timed out waiting for training {id} to {what}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// A training as the UI sends it: the launch paths and one pass of small settings, with `changes` applied.
fn draft(changes: Value) -> Value {
    let mut settings = json!({
        "epochs": 1, "lr": 2e-4, "rank": 8, "alpha": 16.0, "batch_size": 8, "max_len": 512,
        "val_split": 0.2, "seed": 0
    });
    for (key, value) in changes.as_object().expect("an object") {
        settings[key] = value.clone();
    }
    json!({
        "dataset": repo("examples/smart_home.jsonl"),
        "checkpoint": repo("tests/fixtures/models/pretrained.pkl"),
        "tokenizer": repo("tests/fixtures/models/tokenizer.model"),
        "device": "cpu",
        "settings": settings,
    })
}

/// The channel argument as the UI's `new Channel()` serialises it.
const CHANNEL: &str = "__CHANNEL__:7";

/// A bundled engine that never answers (a driver wedged in `cuInit`) holds neither the window nor its
/// start-up past the engine's deadline: `startup` answers on the app's own worker, says why, and the
/// engine is stopped.
#[cfg(unix)]
#[test]
fn startup_does_not_wait_on_a_bundled_engine_that_never_answers() {
    use std::os::unix::fs::PermissionsExt;

    let dir = tempfile::tempdir().unwrap();
    let (bin, pid_file) = (dir.path().join("bin"), dir.path().join("engine.pid"));
    std::fs::create_dir_all(&bin).unwrap();
    let engine = bin.join("needle");
    std::fs::write(&engine, format!("#!/bin/sh\necho $$ > '{}'\nexec sleep 600\n", pid_file.display())).unwrap();
    std::fs::set_permissions(&engine, std::fs::Permissions::from_mode(0o755)).unwrap();
    let hub = Hub { endpoint: "http://127.0.0.1:9".into(), token: None, offline: true, cache: dir.path().join("hub") };
    let deadline = Duration::from_secs(2);
    let began = Instant::now();
    let app = App::with(|app| {
        let start = Start {
            data_dir: dir.path().join("data"),
            launch: Launch::default(),
            // The app's binary beside the stand-in engine, as a bundle installs them.
            app_worker: Worker::app(bin.join("needle-studio")),
            hub,
            engine_deadline: deadline,
        };
        needle_studio::start(app.handle(), start);
    });
    assert!(began.elapsed() < deadline, "the window waited {:?} for the engine", began.elapsed());

    let startup = app.ok("startup", json!({}));
    let waited = began.elapsed();
    assert!(waited >= deadline && waited < deadline + Duration::from_secs(5), "start-up took {waited:?}");
    let reason = startup["hardware"]["reason"].as_str().unwrap();
    assert!(
        reason.ends_with("(the bundled engine did not answer: still silent after 2 s, so it was stopped)"),
        "{reason}"
    );
    let own = needle_engine::backend::auto().info;
    assert_eq!(startup["hardware"]["compiled"], json!(own.compiled), "the app's own worker's backends");
    // The other commands work from here.
    assert!(app.ok("history", json!({})).as_array().unwrap().is_empty());

    let pid = std::fs::read_to_string(&pid_file).unwrap();
    let alive = || std::process::Command::new("kill").args(["-0", pid.trim()]).status().unwrap().success();
    let stopped = Instant::now();
    while alive() && stopped.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!alive(), "the silent engine {} still runs", pid.trim());
}

#[test]
fn startup_shows_the_hardware_the_presets_and_the_launch_paths() {
    let dir = tempfile::tempdir().unwrap();
    let startup = App::open(dir.path()).ok("startup", json!({}));
    assert_eq!(startup["hardware"]["backend"], "cpu", "no GPU in the tests: {startup}");
    assert_eq!(startup["devices"][0], "auto");
    assert!(startup["devices"].as_array().unwrap().contains(&json!("cpu")));
    let presets: Vec<&str> =
        startup["presets"].as_array().unwrap().iter().map(|p| p["name"].as_str().unwrap()).collect();
    assert_eq!(presets, ["quick", "balanced", "thorough"]);
    let checkpoint = PathBuf::from(startup["preferences"]["checkpoint"].as_str().unwrap());
    assert!(checkpoint.ends_with("tests/fixtures/models/pretrained.pkl") && checkpoint.is_absolute());
    // The tokenizer defaults to the one beside the checkpoint.
    assert_eq!(
        PathBuf::from(startup["preferences"]["tokenizer"].as_str().unwrap()),
        checkpoint.with_file_name("tokenizer.model")
    );
    assert!(startup["dataset"].as_str().unwrap().ends_with("examples/smart_home.jsonl"));
    assert_eq!(startup["history"], json!([]));
}

#[test]
fn settings_are_remembered_between_launches() {
    let dir = tempfile::tempdir().unwrap();
    let settings = json!({ "checkpoint": "/models/base.pkl", "tokenizer": "/models/tok.model", "device": "cpu", "preset": "thorough" });
    App::open(dir.path()).ok("save_preferences", json!({ "preferences": settings }));
    let reopened = App::open(dir.path()).ok("startup", json!({}));
    // The launch's checkpoint replaces the remembered base model; the rest is as saved.
    assert_eq!(reopened["preferences"]["device"], "cpu");
    assert_eq!(reopened["preferences"]["preset"], "thorough");
}

#[test]
fn the_dataset_report_counts_examples_and_names_bad_lines() {
    let dir = tempfile::tempdir().unwrap();
    let app = App::open(dir.path());
    let tokenizer = repo("tests/fixtures/models/tokenizer.model");
    let report = app.ok(
        "load_dataset",
        json!({ "path": repo("examples/smart_home.jsonl"), "tokenizer": tokenizer, "maxLen": 512 }),
    );
    assert!(report["usable_examples"].as_u64().unwrap() >= 20, "{report}");
    assert_eq!(report["problems"], json!([]));
    assert!(!report["samples"].as_array().unwrap().is_empty());

    let mixed = repo("tests/fixtures/data/bad/mixed.jsonl");
    let report = app.ok("load_dataset", json!({ "path": mixed, "tokenizer": tokenizer, "maxLen": 512 }));
    let problems = report["problems"].as_array().unwrap();
    assert!(!problems.is_empty() && problems.iter().all(|p| p["line"].as_u64().unwrap() > 0), "{report}");

    let missing =
        app.error("load_dataset", json!({ "path": "/no/such/data.jsonl", "tokenizer": tokenizer, "maxLen": 512 }));
    assert!(missing.contains("/no/such/data.jsonl"), "{missing}");
    let no_tokenizer = app.error("load_dataset", json!({ "path": mixed, "tokenizer": null, "maxLen": 512 }));
    assert!(no_tokenizer.contains("tokenizer"), "{no_tokenizer}");
}

#[test]
fn validation_marks_each_bad_field_and_start_refuses_the_training() {
    let dir = tempfile::tempdir().unwrap();
    let app = App::open(dir.path());
    assert_eq!(app.ok("validate_training", json!({ "draft": draft(json!({})) })), json!({}));

    let mut bad = draft(json!({ "epochs": 0, "lr": "fast", "batch_size": 2.5 }));
    bad["checkpoint"] = json!("/no/such/base.pkl");
    let errors = app.ok("validate_training", json!({ "draft": bad }));
    assert_eq!(errors["lr"], "enter a number");
    assert_eq!(errors["batch_size"], "use a whole number");
    assert_eq!(errors["checkpoint"], "no file at /no/such/base.pkl");

    let refused = app.error("start_training", json!({ "draft": bad, "onEvent": CHANNEL }));
    assert!(refused.starts_with("the training is not ready") && refused.contains("checkpoint"), "{refused}");
    assert_eq!(app.ok("history", json!({})), json!([]), "a refused training leaves no record");
}

#[test]
fn a_training_runs_in_the_worker_builds_a_cact_and_publishes_it() {
    let dir = tempfile::tempdir().unwrap();
    // A hub on loopback for Publish; nothing else asks it anything.
    let fake = fake_hub::published();
    let hub = Hub { endpoint: fake.endpoint().into(), token: None, offline: false, cache: dir.path().join("hub") };
    let app = App::open_on(dir.path(), hub);
    let plan = app.ok("plan_training", json!({ "draft": draft(json!({})) }));
    let steps = plan["steps"].as_u64().unwrap();
    assert!(steps > 0 && plan["memory_estimate_bytes"].as_u64().unwrap() > 0, "{plan}");

    let entry = app.ok("start_training", json!({ "draft": draft(json!({})), "onEvent": CHANNEL }));
    assert_eq!(entry["status"], "running");
    let id = entry["id"].as_str().unwrap();
    let again = app.error("start_training", json!({ "draft": draft(json!({})), "onEvent": CHANNEL }));
    assert!(again.contains("already going"), "{again}");

    let done = app.wait_for(id, "end", |e| e["status"] != "running");
    assert_eq!(done["status"], "finished", "{done}");
    assert_eq!(done["steps_done"].as_u64(), Some(steps), "the training took the planned steps");
    assert!(done["final_loss"].as_f64().unwrap().is_finite() && done["final_val"].is_f64(), "{done}");
    // The held-out examples were answered by the base and the tuned model.
    let held_out = done["scores"]["base"]["calls"]["examples"].as_u64().unwrap();
    assert!(held_out > 0, "{done}");
    assert_eq!(done["scores"]["tuned"]["calls"]["examples"].as_u64(), Some(held_out), "{done}");
    assert!(done["scores"]["tuned"]["loss"].as_f64().unwrap() < done["scores"]["base"]["loss"].as_f64().unwrap());
    let adapter = PathBuf::from(done["adapter"].as_str().unwrap());
    assert!(adapter.is_file() && adapter.starts_with(dir.path()), "{}", adapter.display());
    assert_eq!(app.ok("cancel_training", json!({})), "idle", "nothing runs after the training ended");

    let opened = app.ok("open_training", json!({ "id": id }));
    assert!(opened["chart"].as_str().unwrap().contains("polyline"), "the reopened training has its loss chart");
    assert!(app.error("open_training", json!({ "id": "../settings" })).contains("settings"));

    // A Needle 2 model has no depth ladder: the Export step says whose it is.
    let refusal = app.ok("ladder_refusal", json!({ "trainingId": id }));
    assert!(refusal.as_str().is_some_and(|text| text.contains("is Needle 3's")), "{refusal}");
    let out = dir.path().join("built").join("tuned.cact");
    let odd =
        app.error("build_cact", json!({ "trainingId": id, "request": { "bits": 3, "out": out }, "onEvent": CHANNEL }));
    assert!(odd.contains("choose 4 or 2"), "{odd}");
    app.ok("build_cact", json!({ "trainingId": id, "request": { "bits": 4, "out": out }, "onEvent": CHANNEL }));
    let built = app.wait_for(id, "record its .cact", |e| !e["cact"].is_null());
    let file = CactFile::open(&out).expect("the built .cact reads back");
    assert_eq!(built["cact"]["tensors"].as_u64(), Some(file.records.len() as u64));
    assert_eq!(built["cact"]["bytes"].as_u64(), Some(std::fs::metadata(&out).unwrap().len()));
    // The tuned model three ways, from one job: float, its quantization simulated, the file read back;
    // each on the same held-out examples, each answer told apart by kind.
    for row in ["float", "simulated", "cact"] {
        let calls = &built["cact"]["rows"][row]["calls"];
        assert_eq!(calls["examples"].as_u64(), Some(held_out), "{row}: {built}");
        let kinds: u64 = calls["breakdown"]["kinds"].as_object().unwrap().values().map(|n| n.as_u64().unwrap()).sum();
        assert_eq!(kinds, held_out, "{row}'s kinds add up to the examples: {calls}");
        assert!(built["cact"]["rows"][row]["loss"].as_f64().unwrap().is_finite(), "{built}");
    }
    // Evaluate draws each tool's answers by kind and words the three rows' gaps.
    let evaluation = app.ok("evaluation", json!({ "trainingId": id }));
    let charts = evaluation["charts"].as_array().unwrap();
    let tools = done["scores"]["tuned"]["calls"]["per_tool"].as_object().unwrap();
    assert_eq!(charts.len(), tools.len(), "one chart per tool: {evaluation}");
    assert!(charts
        .iter()
        .all(|c| c["svg"].as_str().unwrap().starts_with("<svg") && tools.contains_key(c["tool"].as_str().unwrap())));
    let kinds = evaluation["kinds"].as_array().unwrap();
    assert!(!kinds.is_empty() && kinds.iter().all(|k| k["color"].as_str().unwrap().starts_with('#')), "{evaluation}");
    let gaps = evaluation["gaps"].as_str().unwrap();
    assert!(gaps.starts_with("Quantizing the model") && gaps.contains(&format!("of {held_out} exact")), "{gaps}");

    // Publish: the built file to a model repository on the hub, with a token typed in the window.
    app.studio().isolate_keys();
    let setup = app.ok("publish_setup", json!({}));
    assert_eq!((setup["token"]["source"].as_str(), setup["state"]["state"].as_str()), (Some("none"), Some("idle")));
    let publish = |repo: &str| json!({ "trainingId": id, "repo": repo, "onEvent": CHANNEL });
    assert!(app.error("publish_cact", publish("needle")).contains("<you>/<model>"));
    assert!(app.error("publish_cact", publish("alice/needle-home")).contains("token with write access"));
    app.ok("remember_key", json!({ "name": "hub_token", "key": "hf_typed" }));
    let setup_state = || app.ok("publish_setup", json!({}))["state"].clone();
    // Cancelled while the bytes travel (the hub takes them over a few seconds): nothing is published, and
    // the repository the upload made is gone again.
    assert_eq!(app.ok("cancel_publish", json!({}))["state"], "idle", "nothing to cancel before an upload");
    let size = std::fs::metadata(&out).unwrap().len();
    fake.set_faults(Faults { bytes_per_s: Some(size / 4 + 1), ..Faults::default() });
    app.ok("publish_cact", publish("alice/needle-home"));
    poll("the bytes to travel", setup_state, |state| state["state"] == "running" && state["total"].as_u64() > Some(0));
    assert_eq!(app.ok("cancel_publish", json!({}))["state"], "running");
    let cancelled = poll("the upload to stop", setup_state, |state| state["state"] != "running");
    assert_eq!(cancelled["state"], "cancelled", "{cancelled}");
    assert!(cancelled["message"].as_str().unwrap().contains("nothing of it was published"), "{cancelled}");
    assert!(!fake.has_repo("alice/needle-home"), "the cancelled upload's repository is still on the hub");
    assert!(!fake.seen().iter().any(|seen| seen.path.contains("/commit/")), "a cancelled upload committed");
    fake.set_faults(Faults::default());
    app.ok("publish_cact", publish("alice/needle-home"));
    let published = poll("the upload to end", setup_state, |state| state["state"] != "running");
    assert_eq!(published["state"], "published", "{published}");
    assert_eq!(published["url"], format!("{}/alice/needle-home", fake.endpoint()));
    let pushed = fake.file("alice/needle-home", "tuned.cact").expect("the .cact is on the hub");
    assert_eq!(pushed.bytes, std::fs::read(&out).unwrap());
    assert!(fake
        .seen()
        .iter()
        .all(|seen| seen.path.starts_with("/upload/") || seen.authorization.as_deref() == Some("Bearer hf_typed")));
    // The training keeps where its file went, for History; the file built again is another, unpublished.
    let kept = app.ok("open_training", json!({ "id": id }))["entry"]["cact"]["published"].clone();
    assert_eq!(kept["url"], published["url"], "{kept}");
    app.ok("build_cact", json!({ "trainingId": id, "request": { "bits": 4, "out": out }, "onEvent": CHANNEL }));
    app.wait_for(id, "forget the upload of the file built before", |e| e["cact"]["published"].is_null());

    // Try: the base and the tuned model answer the same question side by side.
    let sample = &app.ok(
        "load_dataset",
        json!({ "path": repo("examples/smart_home.jsonl"), "tokenizer": repo("tests/fixtures/models/tokenizer.model"), "maxLen": 512 }),
    )["samples"][0];
    let question = json!({ "training_id": id, "tools": sample["tools"], "query": sample["query"] });
    let answers = app.ok("try_model", json!({ "question": question }));
    for model in ["base", "tuned"] {
        assert!(
            answers[model]["text"].is_string() && answers[model]["tokens_per_s"].as_f64().unwrap() > 0.0,
            "{answers}"
        );
    }
    // A query that starts with a dash is a query, not a flag.
    let dashed = json!({ "training_id": null, "tools": sample["tools"], "query": "-5 degrees in the kitchen" });
    assert!(app.ok("try_model", json!({ "question": dashed }))["base"]["text"].is_string());
    let bad = json!({ "training_id": id, "tools": "{not json", "query": "hi" });
    assert!(app.error("try_model", json!({ "question": bad })).starts_with("Tools:"));
}

#[test]
fn cancel_stops_after_the_step_and_a_second_cancel_ends_the_worker() {
    let dir = tempfile::tempdir().unwrap();
    let app = App::open(dir.path());
    let long = draft(json!({ "epochs": 200 }));

    // One press: the worker stops at the next step boundary and keeps what it learned.
    let entry = app.ok("start_training", json!({ "draft": long, "onEvent": CHANNEL }));
    assert_eq!(app.ok("cancel_training", json!({})), "stopping");
    let stopped = app.wait_for(entry["id"].as_str().unwrap(), "stop", |e| e["status"] != "running");
    assert_eq!(stopped["status"], "stopped", "{stopped}");
    assert!(PathBuf::from(stopped["adapter"].as_str().unwrap()).is_file(), "a stopped training keeps its adapter");
    assert!(stopped["steps_done"].as_u64().unwrap() < stopped["steps"].as_u64().unwrap());

    // Two presses: the worker is killed at once, and the window hears why.
    let entry = app.ok("start_training", json!({ "draft": long, "onEvent": CHANNEL }));
    assert_eq!(app.ok("cancel_training", json!({})), "stopping");
    assert_eq!(app.ok("cancel_training", json!({})), "killed");
    let killed = app.wait_for(entry["id"].as_str().unwrap(), "end", |e| e["status"] != "running");
    assert_eq!(killed["status"], "stopped", "{killed}");
    assert!(killed["message"].as_str().unwrap().starts_with("stopped at once"), "{killed}");
}

#[test]
fn first_start_downloads_the_base_model_with_resume_and_then_uses_it() {
    let fake = fake_hub::published();
    let dir = tempfile::tempdir().unwrap();
    let hub = Hub { endpoint: fake.endpoint().into(), token: None, offline: false, cache: dir.path().join("hub") };
    let launch =
        Launch { dataset: Some(repo("examples/smart_home.jsonl")), checkpoint: None, tokenizer: None, preset: None };
    let app = App::open_with(dir.path(), launch.clone(), hub.clone());
    let startup = app.ok("startup", json!({}));
    assert!(startup["preferences"]["checkpoint"].is_null(), "no base model yet: {startup}");

    // Both generations are offered, Needle 3 first and chosen, each with the size the hub announces.
    let checkpoint = std::fs::read(repo("tests/fixtures/models/pretrained.pkl")).unwrap();
    let needle3 = std::fs::read(repo("tests/fixtures/models/needle3_tiny.safetensors")).unwrap();
    let tokenizer = std::fs::read(repo("tests/fixtures/models/tokenizer.model")).unwrap();
    let status = app.ok("base_model", json!({}));
    assert_eq!(status["chosen"], "Needle3", "{status}");
    let offered: Vec<&Value> = status["models"].as_array().unwrap().iter().map(|m| &m["generation"]).collect();
    assert_eq!(offered, [&json!("Needle3"), &json!("Needle2")], "{status}");
    let n2 = offer(&status, "Needle2");
    assert!(n2["cached"].is_null(), "{status}");
    assert_eq!(n2["bytes"].as_u64(), Some((checkpoint.len() + tokenizer.len()) as u64), "{status}");
    assert_eq!(n2["partial_bytes"], 0);
    assert_eq!(offer(&status, "Needle3")["bytes"].as_u64(), Some((needle3.len() + tokenizer.len()) as u64));
    assert_eq!(app.ok("cancel_download", json!({})), "idle");
    let not_here = app.error("use_base_model", json!({ "generation": "Needle2" }));
    assert!(not_here.contains("Needle 2 is not on this computer"), "{not_here}");

    // A transfer cut half-way fails with the reason and keeps what arrived.
    let download = |generation: &str| json!({ "generation": generation, "onEvent": CHANNEL });
    let half = checkpoint.len() as u64 / 2;
    fake.set_faults(Faults { cut_at: Some(half), ..Faults::default() });
    app.ok("download_base_model", download("Needle2"));
    let cut = wait_for_download(&app, "Needle2");
    assert_eq!(cut["download"]["state"], "failed", "{cut}");
    assert!(cut["download"]["message"].as_str().unwrap().contains("resume"), "{cut}");
    assert_eq!(cut["partial_bytes"].as_u64(), Some(half), "{cut}");

    // Cancel stops a slow transfer and keeps what arrived too; one download at a time.
    fake.set_faults(Faults { bytes_per_s: Some(100_000), ..Faults::default() });
    app.ok("download_base_model", download("Needle2"));
    let again = app.error("download_base_model", download("Needle3"));
    assert!(again.contains("Needle 2 is already downloading"), "{again}");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(app.ok("cancel_download", json!({})), "stopping");
    let cancelled = wait_for_download(&app, "Needle2");
    assert_eq!(cancelled["download"]["state"], "cancelled", "{cancelled}");
    let kept = cancelled["partial_bytes"].as_u64().unwrap();
    assert!(kept > half && kept < checkpoint.len() as u64, "{cancelled}");

    // The next one resumes, lands in the cache and becomes the app's base model.
    fake.set_faults(Faults::default());
    app.ok("download_base_model", download("Needle2"));
    let done = wait_for_download(&app, "Needle2");
    assert_eq!(done["download"]["state"], "done", "{done}");
    let cached = PathBuf::from(done["cached"]["checkpoint"].as_str().unwrap());
    assert_eq!(std::fs::read(&cached).unwrap(), checkpoint);
    assert_eq!(std::fs::read(done["cached"]["tokenizer"].as_str().unwrap()).unwrap(), tokenizer);
    assert_eq!(done["bytes"].as_u64(), Some((checkpoint.len() + tokenizer.len()) as u64), "the size on disk");
    assert!(fake.seen().iter().any(|seen| seen.range == Some(format!("bytes={kept}-"))), "resumed with a Range");
    assert_eq!(app.ok("startup", json!({}))["preferences"]["checkpoint"], json!(cached));
    assert_eq!(app.ok("base_model", json!({}))["chosen"], "Needle2");

    // Needle 3 from its own repository; Use goes back to Needle 2 and is remembered.
    app.ok("download_base_model", download("Needle3"));
    let n3 = wait_for_download(&app, "Needle3");
    let cached3 = PathBuf::from(n3["cached"]["checkpoint"].as_str().unwrap());
    assert_eq!(std::fs::read(&cached3).unwrap(), needle3, "{n3}");
    assert_eq!(app.ok("startup", json!({}))["preferences"]["checkpoint"], json!(cached3));
    let used = app.ok("use_base_model", json!({ "generation": "Needle2" }));
    assert_eq!(used["checkpoint"], json!(cached));
    let settings = app.ok("startup", json!({}))["preferences"].clone();
    assert_eq!((&settings["checkpoint"], &settings["generation"]), (&json!(cached), &json!("Needle2")));
    // The window's own save keeps the choice, which is not one of its fields.
    let from_window = json!({ "checkpoint": cached, "tokenizer": null, "device": "auto", "preset": "quick" });
    app.ok("save_preferences", json!({ "preferences": from_window }));
    assert_eq!(app.ok("base_model", json!({}))["chosen"], "Needle2");

    // Next launch, offline and with no settings: the default choice, Needle 3, is found in the cache
    // with no network call, and both are offered with their sizes on disk.
    let asked = fake.seen().len();
    std::fs::remove_file(dir.path().join("settings.json")).unwrap();
    let offline = App::open_with(dir.path(), launch.clone(), Hub { offline: true, ..hub.clone() });
    assert_eq!(offline.ok("startup", json!({}))["preferences"]["checkpoint"], json!(cached3));
    let status = offline.ok("base_model", json!({}));
    assert_eq!(offer(&status, "Needle2")["cached"]["checkpoint"], json!(cached));
    assert!(status["models"].as_array().unwrap().iter().all(|m| m["bytes"].as_u64().is_some()), "{status}");
    assert_eq!(fake.seen().len(), asked);

    // Offline with nothing cached: the sizes are unknown, the panel is told it is offline, and the
    // details say why.
    let empty = tempfile::tempdir().unwrap();
    let hub = Hub { offline: true, cache: empty.path().join("hub"), ..hub };
    let status = App::open_with(empty.path(), launch.clone(), hub.clone()).ok("base_model", json!({}));
    for model in status["models"].as_array().unwrap() {
        let trouble = &model["trouble"];
        assert!(model["bytes"].is_null() && trouble["offline"] == true, "{status}");
        assert!(trouble["details"].as_str().unwrap().contains("HF_HUB_OFFLINE"), "{status}");
    }
    // A hub that cannot be reached is offline too; one that answers wrongly is not.
    let unreachable = Hub { offline: false, endpoint: "http://127.0.0.1:9".into(), ..hub.clone() };
    let status = App::open_with(empty.path(), launch.clone(), unreachable).ok("base_model", json!({}));
    assert!(status["models"].as_array().unwrap().iter().all(|m| m["trouble"]["offline"] == true), "{status}");
    fake.set_faults(Faults { token: Some("not sent".into()), ..Faults::default() });
    let refusing = Hub { offline: false, ..hub };
    let status = App::open_with(empty.path(), launch, refusing).ok("base_model", json!({}));
    for model in status["models"].as_array().unwrap() {
        let trouble = &model["trouble"];
        assert!(trouble["offline"] == false && trouble["details"].as_str().unwrap().contains("HTTP 401"), "{status}");
    }
    fake.set_faults(Faults::default());
}

/// The offer of `generation` in a `base_model` status.
fn offer<'a>(status: &'a Value, generation: &str) -> &'a Value {
    let models = status["models"].as_array().expect("models");
    models.iter().find(|m| m["generation"] == generation).unwrap_or_else(|| panic!("no {generation} in {status}"))
}

/// Polls `base_model` until `generation`'s download is no longer running; returns its offer.
fn wait_for_download(app: &App, generation: &str) -> Value {
    let start = Instant::now();
    loop {
        let status = app.ok("base_model", json!({}));
        let offer = offer(&status, generation);
        if offer["download"]["state"] != "running" {
            return offer.clone();
        }
        assert!(start.elapsed() < TRAINING_TIMEOUT, "the download did not end: {status}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn closing_the_app_stops_its_worker_and_resume_finishes_the_training() {
    let dir = tempfile::tempdir().unwrap();
    let app = App::open(dir.path());
    let entry = app.ok("start_training", json!({ "draft": draft(json!({ "epochs": 30 })), "onEvent": CHANNEL }));
    let id = entry["id"].as_str().unwrap().to_string();
    // Once the first epoch has saved its state, close the window mid-training.
    app.wait_for(&id, "save a first epoch", |e| !e["adapter"].is_null());
    app.close();

    // The worker was asked to stop, saved what it learned and is gone; the record says so.
    let adapter = dir.path().join("trainings").join(&id).join("adapter.pkl");
    #[cfg(target_os = "linux")]
    assert!(!worker_running(&adapter), "the worker outlived the app");
    let app = App::open(dir.path());
    let listed = app.wait_for(&id, "be listed", |_| true);
    assert_eq!(listed["status"], "interrupted", "{listed}");
    assert!(listed["message"].as_str().unwrap().contains("when the app closed"), "{listed}");
    assert_eq!(listed["resumable"], true, "{listed}");
    let (stopped_at, steps) = (listed["steps_done"].as_u64().unwrap(), listed["steps"].as_u64().unwrap());
    assert!(0 < stopped_at && stopped_at < steps, "{listed}");
    assert!(adapter.is_file());

    // Resume continues the same training from its saved state to the end.
    let resumed = app.ok("resume_training", json!({ "id": id, "onEvent": CHANNEL }));
    assert_eq!(resumed["status"], "running");
    let done = app.wait_for(&id, "finish", |e| e["status"] != "running");
    assert_eq!(done["status"], "finished", "{done}");
    assert_eq!(done["steps_done"].as_u64(), Some(steps), "{done}");
    assert_eq!(done["resumable"], false);
    let again = app.error("resume_training", json!({ "id": id, "onEvent": CHANNEL }));
    assert!(again.contains("finished"), "{again}");
}

/// Whether a process whose command line names `adapter` (the training's worker) is still alive.
#[cfg(target_os = "linux")]
fn worker_running(adapter: &Path) -> bool {
    let needle = adapter.to_string_lossy().into_owned();
    std::fs::read_dir("/proc").unwrap().filter_map(Result::ok).any(|process| {
        let cmdline = std::fs::read(process.path().join("cmdline")).unwrap_or_default();
        String::from_utf8_lossy(&cmdline).split('\0').any(|arg| arg == needle)
    })
}

#[test]
fn a_newer_dataset_report_ends_the_older_one_in_its_worker() {
    let dir = tempfile::tempdir().unwrap();
    let app = App::open(dir.path());
    // One 30 MB line: seconds of tokenizing, in the worker, never in the window's process.
    let huge = dir.path().join("huge.jsonl");
    std::fs::write(&huge, format!("{{\"query\": \"{}\"}}\n", "turn on the lights ".repeat(1_500_000))).unwrap();
    let tokenizer = repo("tests/fixtures/models/tokenizer.model");
    let studio = app.studio();
    let older = {
        let (huge, tokenizer) = (huge.clone(), tokenizer.clone());
        std::thread::spawn(move || studio.data().report(&huge, Some(&tokenizer), None, &json!(512)))
    };
    std::thread::sleep(Duration::from_millis(500));
    let report = app.ok(
        "load_dataset",
        json!({ "path": repo("examples/smart_home.jsonl"), "tokenizer": tokenizer, "maxLen": 512 }),
    );
    assert!(report["usable_examples"].as_u64().unwrap() > 0, "{report}");
    assert_eq!(older.join().unwrap().unwrap_err(), needle_studio::SUPERSEDED);
}

#[test]
fn the_dataset_report_reads_lines_as_the_checkpoints_generation_does() {
    let dir = tempfile::tempdir().unwrap();
    let app = App::open(dir.path());
    let (chat, tokenizer) =
        (repo("tests/fixtures/data/needle3_chat.jsonl"), repo("tests/fixtures/models/tokenizer.model"));
    let report = |checkpoint: &str| {
        let args = json!({ "path": chat, "tokenizer": tokenizer, "checkpoint": repo(checkpoint), "maxLen": 1024 });
        app.ok("load_dataset", args)["usable_examples"].as_u64().unwrap()
    };
    // Chat-format lines are Needle 3's; Needle 2 reads only the plain ones.
    let (needle3, needle2) =
        (report("tests/fixtures/models/needle3_tiny.safetensors"), report("tests/fixtures/models/tiny_f32.pkl"));
    assert!(needle3 > 0 && needle2 < needle3, "Needle 3 read {needle3} examples, Needle 2 {needle2}");
}

// ---------- Generate more examples, against an OpenAI-compatible endpoint on loopback ----------

/// A row the example's tools accept, its values in its query.
fn thermostat(room: &str, celsius: u32) -> Value {
    json!({"query": format!("Set the {room} to {celsius} degrees"), "reasoning": "room and degrees from the query",
           "answers": [{"name": "set_thermostat", "arguments": {"room": room, "celsius": celsius}}]})
}

fn reply(rows: &[Value]) -> Answer {
    Answer::Reply(Value::Array(rows.to_vec()).to_string())
}

/// An app whose keys are only those typed in the test, with a copy of the example in `dir` (so
/// that the default output lands there too).
fn generating_app(dir: &Path) -> (App, PathBuf) {
    let app = App::open(&dir.join("data"));
    app.studio().isolate_keys();
    let dataset = dir.join("smart_home.jsonl");
    std::fs::copy(repo("examples/smart_home.jsonl"), &dataset).unwrap();
    (app, dataset)
}

fn generate(app: &App, llm: &FakeLlm, dataset: &Path, count: u32) {
    let request = json!({"dataset": dataset, "output": "", "count": count.to_string(), "model": "stub/model",
                         "endpoint": llm.url()});
    app.ok("generate_examples", json!({ "request": request, "onEvent": CHANNEL }));
}

/// Polls the generation until `done` says so; its state.
fn wait_for_generation(app: &App, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    poll(&format!("the generation to {what}"), || app.ok("generate_setup", json!({}))["state"].clone(), done)
}

/// Polls `state` until `done` says so; that state.
fn poll(what: &str, state: impl Fn() -> Value, done: impl Fn(&Value) -> bool) -> Value {
    let start = Instant::now();
    loop {
        let now = state();
        if done(&now) {
            return now;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "timed out waiting for {what}: {now}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn lines_of(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path).unwrap().lines().map(str::to_owned).collect()
}

#[test]
fn generate_writes_new_rows_after_the_dataset_with_the_typed_key_in_the_workers_environment() {
    let dir = tempfile::tempdir().unwrap();
    let (app, dataset) = generating_app(dir.path());
    let llm = FakeLlm::start(
        [reply(&[thermostat("office", 20), thermostat("garage", 12)]), reply(&[thermostat("attic", 15)])],
        reply(&[thermostat("hallway", 19), thermostat("study", 22)]),
    );
    llm.require_key("sk-typed");
    let setup = app.ok("generate_setup", json!({}));
    assert_eq!((setup["key"]["source"].as_str(), setup["state"]["state"].as_str()), (Some("none"), Some("idle")));
    assert_eq!(setup["model"], "deepseek/deepseek-v4-flash");
    let kept = app.ok("remember_key", json!({ "name": "generate_key", "key": " sk-typed " }));
    assert_eq!(kept["source"], "session", "no keychain in the tests' app: {kept}");

    generate(&app, &llm, &dataset, 4);
    let finished = wait_for_generation(&app, "finish", |state| state["state"] != "running");
    assert_eq!((finished["state"].as_str(), &finished["suite"]), (Some("written"), &Value::Null), "{finished}");
    let written = &finished["data"];
    assert_eq!((written["generated"].as_u64(), written["cancelled"].as_bool()), (Some(4), Some(false)));
    let output = dir.path().join("smart_home.augmented.jsonl");
    assert_eq!(written["path"], json!(output), "beside the dataset, as --augment names it");
    let (originals, lines) = (lines_of(&dataset), lines_of(&output));
    assert_eq!(lines.len(), originals.len() + 4);
    assert_eq!(lines[..originals.len()], originals[..]);
    // Two requests in flight: the replies arrive in either order, the first four rows are kept.
    let shown: Vec<&str> = written["rows"].as_array().unwrap().iter().map(|r| r["query"].as_str().unwrap()).collect();
    assert!(shown.len() == 4 && shown.iter().all(|query| query.starts_with("Set the ")), "{shown:?}");
    assert_eq!(lines[originals.len()..].iter().filter(|line| line.contains("Set the")).count(), 4);

    let seen = llm.seen();
    assert!(seen.iter().all(|request| request.authorization.as_deref() == Some("Bearer sk-typed")));
    assert_eq!(seen[0].body["model"], "stub/model");
    // The key is in no file of the app's.
    for entry in walk(&dir.path().join("data")) {
        let text = std::fs::read(&entry).unwrap();
        assert!(!String::from_utf8_lossy(&text).contains("sk-typed"), "{} holds the key", entry.display());
    }

    // A new row's line, as the doctor's line buttons show it.
    let line = app.ok("dataset_line", json!({ "path": output, "line": originals.len() + 1 }));
    assert!(line.as_str().unwrap().contains("\"query\": \"Set the "), "{line}");
    let past = app.error("dataset_line", json!({ "path": output, "line": lines.len() + 1 }));
    assert!(past.contains(&format!("has no line {}", lines.len() + 1)), "{past}");
    // The doctor's findings come with the report.
    let tokenizer = repo("tests/fixtures/models/tokenizer.model");
    let report = app.ok("load_dataset", json!({ "path": output, "tokenizer": tokenizer, "maxLen": 512 }));
    assert_eq!(report["doctor"]["rows"], lines.len(), "{report}");
    assert!(report["doctor"]["summary"].as_str().is_some_and(|s| !s.is_empty()), "{report}");
}

#[test]
fn a_wrong_key_fails_with_the_endpoints_refusal_and_no_key_names_the_variables() {
    let dir = tempfile::tempdir().unwrap();
    let (app, dataset) = generating_app(dir.path());
    let llm = FakeLlm::start([], reply(&[thermostat("office", 20)]));
    llm.require_key("sk-right");
    app.ok("remember_key", json!({ "name": "generate_key", "key": "sk-wrong" }));
    generate(&app, &llm, &dataset, 2);
    let failed = wait_for_generation(&app, "fail", |state| state["state"] != "running");
    assert_eq!(failed["state"], "failed", "{failed}");
    let message = failed["message"].as_str().unwrap();
    assert!(message.contains("refused the key") && message.contains("OPENROUTER_API_KEY"), "{message}");
    assert!(!dir.path().join("smart_home.augmented.jsonl").exists());

    // Forgotten, and OpenRouter's own endpoint: the worker says which variables to set.
    assert_eq!(app.ok("forget_key", json!({ "name": "generate_key" }))["source"], "none");
    let request = json!({"dataset": dataset, "output": "", "count": "2", "model": "", "endpoint": ""});
    app.ok("generate_examples", json!({ "request": request, "onEvent": CHANNEL }));
    let failed = wait_for_generation(&app, "fail", |state| state["state"] != "running");
    let message = failed["message"].as_str().unwrap_or_default();
    assert!(message.contains("no API key") && message.contains("OPENROUTER_API_KEY"), "{failed}");
    let typed = app.error("remember_key", json!({ "name": "generate_key", "key": "  " }));
    assert!(typed.contains("type the key"), "{typed}");
    let count = app.error(
        "generate_examples",
        json!({ "request": {"dataset": dataset, "output": "", "count": "0", "model": "", "endpoint": ""},
                "onEvent": CHANNEL }),
    );
    assert!(count.starts_with("Count:"), "{count}");
}

#[test]
fn a_no_call_share_is_kept_to_and_a_share_outside_zero_to_one_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (app, dataset) = generating_app(dir.path());
    let held_back = json!({"query": "Don't heat the office", "answers": []});
    let llm = FakeLlm::start([], reply(&[thermostat("office", 20), thermostat("garage", 12), held_back]));
    let request = json!({"dataset": dataset, "output": "", "count": "2", "model": "stub/model",
                         "endpoint": llm.url(), "negative_share": "0.5"});
    app.ok("generate_examples", json!({ "request": request, "onEvent": CHANNEL }));
    let written = wait_for_generation(&app, "finish", |state| state["state"] != "running");
    let generated = written["data"]["generated"].as_u64();
    assert_eq!((written["state"].as_str(), generated), (Some("written"), Some(2)), "{written}");
    let prompt = llm.seen()[0].body["messages"][1]["content"].as_str().unwrap().to_owned();
    assert!(prompt.contains("Of the 2 examples, write 1 that must get no call"), "{prompt}");
    let (originals, lines) = (lines_of(&dataset), lines_of(&dir.path().join("smart_home.augmented.jsonl")));
    let new: Vec<Value> = lines[originals.len()..].iter().map(|line| serde_json::from_str(line).unwrap()).collect();
    let held: Vec<&Value> = new.iter().filter(|row| row["answers"] == json!([])).collect();
    assert_eq!((new.len(), held.len()), (2, 1), "one row of each: the second thermostat row is past its share");

    let refused = app.error(
        "generate_examples",
        json!({ "request": {"dataset": dataset, "output": "", "count": "2", "model": "", "endpoint": "",
                            "negative_share": "1.5"}, "onEvent": CHANNEL }),
    );
    assert!(refused.starts_with("No-call share:"), "{refused}");
}

#[test]
fn cancel_keeps_the_rows_that_arrived_and_writes_them() {
    let dir = tempfile::tempdir().unwrap();
    let (app, dataset) = generating_app(dir.path());
    let llm = FakeLlm::start(
        [reply(&[thermostat("office", 20), thermostat("garage", 12)])],
        Answer::Stall(Duration::from_secs(60)),
    );
    assert_eq!(app.ok("cancel_generation", json!({})), "idle");
    let output = dir.path().join("more.jsonl");
    let request = json!({"dataset": dataset, "output": dir.path().join("more"), "count": "10", "model": "", "endpoint": llm.url()});
    app.ok("generate_examples", json!({ "request": request, "onEvent": CHANNEL }));
    wait_for_generation(&app, "keep two rows", |state| state["generated"] == 2);
    let again = app.error("generate_examples", json!({ "request": request, "onEvent": CHANNEL }));
    assert!(again.contains("already being generated"), "{again}");
    assert_eq!(app.ok("cancel_generation", json!({})), "stopping");
    let finished = wait_for_generation(&app, "write what arrived", |state| state["state"] != "running");
    assert_eq!(finished["state"], "written", "{finished}");
    let written = &finished["data"];
    assert_eq!((written["generated"].as_u64(), written["cancelled"].as_bool()), (Some(2), Some(true)));
    assert_eq!(written["path"], json!(output), "a .jsonl, as the output is always named");
    assert_eq!(lines_of(&output).len(), lines_of(&dataset).len() + 2);
}

/// A suite case as the LLM writes it: its query, category and expected calls.
fn case(query: &str, category: &str, calls: Value) -> Value {
    json!({"query": query, "category": category, "calls": calls})
}

/// A reply with a 3-case suite for the example's tools (which bound no value, so no invalid case is asked
/// for): two positive cases and a missing one, as upstream's proportions give 3.
fn suite_reply() -> Answer {
    let warm =
        |room: &str, celsius: u32| json!([{"name": "set_thermostat", "arguments": {"room": room, "celsius": celsius}}]);
    reply(&[
        case("Warm the den up to 23 degrees", "positive", warm("den", 23)),
        case("Could the cellar sit at 16 degrees", "positive", warm("cellar", 16)),
        case("Change the thermostat in the den", "missing", json!([])),
    ])
}

#[test]
fn a_suite_follows_the_rows_when_asked_and_alone_with_no_rows() {
    let dir = tempfile::tempdir().unwrap();
    let (app, dataset) = generating_app(dir.path());
    let llm = FakeLlm::start(
        [reply(&[thermostat("office", 20), thermostat("garage", 12)]), suite_reply(), suite_reply()],
        Answer::Status { status: 500, retry_now: true },
    );
    let request = |count: &str, suite_path: &str| {
        json!({"dataset": dataset, "output": "", "count": count, "model": "stub/model", "endpoint": llm.url(),
               "suite": true, "suite_path": suite_path, "suite_cases": "3"})
    };
    assert_eq!(app.ok("generate_setup", json!({}))["suite_cases"], 32, "upstream's size");
    app.ok("generate_examples", json!({ "request": request("2", ""), "onEvent": CHANNEL }));
    let finished = wait_for_generation(&app, "finish", |state| state["state"] != "running");
    assert_eq!((finished["state"].as_str(), finished["data"]["generated"].as_u64()), (Some("written"), Some(2)));
    let suite = &finished["suite"];
    let beside = dir.path().join("smart_home.augmented.suite.json");
    assert_eq!(suite["path"], json!(beside), "beside the rows' file: {finished}");
    assert_eq!(suite["cases"], 3);
    let wanted = json!({"positive": 2, "missing": 1, "irrelevant": 0, "negation": 0, "parallel": 0});
    assert_eq!((&suite["wanted"], &suite["written"]), (&wanted, &json!({"positive": 2, "missing": 1})));
    assert_eq!(finished["suite_failed"], Value::Null);
    let written = needle_engine::suite::Suite::load(&beside).expect("a suite `needle suite` reads");
    assert_eq!(written.cases.len(), 3);
    let suite_asked = llm.seen()[1].body["messages"][1]["content"].as_str().unwrap().to_owned();
    assert!(suite_asked.contains("- 2 positive: ") && suite_asked.contains("- 1 missing: "), "{suite_asked}");

    // No rows: the suite alone, to the file chosen (always a .json); the rows' file is left as it was.
    let rows_before = lines_of(&dir.path().join("smart_home.augmented.jsonl"));
    let chosen = dir.path().join("home");
    app.ok("generate_examples", json!({ "request": request("0", &chosen.to_string_lossy()), "onEvent": CHANNEL }));
    let alone = wait_for_generation(&app, "finish", |state| state["state"] != "running");
    assert_eq!((alone["state"].as_str(), &alone["data"]), (Some("written"), &Value::Null), "{alone}");
    assert_eq!(alone["suite"]["path"], json!(dir.path().join("home.json")));
    assert_eq!(lines_of(&dir.path().join("smart_home.augmented.jsonl")), rows_before);
    assert_eq!(llm.seen().len(), 3, "no request for rows");

    let refused = app.error(
        "generate_examples",
        json!({ "request": {"dataset": dataset, "output": "", "count": "2", "model": "", "endpoint": "",
                            "suite": true, "suite_cases": "0"}, "onEvent": CHANNEL }),
    );
    assert!(refused.starts_with("Suite cases:"), "{refused}");
}

/// Every file under `dir`.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            files.extend(walk(&path));
        } else {
            files.push(path);
        }
    }
    files
}

// ---------- the keychain, for real: a Secret Service (gnome-keyring) on a session bus of the test's own ----------

/// What a process of the keychain test does: type the token, or read it back (see below).
const KEYCHAIN_ROLE: &str = "NEEDLE_TEST_KEYCHAIN_ROLE";
const KEYCHAIN_DATA: &str = "NEEDLE_TEST_KEYCHAIN_DATA";
const TYPED_TOKEN: &str = "hf_typed_into_the_keychain";

/// A process of the test's own, ended with it.
struct Started(std::process::Child);

/// What to say when a program of the session-bus tests cannot start.
#[cfg(target_os = "linux")]
fn missing(program: &str, error: std::io::Error) -> ! {
    panic!("cannot start {program} ({error}): scripts/setup.sh --test installs it (Debian: dbus, gnome-keyring)")
}

/// A session bus of the test's own (`dbus-daemon`), and its address.
#[cfg(target_os = "linux")]
fn session_bus() -> (Started, String) {
    use std::io::BufRead;
    let mut bus = std::process::Command::new("dbus-daemon")
        .args(["--session", "--nofork", "--print-address=1"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| missing("dbus-daemon", e));
    let mut address = String::new();
    std::io::BufReader::new(bus.stdout.take().unwrap()).read_line(&mut address).unwrap();
    (Started(bus), address.trim().to_string())
}

impl Drop for Started {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A token typed in one app process is kept in the system's keychain, read back by a second app
/// process, forgotten there, and never written to a file of the app's. The test starts its own session
/// bus and Secret Service (`dbus-daemon`, `gnome-keyring-daemon`: `scripts/setup.sh --test`), and runs
/// each app process as this test again, told its part by `NEEDLE_TEST_KEYCHAIN_ROLE`.
#[cfg(target_os = "linux")]
#[test]
fn a_token_typed_in_one_app_process_is_read_from_the_keychain_by_the_next() {
    if let Ok(role) = std::env::var(KEYCHAIN_ROLE) {
        return keychain_role(&role, Path::new(&std::env::var(KEYCHAIN_DATA).expect("the data folder")));
    }
    use std::io::Write;
    use std::process::{Command, Stdio};
    let dir = tempfile::tempdir().unwrap();
    let (_bus, address) = session_bus();
    let runtime = dir.path().join("run");
    std::fs::create_dir_all(&runtime).unwrap();
    std::fs::set_permissions(&runtime, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    // Its keyrings under the test's folder, the login keyring made and unlocked with the password on stdin.
    let mut keyring = Command::new("gnome-keyring-daemon")
        .args(["--foreground", "--unlock", "--components=secrets"])
        .env("DBUS_SESSION_BUS_ADDRESS", &address)
        .env("HOME", dir.path())
        .env("XDG_DATA_HOME", dir.path().join("share"))
        .env("XDG_RUNTIME_DIR", &runtime)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| missing("gnome-keyring-daemon", e));
    drop(keyring.stdin.take().map(|mut stdin| stdin.write_all(b"needle-test")));
    let _keyring = Started(keyring);
    let serving = || {
        let asked = Command::new("dbus-send")
            .args(["--session", "--print-reply", "--dest=org.freedesktop.DBus", "/org/freedesktop/DBus"])
            .args(["org.freedesktop.DBus.NameHasOwner", "string:org.freedesktop.secrets"])
            .env("DBUS_SESSION_BUS_ADDRESS", &address)
            .output();
        asked.is_ok_and(|out| String::from_utf8_lossy(&out.stdout).contains("boolean true"))
    };
    poll("the Secret Service on the test's bus", || json!(serving()), |up| up == &json!(true));

    let data = dir.path().join("app");
    for role in ["type", "read"] {
        let run = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "a_token_typed_in_one_app_process_is_read_from_the_keychain_by_the_next", "--nocapture"])
            .env(KEYCHAIN_ROLE, role)
            .env(KEYCHAIN_DATA, &data)
            .env("DBUS_SESSION_BUS_ADDRESS", &address)
            .env_remove("HF_TOKEN")
            .output()
            .unwrap();
        let said = format!("{}{}", String::from_utf8_lossy(&run.stdout), String::from_utf8_lossy(&run.stderr));
        assert!(run.status.success() && said.contains("1 passed"), "the {role} process failed:\n{said}");
    }
    for file in walk(&data) {
        let text = std::fs::read(&file).unwrap();
        assert!(!String::from_utf8_lossy(&text).contains(TYPED_TOKEN), "{} holds the token", file.display());
    }
}

/// One app process of the keychain test: `type` keeps the token, `read` finds it kept and forgets it.
#[cfg(target_os = "linux")]
fn keychain_role(role: &str, data: &Path) {
    let app = App::open(data);
    match role {
        "type" => {
            let kept = app.ok("remember_key", json!({ "name": "hub_token", "key": TYPED_TOKEN }));
            assert_eq!(kept["source"], "keychain", "the keychain did not take the token: {kept}");
        }
        "read" => {
            assert_eq!(app.ok("publish_setup", json!({}))["token"]["source"], "keychain", "not read back");
            assert_eq!(app.ok("forget_key", json!({ "name": "hub_token" }))["source"], "none");
            assert_eq!(App::open(data).ok("publish_setup", json!({}))["token"]["source"], "none", "not forgotten");
        }
        other => panic!("no keychain role {other}"),
    }
}

// ---------- the notification at a training's end, on a session bus of the test's own ----------

/// The app process of the notification test, and its data folder.
const NOTIFY_DATA: &str = "NEEDLE_TEST_NOTIFY_DATA";
/// Written in that folder once the notification is seen: the app process may end.
const NOTIFIED: &str = "notified";

/// A training that ends tells the desktop, on the session bus, as `org.freedesktop.Notifications`'
/// `Notify`: title, and a body that names the dataset and the outcome. `dbus-monitor` stands in for the
/// desktop's notification server and shows the call as it crosses the test's own bus. The preferences
/// file lowers the threshold (`notify_after_s`, 30 s unless it says otherwise) to 0, so the tiny
/// training counts; the app process is this test again, told its part by `NEEDLE_TEST_NOTIFY_DATA`.
#[cfg(target_os = "linux")]
#[test]
fn a_training_that_ends_notifies_the_desktop_on_the_session_bus() {
    if let Ok(data) = std::env::var(NOTIFY_DATA) {
        return notifying_app(Path::new(&data));
    }
    use std::io::BufRead;
    use std::process::{Command, Stdio};
    let dir = tempfile::tempdir().unwrap();
    let (_bus, address) = session_bus();
    let calls = "type='method_call',interface='org.freedesktop.Notifications',member='Notify'";
    let mut monitor = Command::new("dbus-monitor")
        .args(["--address", &address, calls])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| missing("dbus-monitor", e));
    let (heard, lines) = std::sync::mpsc::channel();
    let printed = std::io::BufReader::new(monitor.stdout.take().unwrap());
    std::thread::spawn(move || printed.lines().map_while(Result::ok).try_for_each(|line| heard.send(line)));
    let _monitor = Started(monitor);
    // The monitor's first words (the bus naming it) say it is listening.
    lines.recv_timeout(Duration::from_secs(10)).expect("dbus-monitor did not start listening");

    let data = dir.path().join("app");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("settings.json"), r#"{"notify_after_s": 0}"#).unwrap();
    let app = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "a_training_that_ends_notifies_the_desktop_on_the_session_bus", "--nocapture"])
        .env(NOTIFY_DATA, &data)
        .env("DBUS_SESSION_BUS_ADDRESS", &address)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The Notify call, its strings in order: app name, icon, title, body.
    let start = Instant::now();
    let mut strings: Option<Vec<String>> = None;
    while let Ok(line) = lines.recv_timeout(TRAINING_TIMEOUT.saturating_sub(start.elapsed())) {
        let line = line.trim();
        match &mut strings {
            None if line.starts_with("method call") && line.contains("member=Notify") => strings = Some(Vec::new()),
            Some(seen) if line.starts_with("string ") => seen.push(line["string ".len()..].trim_matches('"').into()),
            Some(seen) if seen.len() >= 4 => break,
            _ => {}
        }
    }
    std::fs::write(data.join(NOTIFIED), "").unwrap();
    let said = app.wait_with_output().unwrap();
    let out = format!("{}{}", String::from_utf8_lossy(&said.stdout), String::from_utf8_lossy(&said.stderr));
    assert!(said.status.success() && out.contains("1 passed"), "the app process failed:\n{out}");
    let strings = strings.unwrap_or_else(|| panic!("no notification crossed the bus; the app said:\n{out}"));
    assert_eq!(strings.get(2).map(String::as_str), Some("Needle Studio"), "{strings:?}");
    let body = strings.get(3).map_or("", String::as_str);
    assert!(body.starts_with("Fine-tuning on smart_home.jsonl finished: final loss"), "{strings:?}");
}

/// The app process of the notification test: one short training, then waits to be told the
/// notification was seen (or gives up after the training timeout).
#[cfg(target_os = "linux")]
fn notifying_app(data: &Path) {
    let app = App::open(data);
    let entry = app.ok("start_training", json!({ "draft": draft(json!({})), "onEvent": CHANNEL }));
    let done = app.wait_for(entry["id"].as_str().unwrap(), "end", |e| e["status"] != "running");
    assert_eq!(done["status"], "finished", "{done}");
    let start = Instant::now();
    while !data.join(NOTIFIED).exists() && start.elapsed() < TRAINING_TIMEOUT {
        std::thread::sleep(Duration::from_millis(100));
    }
}
