//! The desktop app end to end, in a real webview: Needle Studio under Xvfb, driven through
//! `tauri-driver` and WebKitWebDriver as a newcomer's first start with `scripts/studio.sh` (its own
//! launch arguments: the bundled demo base and dataset, the Quick preset) — see both base models offered
//! with their sizes, drop the dataset, read its report, start the Quick training, watch it finish and draw
//! its loss chart, check that the tuned model calls the app's tools far better than its base (the
//! first training's promise), with a chart per tool of the answers by kind, and that Try answers the
//! example's question right, build a `.cact` and check the file and the tuned model's three rows (float,
//! quantization simulated, the file) with their gaps in words and the wrong answers grouped by kind,
//! see the reliability of base, tuned and file, pick a confidence threshold and find it in the JSON
//! beside the file and in History, run an acceptance suite on the three models at that threshold and
//! see each one's PASS or FAIL, cancel a publish mid-upload and see the hub as it was, then publish it to a model repository on the
//! hub (a loopback one); then download Needle 2 and
//! Needle 3 from the hub, tune Needle 3 with a short training, ask it in Try and build its `.cact` (format v3); then
//! generate more examples from an OpenAI-compatible endpoint on loopback, with progress, and an acceptance
//! suite for the same tools, which Evaluate's Acceptance section is offered, and open a doctor's finding's
//! line.
//!
//! Needs `Xvfb`, `WebKitWebDriver` (Debian: `xvfb`, `webkit2gtk-driver`) and `tauri-driver`
//! (`cargo install tauri-driver --locked`); `.ci/run` installs them. Without them this test fails and
//! says what to install: it never skips. Screenshots of each stage go to `$NEEDLE_SCREENSHOTS_DIR`
//! (default `target/tmp/app_e2e`); `docs/screenshots/` holds a committed set.

// Linux only: Xvfb and WebKitWebDriver, which tauri-driver drives, exist only there (macOS has no
// WebDriver for WKWebView; Windows' msedgedriver is not set up here), so elsewhere this test is not built.
#![cfg(target_os = "linux")]

use std::future::Future;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::elements::Element;
use fantoccini::{Client, ClientBuilder, Locator};
use needle_engine::cact::CactFile;
use needle_engine::dataset::Dataset;
use needle_engine::generation::Generation;
use needle_engine::tokenizer::Tokenizer;
use needle_tests::fake_hub::{self, FakeHub, Faults};
use needle_tests::fake_llm::{Answer, FakeLlm};
use needle_tests::read;
use serde_json::{json, Value};

/// What the loopback hub serves as Needle 2's checkpoint.
const CHECKPOINT: &str = "models/pretrained.pkl";
/// What the loopback hub serves as Needle 3's checkpoint.
const NEEDLE3_CHECKPOINT: &str = "models/needle3_tiny.safetensors";
/// The Quick preset's sequence cap, which the report shown after choosing it uses.
const QUICK_MAX_LEN: usize = 512;
/// What the first training must show (issue 25): the tuned model's exact calls on the held-out rows, at
/// least this share and this many points above the base's, on at least this many rows.
const TUNED_AT_LEAST: f64 = 0.6;
const GAIN_AT_LEAST: f64 = 0.4;
const HELD_OUT_AT_LEAST: u64 = 20;
/// A Quick training on the example takes well under a minute; this is a bound for a slow CI machine.
const RUN_TIMEOUT: Duration = Duration::from_secs(600);
const UI_TIMEOUT: Duration = Duration::from_secs(60);
/// The key the app finds in its environment, and the one the loopback endpoint wants.
const LLM_KEY: &str = "sk-e2e";
/// The model repository Publish starts with (`NEEDLE_HF_REPO`), and the token in `HF_TOKEN`.
const PUBLISH_REPO: &str = "e2e/needle-home";
const HUB_TOKEN: &str = "hf_e2e";

#[test]
fn drop_a_dataset_train_and_build_a_cact_in_the_real_app() {
    let tools = Tools::find();
    let app = PathBuf::from(env!("CARGO_BIN_EXE_needle-studio"));
    let scratch = tempfile::tempdir().expect("temp dir");
    let shots = screenshot_dir();
    let display = Xvfb::start(&tools.xvfb);
    let hub = fake_hub::published();
    let llm = FakeLlm::start(generated_replies(), Answer::Status { status: 500, retry_now: true });
    llm.require_key(LLM_KEY);
    let driver = TauriDriver::start(&tools, &display, scratch.path(), &hub);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio runtime");
    runtime.block_on(async {
        let client = connect(&driver, &app, &first_run_args()).await;
        let camera = Camera::attach(&driver, &client, &shots).await.unwrap_or_else(|error| panic!("{error}"));
        let outcome = drive(&client, &camera, &hub, &llm, scratch.path()).await;
        if outcome.is_err() {
            // The whole window as it was when the test gave up.
            if let Err(error) = camera.window("failure").await {
                println!("{error}");
            }
        }
        // Close the session (and with it the app) before reporting, whatever happened.
        let _ = answer("closing the session", client.close()).await;
        outcome.unwrap_or_else(|error| panic!("{error}"));
    });
    println!("screenshots in {}", shots.display());
}

