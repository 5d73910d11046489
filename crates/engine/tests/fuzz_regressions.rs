//! Replays the fuzzers' regression corpus (`fuzz/regressions/<target>/*`, every crash, timeout and
//! OOM `fuzz/run.sh` found) and a few fixtures through the fuzz targets' own bodies
//! (`fuzz/bodies.rs`): each input must come back as `Ok` or `Err`, without a panic, within a time
//! bound. Lives in `crates/engine/tests/`; the bodies are shared with `fuzz/fuzz_targets/*.rs`.
//!
//! `NEEDLE_FUZZ_REPLAY_LIMIT_S` overrides the per-input time bound (default 60 s: a debug build,
//! where the fuzzers' own limit is 10 s in release).

use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

const REPO_ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
// Brings in `fuzz_pickle`, `fuzz_dataset_jsonl`, `fuzz_tokenizer_model`, `fuzz_cact`,
// `fuzz_safetensors_checkpoint`, `fuzz_safetensors_adapter` and `fuzz_cact_v3` (and imports `PathBuf`,
// `OnceLock` and the engine types they use).
include!("../../../fuzz/bodies.rs");

type Body = fn(&[u8]) -> Result<(), String>;

/// What one input did.
enum Outcome {
    Returned(Result<(), String>),
    Panicked(String),
    TimedOut,
}

fn limit() -> Duration {
    let seconds = std::env::var("NEEDLE_FUZZ_REPLAY_LIMIT_S").ok().and_then(|s| s.parse().ok()).unwrap_or(60);
    Duration::from_secs(seconds)
}

/// Runs `body` on `bytes` on its own thread (the main thread's 8 MiB stack, as under libFuzzer),
/// so a panic is caught and a hang is bounded; a thread that hangs is left behind.
fn run(body: Body, bytes: Vec<u8>) -> (Outcome, Duration) {
    let (send, receive) = mpsc::channel();
    let start = Instant::now();
    let spawned = std::thread::Builder::new().stack_size(8 << 20).spawn(move || {
        let result = std::panic::catch_unwind(|| body(&bytes));
        let _ = send.send(result);
    });
    if let Err(e) = spawned {
        return (Outcome::Panicked(format!("cannot start the replay thread: {e}")), start.elapsed());
    }
    let outcome = match receive.recv_timeout(limit()) {
        Ok(Ok(result)) => Outcome::Returned(result),
        Ok(Err(payload)) => Outcome::Panicked(
            payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "non-string panic payload".into()),
        ),
        Err(mpsc::RecvTimeoutError::Timeout) => Outcome::TimedOut,
        Err(mpsc::RecvTimeoutError::Disconnected) => Outcome::Panicked("the replay thread died".into()),
    };
    (outcome, start.elapsed())
}

/// Every regular file of `fuzz/regressions/<target>/`, sorted (none when the folder is missing).
fn regressions(target: &str) -> Vec<PathBuf> {
    let dir = Path::new(REPO_ROOT).join("fuzz/regressions").join(target);
    let mut files: Vec<PathBuf> = match std::fs::read_dir(&dir) {
        Ok(entries) => entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_file())
            .filter(|p| {
                !p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with('.') || n.ends_with(".md"))
            })
            .collect(),
        Err(_) => Vec::new(),
    };
    files.sort();
    files
}

/// Replays the regressions of `target` and the given fixtures (`(path, must the reader accept it)`);
/// fails listing every input that panicked, hung, or (for an accepted fixture) was refused.
fn replay(target: &str, body: Body, fixtures: &[(&str, bool)]) {
    let mut inputs: Vec<(PathBuf, bool)> = regressions(target).into_iter().map(|p| (p, false)).collect();
    inputs.extend(fixtures.iter().map(|&(path, accepted)| (Path::new(REPO_ROOT).join(path), accepted)));
    let mut failures = Vec::new();
    for (path, must_accept) in &inputs {
        let name = path.strip_prefix(REPO_ROOT).unwrap_or(path).display().to_string();
        let bytes = match std::fs::read(path) {
            Ok(bytes) => bytes,
            Err(e) => {
                failures.push(format!("{name}: cannot read: {e}"));
                continue;
            }
        };
        let (outcome, took) = run(body, bytes);
        match outcome {
            Outcome::Returned(result) => {
                let shown = match &result {
                    Ok(()) => "Ok".to_string(),
                    Err(e) => format!("Err({})", e.chars().take(200).collect::<String>()),
                };
                eprintln!("{target}: {name}: {shown} in {took:.2?}");
                if *must_accept && result.is_err() {
                    failures.push(format!("{name}: a fixture the reader must accept was refused: {shown}"));
                }
            }
            Outcome::Panicked(message) => failures.push(format!("{name}: panicked after {took:.2?}: {message}")),
            Outcome::TimedOut => failures.push(format!("{name}: still running after {:?}", limit())),
        }
    }
    assert!(
        failures.is_empty(),
        "{target}: {} of {} inputs failed:\n{}",
        failures.len(),
        inputs.len(),
        failures.join("\n")
    );
}