/// The user's path through the window, checked at every stage.
async fn drive(client: &Client, camera: &Camera, hub: &FakeHub, llm: &FakeLlm, scratch: &Path) -> Result<(), String> {
    let ui = Ui { client, camera };

    // Hardware: the badge names the backend the engine picked (CPU on a machine without a GPU).
    // The badge reads "…" until the app's start-up answer arrives.
    let filled =
        "const text = document.getElementById('backend-badge').textContent.trim(); return text !== '…' && text";
    ui.wait("the hardware panel", filled).await?;
    let badge = ui.text("backend-badge").await?;
    if !["CPU", "CUDA", "Metal"].contains(&badge.as_str()) {
        return Err(format!("the backend badge says {badge:?}"));
    }
    // A launch that names a base opens on the Data step; the hardware is in the Model step.
    ui.click("tab-model").await?;
    ui.shot("1-start", "hardware").await?;

    // Base model: the demo base the launch named fills the model fields; both generations are offered
    // with the sizes the hub announces, Needle 3 (the default choice) first.
    let demo_base = "const path = document.getElementById('checkpoint-path').value; \
                     return path.endsWith('examples/demo/needle3/base.safetensors') && document.getElementById('error-checkpoint').textContent === ''";
    ui.wait("the demo base in the model fields", demo_base).await?;
    let sized = "return ['Needle3', 'Needle2'].every((g) => \
                 /MiB/.test(document.getElementById('hub-size-' + g)?.textContent))";
    ui.wait("both base models with their sizes", sized).await?;
    let first = ui
        .eval(
            "return document.querySelector('#hub-models li').dataset.chosen + ' ' + \
                         document.querySelector('#hub-models li strong').textContent",
        )
        .await?;
    if first != "true Needle 3" {
        return Err(format!("the Model step offers first {first:?}, not the chosen Needle 3"));
    }
    ui.shot("base-model-offer", "model").await?;
    ui.click("tab-train").await?;
    ui.click("preset-quick").await?;

    // Dataset: the launch opened the demo's; dropped on the window (the event Tauri sends when a file
    // lands on it), it is read again.
    ui.click("tab-data").await?;
    let dataset = repo("examples/demo/smart_home.jsonl");
    ui.drop_dataset(&dataset).await?;
    let expected = expected_examples(&dataset, &repo("examples/demo/needle3/tokenizer.model"));
    ui.wait_for_text("report-examples", &expected.to_string()).await?;
    ui.shot("2-dataset", "dataset").await?;

    // Train: the plan from the dry run, then Start; the strip under the steps follows the training.
    ui.click("tab-train").await?;
    ui.click("plan-button").await?;
    ui.wait("the plan", "return /Estimated peak memory/.test(document.getElementById('plan').textContent)").await?;
    ui.shot("3-train", "settings").await?;
    ui.click("start-button").await?;
    let status = ui.wait_status("training-status", &["finished", "stopped", "failed"], RUN_TIMEOUT).await?;
    if status != "finished" {
        return Err(format!("the training ended {status}: {}", ui.text("training-status").await?));
    }
    let chart = "const svg = document.querySelector('#loss-chart svg'); return svg ? svg.outerHTML : ''";
    let svg = ui.eval(chart).await?;
    if !(svg.contains("polyline") && svg.contains("train") && svg.contains("validation")) {
        return Err(format!("the loss chart lacks its train and validation lines: {svg:.200}"));
    }
    let progress = ui.text("progress-text").await?;
    ui.shot("4-progress", "progress-section").await?;

    // Evaluate: the held-out examples scored for the base and the tuned model, the tuned one far better.
    ui.click("tab-evaluate").await?;
    let rows = "return String(document.querySelectorAll('#evaluation-rows tr').length)";
    ui.poll("the base and tuned scores", rows, UI_TIMEOUT, |n| n == "2").await?;
    let cells = "return JSON.stringify([...document.querySelectorAll('#evaluation-rows tr')]\
                 .map((r) => [r.children[2].textContent, r.children[3].textContent]))";
    let scores = ui.eval(cells).await?;
    first_training_keeps_its_promise(&scores)?;
    // Why the answers are wrong, per tool: a chart of stacked bars by kind for each tool the examples call.
    let charts = "return String(document.querySelectorAll('#breakdown-charts figure svg rect').length > 0 && \
                  document.querySelectorAll('#breakdown-charts figure').length)";
    let drawn = ui.poll("the charts of answers by kind", charts, UI_TIMEOUT, |n| n != "false" && n != "0").await?;
    let tools = ui.eval("return String(document.querySelectorAll('#breakdown-kinds li').length)").await?;
    if tools == "0" {
        return Err(format!("{drawn} charts of answers by kind, but no legend of the kinds"));
    }

    // Export: build a 4-bit .cact where the test says, then check the file.
    ui.click("tab-export").await?;
    let out = scratch.join("tuned.cact");
    ui.type_path("cact-path", &out).await?;
    ui.click("build-button").await?;
    let built = ui.wait_status("build-status", &["built", "failed"], RUN_TIMEOUT).await?;
    if built != "built" {
        return Err(format!("the build failed: {}", ui.text("build-status").await?));
    }
    let file = CactFile::open(&out).map_err(|e| format!("the built file does not read back: {e}"))?;
    let shown = ui.text("cact-tensors").await?;
    if shown != file.records.len().to_string() {
        return Err(format!("the window says {shown} tensors, the file has {}", file.records.len()));
    }
    ui.shot("5-export", "export").await?;

    // Publish: to the repository NEEDLE_HF_REPO names, with HF_TOKEN's token, on the loopback hub.
    let offered = ui.eval("return document.getElementById('publish-repo').value").await?;
    let token = ui.text("publish-token-source").await?;
    if (offered.as_str(), token.as_str()) != (PUBLISH_REPO, "From HF_TOKEN") {
        return Err(format!("Publish offers repository {offered:?} with the token {token:?}"));
    }
    // Cancelled while the hub takes the bytes (slowly, here): nothing is published, the hub is as it was.
    let size = std::fs::metadata(&out).map_err(|e| format!("{}: {e}", out.display()))?.len();
    hub.set_faults(Faults { bytes_per_s: Some(size / 4 + 1), ..Faults::default() });
    ui.click("publish-button").await?;
    // Under way: the hub's plan arrived, with the file's size.
    ui.wait(
        "the upload under way",
        "return !document.getElementById('publish-cancel').hidden && \
             document.getElementById('publish-progress').max > 1",
    )
    .await?;
    ui.click("publish-cancel").await?;
    let stopped = ui.wait_status("publish-status", &["cancelled", "published", "failed"], UI_TIMEOUT).await?;
    if stopped != "cancelled" {
        return Err(format!("Cancel during Publish ended {stopped}: {}", ui.text("publish-status").await?));
    }
    ui.shot("5-publish-cancelled", "export").await?;
    if hub.has_repo(PUBLISH_REPO) || hub.seen().iter().any(|seen| seen.path.contains("/commit/")) {
        return Err("the cancelled upload left a repository or a commit on the hub".into());
    }
    hub.set_faults(Faults::default());
    ui.click("publish-button").await?;
    let published = ui.wait_status("publish-status", &["published", "failed"], UI_TIMEOUT).await?;
    if published != "published" {
        return Err(format!("Publish failed: {}", ui.text("publish-status").await?));
    }
    let pushed = hub.file(PUBLISH_REPO, "tuned.cact").ok_or("the hub has no tuned.cact after Publish")?;
    if pushed.bytes != std::fs::read(&out).map_err(|e| format!("{}: {e}", out.display()))? {
        return Err("the hub holds other bytes than the built tuned.cact".into());
    }
    let said = ui.text("publish-status").await?;
    if !said.contains(&format!("{}/{PUBLISH_REPO}", hub.endpoint())) {
        return Err(format!("Publish's status does not name the repository's page: {said}"));
    }

    // The tuned model three ways (float, quantization simulated, the built file), the gaps in words;
    // Try asks the base and the tuned model the dataset's first question.
    ui.click("tab-evaluate").await?;
    let quant = "return String(document.querySelectorAll('#quant-rows tr').length)";
    ui.poll("the tuned model's three rows", quant, RUN_TIMEOUT, |n| n == "3").await?;
    let gaps = ui
        .poll("the gaps in words", "return document.getElementById('quant-gaps').textContent", UI_TIMEOUT, |t| {
            t.starts_with("Quantizing the model")
        })
        .await?;
    // The rows each model answered wrong, grouped by kind, expected beside given: as many as its score
    // says (the float row is the tuned model's again, so it is not listed twice).
    let wrong_listed = r#"
        const listed = [...document.querySelectorAll('#evaluation-wrong details')]
            .map((d) => `${d.querySelector('summary').textContent} (${d.querySelectorAll('tbody tr').length} rows)`);
        const quant = [...document.querySelectorAll('#quant-rows tr')].slice(1);
        const missed = [...document.querySelectorAll('#evaluation-rows tr'), ...quant].flatMap((r) => {
            const [exact, total] = r.children[2].textContent.split(' (')[0].split(' / ').map(Number);
            const n = total - exact;
            return n ? [`${r.children[0].textContent.split(' (')[0]}: ${n} answered wrong (${n} rows)`] : [];
        });
        return JSON.stringify(listed) === JSON.stringify(missed) ? 'ok' : `listed ${listed}; scores say ${missed}`;
    "#;
    let listed = ui.eval(wrong_listed).await?;
    if listed != "ok" {
        return Err(format!("Evaluate's wrong answers disagree with its scores: {listed}"));
    }
    // Each wrong answer sits under its kind's heading; a wrong argument is shown, both values marked.
    let grouped = r#"
        const groups = [...document.querySelectorAll('#evaluation-wrong section[data-kind]')];
        const unmarked = [...document.querySelectorAll('#evaluation-wrong section[data-kind="wrong_arguments"] tbody tr')]
            .filter((r) => !r.querySelector('.differs mark'));
        return groups.every((g) => g.querySelector('h4') && g.querySelector('tbody tr')) && !unmarked.length
            ? 'ok' : `${groups.length} groups, ${unmarked.length} wrong arguments without what differs`;
    "#;
    let grouped = ui.eval(grouped).await?;
    if grouped != "ok" {
        return Err(format!("Evaluate's wrong answers are not grouped by kind: {grouped}"));
    }
    // A tuned model whose answers parse less often than the base's gets a line on why.
    let advice = r#"
        const rate = (row) => parseFloat(document.querySelectorAll('#evaluation-rows tr')[row].children[3].textContent);
        const advice = document.getElementById('evaluation-advice');
        return String((rate(1) < rate(0)) === (!advice.hidden && advice.textContent.includes('parse less often')));
    "#;
    if ui.eval(advice).await? != "true" {
        return Err(format!("the parse-rate advice is wrong: {:?}", ui.text("evaluation-advice").await?));
    }
    ui.eval("const d = document.querySelector('#evaluation-wrong details'); if (d) d.open = true; return ''").await?;
    ui.shot("7-evaluate", "evaluation").await?;
    ui.shot("7-breakdown", "breakdown").await?;
    ui.shot("7-quant-rows", "quant").await?;
    confidence_and_acceptance(&ui, &out).await?;
    ui.wait("the Try panel's question", "return document.getElementById('try-query').value").await?;
    ui.click("try-button").await?;
    let answered = "return document.querySelector('#try-tuned .answer-body').textContent.includes('tokens/s')";
    ui.poll("the tuned model's answer", answered, RUN_TIMEOUT, |v| v == "true").await?;
    let call = ui.eval("return document.querySelector('#try-tuned .answer-body pre')?.textContent ?? ''").await?;
    // Try writes each call acted on as a JSON line, or "(no call)" when the answer has none.
    let given: Result<Vec<Value>, _> =
        if call == "(no call)" { Ok(Vec::new()) } else { call.lines().map(serde_json::from_str).collect() };
    let right = first_answers(&dataset)?;
    if given.as_ref().ok() != Some(&right) {
        return Err(format!("Try's tuned model answers {call:?} to the example's question, not {right:?}"));
    }
    ui.shot("8-try", "try").await?;
    ui.click("tab-history").await?;

    // History: the training is listed, with its record on disk in the app's data dir.
    let items = ui.eval("return String(document.querySelectorAll('#history-list .history-item').length)").await?;
    if items != "1" {
        return Err(format!("History lists {items} trainings after one"));
    }
    let marked = ui
        .eval("const p = document.querySelector('#history-list .published'); return p.textContent + ' ' + p.title")
        .await?;
    if marked != format!("published {}/{PUBLISH_REPO}", hub.endpoint()) {
        return Err(format!("History does not show where the training's .cact was published: {marked:?}"));
    }
    // The threshold picked and the acceptance run are kept with the training.
    let kept = ui
        .eval(
            "const item = document.querySelector('#history-list .history-item'); \
             return item.querySelector('.threshold').textContent + ' | ' + item.querySelector('.acceptance').textContent",
        )
        .await?;
    if !shows_the_pick_and_the_verdict(&kept) {
        return Err(format!("History does not show the threshold picked and the acceptance verdict: {kept:?}"));
    }
    ui.shot("6-history", "history").await?;

    // Base models from the hub: Needle 2 downloads with a progress bar (slowed down so the bar is seen),
    // and fills the model fields.
    ui.click("tab-model").await?;
    hub.set_faults(Faults { bytes_per_s: Some(400_000), ..Faults::default() });
    ui.click("hub-download-Needle2").await?;
    ui.wait(
        "the download's progress",
        "const p = document.getElementById('hub-progress-Needle2'); return p && !p.hidden && p.value > 0",
    )
    .await?;
    ui.shot("base-model-download", "model").await?;
    ui.wait_status("hub-status-Needle2", &["cached"], UI_TIMEOUT).await?;
    ui.wait_for_checkpoint(CHECKPOINT).await?;
    ui.shot("base-model-cached", "model").await?;

    // Needle 3: downloaded from its own repository and used, then tuned by a Quick training on the small
    // example (its rows fit the tiny checkpoint's context) and asked in Try.
    hub.set_faults(Faults::default());
    ui.click("hub-download-Needle3").await?;
    ui.wait_status("hub-status-Needle3", &["cached"], UI_TIMEOUT).await?;
    ui.wait_for_checkpoint(NEEDLE3_CHECKPOINT).await?;
    ui.shot("base-model-needle3", "model").await?;
    let small = repo("examples/smart_home.jsonl");
    ui.drop_dataset(&small).await?;
    ui.wait_for_text("dataset-path", &small.display().to_string()).await?;
    ui.click("tab-train").await?;
    ui.click("start-button").await?;
    // The first training's "finished" is still shown until this one has started.
    ui.wait_status("training-status", &["running", "stopped", "failed"], UI_TIMEOUT).await?;
    let status = ui.wait_status("training-status", &["finished", "stopped", "failed"], RUN_TIMEOUT).await?;
    if status != "finished" {
        return Err(format!("the Needle 3 training ended {status}: {}", ui.text("training-status").await?));
    }
    ui.click("tab-evaluate").await?;
    // Emptied first, so that the answer waited for is this training's.
    ui.eval("document.querySelector('#try-tuned .answer-body').textContent = ''; return ''").await?;
    ui.click("try-button").await?;
    ui.poll("the tuned Needle 3's answer", answered, RUN_TIMEOUT, |v| v == "true").await?;
    let error = ui.eval("return document.getElementById('try-error').textContent").await?;
    if !error.is_empty() {
        return Err(format!("Try failed on the tuned Needle 3: {error}"));
    }

    // Its .cact (format v3) builds in the Export step, reads back as Needle 3, and is scored.
    ui.click("tab-export").await?;
    let out3 = scratch.join("tuned-needle3.cact");
    ui.type_path("cact-path", &out3).await?;
    // Cleared first, so that the status waited for is this build's.
    ui.eval("document.getElementById('build-status').dataset.status = 'idle'; return ''").await?;
    ui.click("build-button").await?;
    let built = ui.wait_status("build-status", &["built", "failed"], RUN_TIMEOUT).await?;
    if built != "built" {
        return Err(format!("the Needle 3 build failed: {}", ui.text("build-status").await?));
    }
    let file3 = CactFile::open(&out3).map_err(|e| format!("the built Needle 3 file does not read back: {e}"))?;
    let Generation::Needle3 = file3.header.generation else {
        return Err(format!("the Needle 3 training built a {} .cact", file3.header.generation));
    };
    let shown = ui.text("cact-tensors").await?;
    if shown != file3.records.len().to_string() {
        return Err(format!("the window says {shown} tensors, the Needle 3 file has {}", file3.records.len()));
    }
    ui.click("tab-evaluate").await?;
    ui.poll("the Needle 3 .cact's three rows", quant, RUN_TIMEOUT, |n| n == "3").await?;
    ladder(&ui, &out3).await?;
    generate_more(&ui, llm, &small, scratch).await?;
    println!("training: {progress}; built {} ({} tensors); {gaps}", out.display(), file.records.len());
    Ok(())
}

/// The threshold History shows after [`confidence_and_acceptance`], and the `.cact`'s verdict.
fn shows_the_pick_and_the_verdict(kept: &str) -> bool {
    let (threshold, verdict) = kept.split_once(" | ").unwrap_or_default();
    threshold == format!("threshold {PICKED_THRESHOLD}") && [".cact PASS", ".cact FAIL"].contains(&verdict)
}

/// The threshold the test picks with Evaluate's control (one of its 0.05 steps).
const PICKED_THRESHOLD: &str = "0.35";

/// Evaluate's Confidence and Acceptance sections once the `.cact` at `cact` is built and scored: the
/// reliability chart and the trade-off for base, tuned and `.cact`; a threshold picked with the control
/// is written beside the file; then a suite run on the three models at that threshold, side by side per
/// category, with a clear PASS or FAIL.
async fn confidence_and_acceptance(ui: &Ui<'_>, cact: &Path) -> Result<(), String> {
    let rows = "return [...document.querySelectorAll('#confidence-rows tr')].map((r) => r.dataset.model).join(',')";
    ui.poll("the confidence of base, tuned and .cact", rows, UI_TIMEOUT, |models| models == "Base,Tuned,.cact").await?;
    let chart = ui
        .eval("const svg = document.querySelector('#reliability-chart svg'); return svg ? svg.outerHTML : ''")
        .await?;
    if !(chart.contains("share right") && chart.contains("Tuned") && chart.contains("<circle")) {
        return Err(format!("the reliability chart lacks its axes or the models' points: {chart:.300}"));
    }
    // The control moved (as a user drags it): the trade-off follows at once, and the pick is saved.
    let pick = format!(
        "const r = document.getElementById('threshold-range'); r.value = '{PICKED_THRESHOLD}'; \
         r.dispatchEvent(new Event('input')); r.dispatchEvent(new Event('change')); return ''"
    );
    ui.eval(&pick).await?;
    let note = "return document.getElementById('threshold-note').textContent";
    let said = ui
        .poll("the threshold picked", note, UI_TIMEOUT, |t| {
            t.contains(&format!("ships with a threshold of {PICKED_THRESHOLD}"))
        })
        .await?;
    let beside = cact.with_extension("threshold.json");
    if !said.contains(&beside.file_name().unwrap_or_default().to_string_lossy().into_owned()) {
        return Err(format!("the threshold note does not name the file beside the .cact: {said}"));
    }
    let written: Value =
        serde_json::from_slice(&std::fs::read(&beside).map_err(|e| format!("{}: {e}", beside.display()))?)
            .map_err(|e| format!("{}: {e}", beside.display()))?;
    let model = cact.file_name().unwrap_or_default().to_string_lossy().into_owned();
    if written["min_confidence"].as_f64() != PICKED_THRESHOLD.parse().ok() || written["model"] != model.as_str() {
        return Err(format!("{} holds {written}, not the threshold picked for {model}", beside.display()));
    }
    let shown = ui
        .eval("return document.querySelector('#confidence-rows tr[data-model=\".cact\"]').children[3].textContent")
        .await?;
    // Both say the share the gate keeps: the window in whole percent.
    let agree = match (written["kept_right"].as_f64(), shown.strip_suffix('%').and_then(|p| p.parse::<f64>().ok())) {
        (Some(kept), Some(percent)) => (percent - 100.0 * kept).abs() <= 0.5 + 1e-9,
        (None, None) => shown == "–",
        _ => false,
    };
    if !agree {
        return Err(format!("the window says the .cact keeps {shown} of right answers, the file {written}"));
    }
    ui.shot("7-confidence", "confidence").await?;

    // Acceptance: the suite answered by the three models at the threshold picked.
    ui.type_path("suite-path", &repo("tests/fixtures/suites/tiny.suite.json")).await?;
    ui.click("acceptance-button").await?;
    let verdict = "return document.getElementById('acceptance-result').hidden ? '' : \
                   document.getElementById('acceptance-verdict').textContent";
    let said = ui.poll("the acceptance verdict", verdict, RUN_TIMEOUT, |t| !t.is_empty()).await?;
    let error = ui.eval("return document.getElementById('acceptance-error').textContent").await?;
    if !error.is_empty() {
        return Err(format!("the acceptance run failed: {error}"));
    }
    let verdicts: Vec<&str> = said.split(" · ").collect();
    let named = ["Base", "Tuned", ".cact"].iter().zip(&verdicts).all(|(model, verdict)| {
        verdict.contains(&format!("{model} PASS")) || verdict.contains(&format!("{model} FAIL"))
    });
    if verdicts.len() != 3 || !named || !said.contains(&format!("threshold {PICKED_THRESHOLD}")) {
        return Err(format!("the acceptance verdict is not a PASS or FAIL for each model at the threshold: {said}"));
    }
    let columns = "return [...document.querySelectorAll('#acceptance-head th')].map((th) => th.textContent).join(',')";
    let head = ui.eval(columns).await?;
    let rows = ui.eval("return String(document.querySelectorAll('#acceptance-rows tr').length)").await?;
    if head != "Category,Base,Tuned,.cact" || rows.parse::<usize>().unwrap_or(0) < 2 {
        return Err(format!(
            "the acceptance table is not the three models side by side per category: {head}; {rows} rows"
        ));
    }
    ui.shot("7-acceptance", "acceptance").await?;
    Ok(())
}