#[test]
fn pickle_regressions() {
    replay(
        "pickle",
        fuzz_pickle,
        &[
            ("tests/fixtures/pickles/checkpoint_v2.pkl", true),
            ("tests/fixtures/pickles/adapter.pkl", true),
            ("tests/fixtures/pickles/checkpoint_str_leaf.pkl", true),
            ("tests/fixtures/golden/tiny_f16/adapter.pkl", true),
            ("tests/fixtures/models/tiny_f16.pkl", true),
            ("tests/fixtures/models/tokenizer.model", false),
            // The hostile corpus (`tests/fixtures/make_hostile.py`): each must be refused, in bounds.
            ("tests/fixtures/hostile/pickle-amplification.pkl", false),
            ("tests/fixtures/hostile/pickle-build-amplification.pkl", false),
            ("tests/fixtures/hostile/config-huge-lanes.pkl", false),
            ("tests/fixtures/hostile/config-engram-heads-wrap.pkl", false),
            ("tests/fixtures/hostile/build-zero-sized-huge-dims.pkl", false),
            ("tests/fixtures/hostile/build-shape-mismatch.pkl", false),
        ],
    );
}

#[test]
fn dataset_jsonl_regressions() {
    replay(
        "dataset_jsonl",
        fuzz_dataset_jsonl,
        &[
            ("tests/fixtures/data/tool_calls.jsonl", true),
            ("examples/smart_home.jsonl", true),
            ("tests/fixtures/data/bad/mixed.jsonl", true),
            ("tests/fixtures/data/bad/not_utf8.jsonl", false),
            ("tests/fixtures/data/bad/no_usable.jsonl", false),
        ],
    );
}

#[test]
fn tokenizer_model_regressions() {
    replay(
        "tokenizer_model",
        fuzz_tokenizer_model,
        &[
            ("tests/fixtures/models/tokenizer.model", true),
            ("tests/fixtures/tokenizer/variants/no_byte_fallback.model", true),
            ("tests/fixtures/tokenizer/variants/remove_ws.model", true),
            // A RAW blob: refused as a .model, read by the blob reader in the same body.
            ("tests/fixtures/tokenizer/tokenizer.blob", false),
            ("tests/fixtures/hostile/tokenizer-many-user-pieces.model", false),
            ("tests/fixtures/hostile/tokenizer-truncated.model", false),
        ],
    );
}

#[test]
fn cact_regressions() {
    replay(
        "cact",
        fuzz_cact,
        &[
            ("tests/fixtures/golden/tiny_f16/w2.cact", true),
            ("tests/fixtures/golden/tiny_f32/w4_lora.cact", true),
            ("tests/fixtures/golden/pretrained/w4.cact", true),
            ("tests/fixtures/hostile/cact-truncated.cact", false),
            ("tests/fixtures/hostile/cact-lying-count.cact", false),
        ],
    );
}

#[test]
fn safetensors_checkpoint_regressions() {
    replay(
        "safetensors_checkpoint",
        fuzz_safetensors_checkpoint,
        &[
            ("tests/fixtures/models/needle3_tiny.safetensors", true),
            ("tests/fixtures/models/needle3_tiny_out.safetensors", true),
            ("tests/fixtures/models/needle3_heads.safetensors", true),
            ("tests/fixtures/models/tiny_f16.pkl", true),
            ("tests/fixtures/golden/needle3_heads/adapter.safetensors", false),
            // The hostile Needle 3 corpus (`tests/fixtures/hostile_needle3.py`).
            ("tests/fixtures/hostile/needle3-valid-header-0x80.safetensors", true),
            ("tests/fixtures/hostile/needle3-valid-max-seq-len-2-24.safetensors", true),
            ("tests/fixtures/hostile/needle3-header-0x80-truncated.safetensors", false),
            ("tests/fixtures/hostile/needle3-offsets-overlap.safetensors", false),
            ("tests/fixtures/hostile/needle3-shape-mismatch.safetensors", false),
            ("tests/fixtures/hostile/needle3-format-version-3.safetensors", false),
            ("tests/fixtures/hostile/needle3-act-bits-65.safetensors", false),
            ("tests/fixtures/hostile/needle3-bf16-nan.safetensors", false),
        ],
    );
}

#[test]
fn safetensors_adapter_regressions() {
    replay(
        "safetensors_adapter",
        fuzz_safetensors_adapter,
        &[
            ("tests/fixtures/golden/needle3_heads/adapter.safetensors", true),
            ("tests/fixtures/models/needle3_tiny.safetensors", false),
            ("tests/fixtures/hostile/adapter3-nan-factor.safetensors", false),
            ("tests/fixtures/hostile/adapter3-truncated.safetensors", false),
            ("tests/fixtures/hostile/adapter-huge-product.safetensors", true),
        ],
    );
}

#[test]
fn cact_v3_regressions() {
    replay(
        "cact_v3",
        fuzz_cact_v3,
        &[
            ("tests/fixtures/golden/needle3_heads/base.cact", true),
            ("tests/fixtures/golden/needle3_heads/lora.cact", true),
            ("tests/fixtures/golden/needle3_heads/layers3.cact", true),
            ("tests/fixtures/golden/tiny_f32/w4.cact", false),
            ("tests/fixtures/hostile/cact3-truncated.cact", false),
            ("tests/fixtures/hostile/cact3-lying-count.cact", false),
        ],
    );
}