/// The Export step's depth ladder of the tuned Needle 3 (built whole at `whole`): a sweep cancelled
/// under way leaves no table; one run through shows a row per rung (2 to its 4 layers) and the chart,
/// and "Build this rung" writes the shallowest rung's own .cact beside the whole one, which stays the built file.
async fn ladder(ui: &Ui<'_>, whole: &Path) -> Result<(), String> {
    ui.click("tab-export").await?;
    // Cancel is clicked by the page itself as the first answer is counted: the small model's whole
    // sweep can end between two looks from the test (it did in CI on a faster machine), while the
    // sweep stops at its next answer once asked.
    ui.eval(
        "const progress = document.getElementById('ladder-progress'); \
         new MutationObserver((_, observer) => { \
           if (!(progress.value > 0)) return; \
           observer.disconnect(); document.getElementById('ladder-cancel').click(); \
         }).observe(progress, {attributes: true, attributeFilter: ['value']}); return ''",
    )
    .await?;
    ui.click("ladder-button").await?;
    let stopped = ui.wait_status("ladder-status", &["cancelled", "scored", "failed"], RUN_TIMEOUT).await?;
    if stopped != "cancelled"
        || ui.eval("return String(document.getElementById('ladder-result').hidden)").await? != "true"
    {
        return Err(format!("Cancel during the ladder sweep ended {stopped}: {}", ui.text("ladder-status").await?));
    }
    ui.click("ladder-button").await?;
    let scored = ui.wait_status("ladder-status", &["scored", "failed"], RUN_TIMEOUT).await?;
    if scored != "scored" {
        return Err(format!("the ladder sweep failed: {}", ui.text("ladder-status").await?));
    }
    let layers = ui
        .eval("return [...document.querySelectorAll('#ladder-table tbody tr td:first-child')].map((td) => td.textContent).join(',')")
        .await?;
    let charted = ui.eval("return String(document.querySelectorAll('#ladder-chart svg rect').length > 0)").await?;
    let depths: Vec<usize> = layers.split(',').filter_map(|n| n.parse().ok()).collect();
    let climbs = depths.first() == Some(&2) && depths.windows(2).all(|pair| pair[1] == pair[0] + 1);
    if !climbs || charted != "true" {
        return Err(format!(
            "the ladder shows rungs {layers:?}, not 2 up to the model's depth (chart drawn: {charted})"
        ));
    }
    ui.shot("5-ladder", "ladder").await?;
    let whole_shown = (ui.text("cact-size").await?, ui.text("cact-scheme").await?);
    ui.eval("document.getElementById('build-status').dataset.status = 'idle'; return ''").await?;
    ui.eval("document.querySelector('#ladder-table tbody tr button').click(); return ''").await?;
    let built = ui.wait_status("build-status", &["built", "failed"], RUN_TIMEOUT).await?;
    if built != "built" {
        return Err(format!("building rung 2 failed: {}", ui.text("build-status").await?));
    }
    let rung =
        whole.with_file_name(format!("{}-2-layers.cact", whole.file_stem().unwrap_or_default().to_string_lossy()));
    let file =
        CactFile::open(&rung).map_err(|e| format!("the built rung {} does not read back: {e}", rung.display()))?;
    let whole = CactFile::open(whole).map_err(|e| format!("{}: {e}", whole.display()))?;
    if file.size() >= whole.size() {
        return Err(format!(
            "the 2-layer rung ({} bytes) is no smaller than the whole model ({})",
            file.size(),
            whole.size()
        ));
    }
    // The rung is a file of its own, named in its row; the whole model stays the built file, the one
    // Publish uploads.
    let named = ui.text("rung-built-2").await?;
    let expected = rung.file_name().unwrap_or_default().to_string_lossy();
    if named != expected {
        return Err(format!("the 2-layer row names {named:?} as its built file, not {expected:?}"));
    }
    let shown = (ui.text("cact-size").await?, ui.text("cact-scheme").await?);
    if shown != whole_shown {
        return Err(format!(
            "after building a rung the Export step shows {shown:?} as the built file, not {whole_shown:?}"
        ));
    }
    Ok(())
}

/// The Data step's Generate: six rows from the loopback endpoint (the key from the app's environment),
/// the progress bar full, the rows shown, the written file the dataset, and a suite of three cases beside
/// it, named in the status and offered in Evaluate's Acceptance section; then a doctor's line opened.
async fn generate_more(ui: &Ui<'_>, llm: &FakeLlm, dataset: &Path, scratch: &Path) -> Result<(), String> {
    ui.click("tab-data").await?;
    let source = ui.text("generate-key-source").await?;
    if source != "From OPENROUTER_API_KEY" {
        return Err(format!("the key's source reads {source:?}"));
    }
    ui.eval("document.getElementById('generate-count').value = '6'; return ''").await?;
    ui.type_path("generate-endpoint", Path::new(llm.url())).await?;
    let out = scratch.join("more.jsonl");
    ui.type_path("generate-output", &out).await?;
    ui.click("generate-suite").await?;
    ui.eval("document.getElementById('generate-suite-cases').value = '3'; return ''").await?;
    ui.click("generate-button").await?;
    let ended = ui.wait_status("generate-status", &["written", "failed"], UI_TIMEOUT).await?;
    if ended != "written" {
        return Err(format!("generation {ended}: {}", ui.text("generate-status").await?));
    }
    let progress =
        ui.eval("const p = document.getElementById('generate-progress'); return p.value + '/' + p.max").await?;
    let shown = ui.eval("return String(document.querySelectorAll('#generate-rows li').length)").await?;
    let written = std::fs::read_to_string(&out).map_err(|e| format!("{}: {e}", out.display()))?;
    let originals = std::fs::read_to_string(dataset).map_err(|e| format!("{}: {e}", dataset.display()))?;
    if (progress.as_str(), shown.as_str()) != ("6/6", "6") || written.lines().count() != originals.lines().count() + 6 {
        return Err(format!("progress {progress}, {shown} rows shown, {} lines written", written.lines().count()));
    }
    // The suite, beside the rows' file as it is named: whole, said in the status, offered in Evaluate.
    let suite = scratch.join("more.suite.json");
    let cases = needle_engine::suite::Suite::load(&suite).map_err(|e| format!("the generated suite: {e}"))?.cases;
    let status = ui.text("generate-status").await?;
    if cases.len() != 3 || !status.contains(&format!("Acceptance suite: 3 cases in {}", suite.display())) {
        return Err(format!("{} cases in {}; the status says {status:?}", cases.len(), suite.display()));
    }
    let offered = ui.eval("return document.getElementById('suite-path').value").await?;
    if offered != suite.display().to_string() {
        return Err(format!("Evaluate's Acceptance offers {offered:?}, not the suite just written"));
    }
    ui.wait_for_text("dataset-path", &out.display().to_string()).await?;
    ui.wait("the written file's report", "return !document.getElementById('dataset-report').hidden").await?;
    ui.shot("9-generate", "generate").await?;
    // A finding's line number shows that line of the file.
    ui.wait("a finding's line", "return document.querySelector('#doctor-findings .line-link') !== null").await?;
    ui.eval("document.querySelector('#doctor-findings .line-link').click(); return ''").await?;
    ui.wait("the line's text", "return document.getElementById('doctor-line').textContent.includes('\"query\"')")
        .await?;
    ui.shot("2-doctor", "doctor").await
}

/// Three replies of two new rows for the example's tools, then one with a suite of three cases for them:
/// two positive and one missing, as upstream's proportions give three (no tool bounds a value, so no
/// invalid case is asked for).
fn generated_replies() -> Vec<Answer> {
    let set =
        |room: &str, celsius: u32| json!([{"name": "set_thermostat", "arguments": {"room": room, "celsius": celsius}}]);
    let row = |room: &str, celsius: u32| {
        json!({"query": format!("Set the {room} to {celsius} degrees"), "reasoning": "from the query",
               "answers": set(room, celsius)})
    };
    let rows = [[("office", 20), ("garage", 12)], [("attic", 15), ("hallway", 19)], [("study", 22), ("porch", 10)]]
        .iter()
        .map(|pair| Answer::Reply(Value::Array(pair.iter().map(|(room, c)| row(room, *c)).collect()).to_string()));
    let suite = json!([
        {"query": "Warm the den up to 23 degrees", "category": "positive", "calls": set("den", 23)},
        {"query": "Could the cellar sit at 16 degrees", "category": "positive", "calls": set("cellar", 16)},
        {"query": "Change the thermostat in the den", "category": "missing", "calls": []},
    ]);
    rows.chain([Answer::Reply(suite.to_string())]).collect()
}

/// How many usable examples the engine finds in `dataset` at the Quick preset's length.
fn expected_examples(dataset: &Path, tokenizer: &Path) -> usize {
    let tokenizer = Tokenizer::load(tokenizer).expect("the demo's tokenizer");
    let data = Dataset::load(dataset, Generation::Needle3).expect("the demo's dataset");
    data.prepare(&tokenizer, QUICK_MAX_LEN).expect("the demo's dataset prepares").report.usable_examples
}

/// A path in the repository.
fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path)
}

/// The arguments `scripts/studio.sh` starts the app with when given none (its `args=(…)` line), with
/// their paths made absolute: the first training the test makes is the one a newcomer makes.
fn first_run_args() -> Vec<String> {
    let script = std::fs::read_to_string(repo("scripts/studio.sh")).expect("scripts/studio.sh");
    let line = script
        .lines()
        .find_map(|line| line.split_once("|| args=(").map(|(_, rest)| rest.trim_end().trim_end_matches(')')))
        .expect("scripts/studio.sh gives its default arguments as `|| args=(…)`");
    line.split_whitespace()
        .map(|arg| if arg.starts_with("--") { arg.to_owned() } else { repo(arg).display().to_string() })
        .collect()
}

/// The Evaluate table's exact-call and parse-rate cells (base first, tuned second) against the first
/// training's target: the tuned model right on at least 60% of at least 20 held-out rows, 40 points above
/// the base, its answers parsing at least as often.
fn first_training_keeps_its_promise(cells: &str) -> Result<(), String> {
    let rows: Vec<(String, String)> = serde_json::from_str(cells).map_err(|e| format!("{cells}: {e}"))?;
    let score = |(exact, parse): &(String, String)| -> Option<(u64, u64, f64)> {
        let (right, total) = exact.split(" (").next()?.split_once(" / ")?;
        Some((right.parse().ok()?, total.parse().ok()?, parse.trim_end_matches('%').parse().ok()?))
    };
    let [Some((base, held_out, base_parse)), Some((tuned, _, tuned_parse))] =
        [rows.first().and_then(score), rows.get(1).and_then(score)]
    else {
        return Err(format!("cannot read the Evaluate table: {cells}"));
    };
    let rate = |right: u64| right as f64 / held_out as f64;
    if held_out < HELD_OUT_AT_LEAST
        || rate(tuned) < TUNED_AT_LEAST
        || rate(tuned) - rate(base) < GAIN_AT_LEAST
        || tuned_parse < base_parse
    {
        return Err(format!(
            "the first training does not show learning: base {base} / {held_out} ({base_parse}% parse), tuned {tuned} / \
             {held_out} ({tuned_parse}% parse); wanted at least {HELD_OUT_AT_LEAST} held out, the tuned model at \
             {TUNED_AT_LEAST} and {GAIN_AT_LEAST} above the base, parsing as often"
        ));
    }
    Ok(())
}

/// The calls the dataset's first row expects: the question Try is prefilled with.
fn first_answers(dataset: &Path) -> Result<Vec<Value>, String> {
    let text = std::fs::read_to_string(dataset).map_err(|e| format!("{}: {e}", dataset.display()))?;
    let row: Value = serde_json::from_str(text.lines().next().unwrap_or_default())
        .map_err(|e| format!("{}, line 1: {e}", dataset.display()))?;
    row["answers"].as_array().cloned().ok_or_else(|| format!("{}, line 1 has no answers", dataset.display()))
}

/// The page as the test sees it.
struct Ui<'a> {
    client: &'a Client,
    camera: &'a Camera,
}

impl Ui<'_> {
    async fn element(&self, id: &str) -> Result<Element, String> {
        answer(&format!("no #{id} in the window"), self.client.find(Locator::Id(id))).await
    }

    /// Sends the event Tauri sends when a file is dropped on the window, and waits for its report.
    async fn drop_dataset(&self, path: &Path) -> Result<(), String> {
        let drop =
            "window.__TAURI__.event.emit('tauri://drag-drop', {paths: [arguments[0]], position: {x: 40, y: 40}})";
        answer("cannot send the drop event", self.client.execute(drop, vec![json!(path)])).await?;
        self.wait(
            "the dataset report",
            "const r = document.getElementById('dataset-report'); return !r.hidden && r.textContent",
        )
        .await
    }

    async fn click(&self, id: &str) -> Result<(), String> {
        let element = self.element(id).await?;
        self.wait(&format!("#{id} to be enabled"), &format!("return !document.getElementById('{id}').disabled"))
            .await?;
        answer(&format!("cannot click #{id}"), element.click()).await
    }

    /// Replaces an input's text and leaves it with Tab, as a user typing a path would.
    async fn type_path(&self, id: &str, path: &Path) -> Result<(), String> {
        let input = self.element(id).await?;
        answer(&format!("cannot clear #{id}"), input.clear()).await?;
        let keys = format!("{}\u{E004}", path.display());
        answer(&format!("cannot type into #{id}"), input.send_keys(&keys)).await
    }

    /// Waits for the model fields to name the downloaded copy of `fixture` and to pass validation.
    async fn wait_for_checkpoint(&self, fixture: &str) -> Result<(), String> {
        let script = "return document.getElementById('checkpoint-path').value";
        let expected = read(fixture);
        let named = |path: &str| std::fs::read(path).is_ok_and(|bytes| bytes == expected);
        self.poll(&format!("the checkpoint field to name the downloaded {fixture}"), script, UI_TIMEOUT, named).await?;
        self.wait(
            "the model fields to pass validation",
            "return document.getElementById('error-checkpoint').textContent === ''",
        )
        .await
    }

    async fn text(&self, id: &str) -> Result<String, String> {
        self.eval(&format!("return document.getElementById('{id}').textContent.trim()")).await
    }

    /// Runs `script` in the page; its result as text (strings bare, anything else as JSON).
    async fn eval(&self, script: &str) -> Result<String, String> {
        match answer(&format!("script failed: {script}"), self.client.execute(script, Vec::new())).await? {
            Value::String(text) => Ok(text),
            value => Ok(value.to_string()),
        }
    }

    /// Polls `script` until it returns something truthy.
    async fn wait(&self, what: &str, script: &str) -> Result<(), String> {
        self.poll(what, script, UI_TIMEOUT, |value| !matches!(value, "" | "false" | "null" | "0")).await.map(drop)
    }

    async fn wait_for_text(&self, id: &str, expected: &str) -> Result<(), String> {
        let script = format!("return document.getElementById('{id}').textContent.trim()");
        self.poll(&format!("#{id} to read {expected}"), &script, UI_TIMEOUT, |text| text == expected).await.map(drop)
    }

    /// Waits for `#id[data-status]` to reach one of `ends`, and returns it.
    async fn wait_status(&self, id: &str, ends: &[&str], timeout: Duration) -> Result<String, String> {
        let script = format!("return document.getElementById('{id}').dataset.status");
        self.poll(&format!("#{id} to reach one of {ends:?}"), &script, timeout, |status| ends.contains(&status)).await
    }

    async fn poll(
        &self,
        what: &str,
        script: &str,
        timeout: Duration,
        done: impl Fn(&str) -> bool,
    ) -> Result<String, String> {
        let start = Instant::now();
        loop {
            let value = self.eval(script).await?;
            if done(&value) {
                return Ok(value);
            }
            if start.elapsed() > timeout {
                let error = self.eval("return document.getElementById('app-error').textContent").await?;
                return Err(format!(
                    "timed out after {timeout:?} waiting for {what}: last {value:?}; app error {error:?}"
                ));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Saves a screenshot of the section `section` as `<name>.png`.
    async fn shot(&self, name: &str, section: &str) -> Result<(), String> {
        // Scrolled to the top of the view first: WebKit crops an element's screenshot to the viewport.
        self.eval(&format!("document.getElementById('{section}').scrollIntoView({{block: 'start'}}); return ''"))
            .await?;
        let element = self.element(section).await?;
        self.camera.element(name, &element).await
    }
}

/// Screenshots, taken through a connection of their own to the test's session. WebKitWebDriver once
/// in CI never answered an element screenshot (`5-export`, after a build), and a client sends its next
/// command only once its last is answered, so that picture held the whole test. A screenshot is a
/// picture for the record, never a step the test waits on: with no answer in [`SHOT_TIMEOUT`] it is
/// left behind on this connection, said so, and the later ones are skipped.
struct Camera {
    /// `None` once a screenshot got no answer.
    client: std::cell::RefCell<Option<Client>>,
    dir: PathBuf,
}

/// How long a screenshot may take; one takes well under a second.
const SHOT_TIMEOUT: Duration = Duration::from_secs(20);

impl Camera {
    async fn attach(driver: &TauriDriver, session: &Client, dir: &Path) -> Result<Self, String> {
        let id = answer("the session's id", session.session_id()).await?.ok_or("the session has no id")?;
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        let client = Client::with_existing_session(&driver.url, &id, connector)
            .await
            .map_err(|e| format!("a second connection to the session at {}: {e}", driver.url))?;
        // A client whose handles are all dropped ends its session unless told it persists; the
        // test's own client ends it.
        answer("persisting the second connection", client.persist()).await?;
        Ok(Self { client: std::cell::RefCell::new(Some(client)), dir: dir.to_path_buf() })
    }

    /// Saves `element` as it looks now as `<name>.png`.
    async fn element(&self, name: &str, element: &Element) -> Result<(), String> {
        let Some(client) = self.ready(name) else { return Ok(()) };
        self.save(name, Element::from_element_id(client, element.element_id()).screenshot()).await
    }

    /// Saves the whole window as `<name>.png`.
    async fn window(&self, name: &str) -> Result<(), String> {
        let Some(client) = self.ready(name) else { return Ok(()) };
        self.save(name, client.screenshot()).await
    }

    /// The connection for screenshot `name`, or `None` (said so) once one got no answer.
    fn ready(&self, name: &str) -> Option<Client> {
        let client = self.client.borrow().clone();
        if client.is_none() {
            println!("screenshot {name} skipped: an earlier one got no answer");
        }
        client
    }

    async fn save(
        &self,
        name: &str,
        screenshot: impl Future<Output = Result<Vec<u8>, fantoccini::error::CmdError>>,
    ) -> Result<(), String> {
        let png = match tokio::time::timeout(SHOT_TIMEOUT, screenshot).await {
            Ok(png) => png.map_err(|e| format!("screenshot {name}: {e}"))?,
            Err(_) => {
                println!("screenshot {name}: no answer from the driver in {SHOT_TIMEOUT:?}; later ones skipped");
                self.client.borrow_mut().take();
                return Ok(());
            }
        };
        let path = self.dir.join(format!("{name}.png"));
        std::fs::write(&path, png).map_err(|e| format!("cannot write {}: {e}", path.display()))
    }
}

/// `command`'s answer, or an error naming `what` when the driver gives none within [`UI_TIMEOUT`]: a
/// WebKitWebDriver that stopped answering (seen once, on a slower CI machine, with the app idle) fails
/// the test by name instead of holding CI until its own limit.
async fn answer<T, E: std::fmt::Display>(what: &str, command: impl Future<Output = Result<T, E>>) -> Result<T, String> {
    match tokio::time::timeout(UI_TIMEOUT, command).await {
        Ok(result) => result.map_err(|e| format!("{what}: {e}")),
        Err(_) => Err(format!("{what}: no answer from the driver in {UI_TIMEOUT:?}")),
    }
}

fn screenshot_dir() -> PathBuf {
    let dir = std::env::var_os("NEEDLE_SCREENSHOTS_DIR")
        .map_or_else(|| Path::new(env!("CARGO_TARGET_TMPDIR")).join("app_e2e"), PathBuf::from);
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
    dir
}

/// The programs the test drives the app with.
struct Tools {
    xvfb: PathBuf,
    tauri_driver: PathBuf,
    webkit_driver: PathBuf,
}

impl Tools {
    /// Finds every tool, or fails naming each missing one and how to install it.
    fn find() -> Self {
        let cargo_bin = std::env::var_os("CARGO_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|home| Path::new(&home).join(".cargo")))
            .map(|home| home.join("bin"));
        let find = |name: &str| {
            let path = std::env::var_os("PATH").unwrap_or_default();
            std::env::split_paths(&path).chain(cargo_bin.clone()).map(|dir| dir.join(name)).find(|p| p.is_file())
        };
        let wanted = [
            ("Xvfb", "apt-get install xvfb"),
            ("tauri-driver", "cargo install tauri-driver --locked"),
            ("WebKitWebDriver", "apt-get install webkit2gtk-driver"),
        ];
        let found: Vec<Option<PathBuf>> = wanted.iter().map(|(name, _)| find(name)).collect();
        let missing: Vec<String> = wanted
            .iter()
            .zip(&found)
            .filter(|(_, path)| path.is_none())
            .map(|((name, install), _)| format!("{name} (install: {install})"))
            .collect();
        assert!(
            missing.is_empty(),
            "app_e2e cannot drive the app without {}; .ci/run installs them",
            missing.join(", ")
        );
        let [xvfb, tauri_driver, webkit_driver] = <[Option<PathBuf>; 3]>::try_from(found).expect("three tools");
        Self { xvfb: xvfb.unwrap(), tauri_driver: tauri_driver.unwrap(), webkit_driver: webkit_driver.unwrap() }
    }
}

/// A child process, and every process it started, ended with the test, pass or fail.
struct Guard(Child);

impl Guard {
    /// Starts `command` as the leader of a new process group, so its children can be ended with it
    /// (tauri-driver starts WebKitWebDriver, which starts the app).
    fn spawn(command: &mut Command) -> Self {
        use std::os::unix::process::CommandExt;
        let program = command.get_program().to_string_lossy().into_owned();
        Self(command.process_group(0).spawn().unwrap_or_else(|e| panic!("cannot start {program}: {e}")))
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let group = format!("-{}", self.0.id());
        let _ = Command::new("kill").args(["-TERM", "--", &group]).status();
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A virtual X display of its own, so tests never touch the user's screen or each other.
struct Xvfb {
    display: String,
    _process: Guard,
}

impl Xvfb {
    fn start(program: &Path) -> Self {
        // The first display number with no X server (lock file) yet.
        let number = (90..200)
            .find(|n| !Path::new(&format!("/tmp/.X{n}-lock")).exists())
            .expect("a free X display number between :90 and :199");
        let display = format!(":{number}");
        let process = Guard::spawn(
            Command::new(program)
                .args([display.as_str(), "-screen", "0", "1280x1024x24", "-nolisten", "tcp"])
                .stdout(Stdio::null())
                .stderr(Stdio::null()),
        );
        let socket = PathBuf::from(format!("/tmp/.X11-unix/X{number}"));
        wait_until(&format!("Xvfb on {display}"), || socket.exists());
        Self { display, _process: process }
    }
}

/// `tauri-driver` on a free port, with WebKitWebDriver under it and the app's files in `home`.
struct TauriDriver {
    url: String,
    /// What tauri-driver, WebKitWebDriver and the app print: quoted when the session fails.
    log: PathBuf,
    _process: Guard,
}

impl TauriDriver {
    fn start(tools: &Tools, display: &Xvfb, home: &Path, hub: &FakeHub) -> Self {
        let (port, native_port) = (free_port(), free_port());
        let log = home.join("tauri-driver.log");
        let log_file = std::fs::File::create(&log).expect("tauri-driver log file");
        let process = Guard::spawn(
            Command::new(&tools.tauri_driver)
                .args(["--port", &port.to_string(), "--native-port", &native_port.to_string()])
                .arg("--native-driver")
                .arg(&tools.webkit_driver)
                .env("DISPLAY", &display.display)
                // The app keeps settings and history here, not in the user's data dir.
                .env("XDG_DATA_HOME", home.join("data"))
                .env("XDG_CONFIG_HOME", home.join("config"))
                .env("XDG_CACHE_HOME", home.join("cache"))
                // The model hub on loopback; its cache goes under XDG_CACHE_HOME.
                .env("HF_ENDPOINT", hub.endpoint())
                .env_remove("HF_HOME")
                .env_remove("HF_HUB_CACHE")
                .env_remove("HF_HUB_OFFLINE")
                // Publish's repository and token, from the environment as the CLI reads them.
                .env("NEEDLE_HF_REPO", PUBLISH_REPO)
                .env("HF_TOKEN", HUB_TOKEN)
                // Software rendering: Xvfb has no GPU. (WebKit's DMA-BUF renderer the app turns off itself.)
                .env_remove("WEBKIT_DISABLE_DMABUF_RENDERER")
                .env("LIBGL_ALWAYS_SOFTWARE", "1")
                .env_remove("NEEDLE_DEVICE")
                // Generate's key, from the environment as the CLI reads it; its endpoint is typed.
                .env("OPENROUTER_API_KEY", LLM_KEY)
                .env_remove("OPENAI_API_KEY")
                .env_remove("OPENROUTER_URL")
                .stdout(log_file.try_clone().expect("log file handle"))
                .stderr(log_file),
        );
        let listening = |port: u16| std::net::TcpStream::connect(("127.0.0.1", port)).is_ok();
        wait_until("tauri-driver and WebKitWebDriver to listen", || listening(port) && listening(native_port));
        Self { url: format!("http://127.0.0.1:{port}"), log, _process: process }
    }
}

async fn connect(driver: &TauriDriver, app: &Path, args: &[String]) -> Client {
    let capabilities = json!({ "browserName": "wry", "tauri:options": { "application": app, "args": args } });
    let Value::Object(capabilities) = capabilities else { unreachable!("a JSON object") };
    let connector = hyper_util::client::legacy::connect::HttpConnector::new();
    // An app that exits at once (a bad argument) leaves WebKitWebDriver waiting for its window for ever.
    let mut builder = ClientBuilder::new(connector);
    let session = builder.capabilities(capabilities).connect(&driver.url);
    let error = match tokio::time::timeout(UI_TIMEOUT, session).await {
        Ok(Ok(client)) => return client,
        Ok(Err(e)) => e.to_string(),
        Err(_) => format!("no window after {UI_TIMEOUT:?}"),
    };
    let log = std::fs::read_to_string(&driver.log).unwrap_or_default();
    panic!("tauri-driver at {} could not start {} {args:?}: {error}\n{log}", driver.url, app.display())
}

fn free_port() -> u16 {
    let listener = TcpListener::bind(("127.0.0.1", 0)).expect("a free local port");
    listener.local_addr().expect("its address").port()
}

fn wait_until(what: &str, ready: impl Fn() -> bool) {
    let start = Instant::now();
    while !ready() {
        assert!(start.elapsed() < Duration::from_secs(30), "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}
