//! Replays the fuzz targets' committed corpora through their own bodies (`fuzz/bodies.rs`): the
//! hand-made hostile seeds (`fuzz/seeds/<target>/`, written by `fuzz/make_seeds.py`), every crash,
//! timeout and OOM `fuzz/run.sh` found (`fuzz/regressions/<target>/`), the hostile fixtures
//! (`tests/fixtures/hostile/`) and the fixtures a reader must accept. Each input must come back
//! within a time bound, without a panic, and as this file says: accepted, or refused with an error
//! that names the problem (each listed fragment in its text). A file in a corpus folder that is not
//! listed here fails the test until it is, with the error it must be refused with. Lives in
//! `crates/engine/tests/`; the bodies are shared with `fuzz/fuzz_targets/*.rs`.
//!
//! `NEEDLE_FUZZ_REPLAY_LIMIT_S` overrides the per-input time bound (default 60 s: a debug build,
//! where the fuzzers' own limit is 10 s in release).

use std::collections::BTreeSet;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use Expect::{Accepted, Refused};

const REPO_ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
// Brings in `fuzz_pickle`, `fuzz_dataset_jsonl`, `fuzz_tokenizer_model`, `fuzz_cact`,
// `fuzz_safetensors_checkpoint`, `fuzz_safetensors_adapter` and `fuzz_cact_v3` (and imports `Path`,
// `PathBuf`, `OnceLock` and the engine types they use).
include!("../../../fuzz/bodies.rs");

type Body = fn(&[u8]) -> Result<(), String>;

/// What one input must do.
enum Expect {
    /// The reader accepts it.
    Accepted,
    /// The reader refuses it with an error whose text contains each of these.
    Refused(Vec<String>),
}

fn refused(fragments: &[&str]) -> Expect {
    Refused(fragments.iter().map(|f| f.to_string()).collect())
}

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

/// The committed corpus of `target`: every regular file of `fuzz/seeds/<target>/` and
/// `fuzz/regressions/<target>/` (dotfiles and notes left out), as paths from the repository root.
fn corpus(target: &str) -> BTreeSet<String> {
    let mut files = BTreeSet::new();
    for folder in ["fuzz/seeds", "fuzz/regressions"] {
        let Ok(entries) = std::fs::read_dir(Path::new(REPO_ROOT).join(folder).join(target)) else { continue };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if entry.path().is_file() && !name.starts_with('.') && !name.ends_with(".md") {
                files.insert(format!("{folder}/{target}/{name}"));
            }
        }
    }
    files
}

/// Replays `cases` (paths from the repository root, each with what it must do) through `body`; fails
/// listing every input that panicked, hung, was accepted or refused against its expectation, or
/// lies in the target's corpus folders without a case.
fn replay<P: AsRef<str>>(target: &str, body: Body, cases: Vec<(P, Expect)>) {
    let listed: BTreeSet<&str> = cases.iter().map(|(path, _)| path.as_ref()).collect();
    let mut failures: Vec<String> = corpus(target)
        .into_iter()
        .filter(|path| !listed.contains(path.as_str()))
        .map(|path| format!("{path}: in the corpus but not listed here: add it with the error it must give"))
        .collect();
    for (name, expect) in &cases {
        let name = name.as_ref();
        let bytes = match std::fs::read(Path::new(REPO_ROOT).join(name)) {
            Ok(bytes) => bytes,
            Err(e) => {
                failures.push(format!("{name}: cannot read: {e}"));
                continue;
            }
        };
        let (outcome, took) = run(body, bytes);
        let result = match outcome {
            Outcome::Returned(result) => result,
            Outcome::Panicked(message) => {
                failures.push(format!("{name}: panicked after {took:.2?}: {message}"));
                continue;
            }
            Outcome::TimedOut => {
                failures.push(format!("{name}: still running after {:?}", limit()));
                continue;
            }
        };
        eprintln!("{target}: {name}: {result:?} in {took:.2?}");
        match (expect, &result) {
            (Accepted, Ok(())) => {}
            (Accepted, Err(error)) => failures.push(format!("{name}: must be accepted, was refused: {error}")),
            (Refused(_), Ok(())) => failures.push(format!("{name}: must be refused, was accepted")),
            (Refused(fragments), Err(error)) => {
                let absent: Vec<&String> = fragments.iter().filter(|f| !error.contains(f.as_str())).collect();
                if fragments.is_empty() || !absent.is_empty() {
                    failures.push(format!("{name}: refused, but the error does not name {absent:?}: {error}"));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{target}: {} of {} inputs failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

/// The pickle parser's own cases (`tests/fixtures/pickles/NAME.pkl`, `make_pickle_cases.py`) that
/// NAME.json says are refused (by the parser, the checkpoint loader or the adapter loader, with the
/// fragments it lists) or are plain values, neither a checkpoint nor an adapter. Its whole
/// checkpoints and adapters are toy shapes the parser reads and no network loads: the pickle test
/// lists them by hand.
fn pickle_cases() -> Vec<(String, Expect)> {
    let dir = Path::new(REPO_ROOT).join("tests/fixtures/pickles");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .flatten()
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".pkl"))
        .collect();
    names.sort();
    names
        .into_iter()
        .filter_map(|name| {
            let said = dir.join(&name).with_extension("json");
            let said: serde_json::Value = std::fs::read_to_string(&said)
                .map_err(|e| e.to_string())
                .and_then(|text| serde_json::from_str(&text).map_err(|e| e.to_string()))
                .unwrap_or_else(|e| panic!("{}: {e}", said.display()));
            let listed = ["error", "checkpoint_error", "adapter_error"].iter().find_map(|key| {
                said[key]["contains"]
                    .as_array()
                    .map(|f| f.iter().filter_map(|f| f.as_str().map(String::from)).collect())
            });
            let expect = match listed {
                Some(fragments) => Refused(fragments),
                // A plain value carries neither a checkpoint's format_version nor an adapter's lora.
                None if said.get("expect").is_some() => refused(&["not a format-v2 checkpoint", "has no `lora` entry"]),
                None => return None,
            };
            Some((format!("tests/fixtures/pickles/{name}"), expect))
        })
        .collect()
}

#[test]
fn pickle_regressions() {
    let mut cases = pickle_cases();
    cases.extend(
        vec![
            ("tests/fixtures/golden/tiny_f16/adapter.pkl", Accepted),
            ("tests/fixtures/models/tiny_f16.pkl", Accepted),
            ("tests/fixtures/models/tokenizer.model", refused(&["byte 0x0a is not a pickle opcode"])),
            // The parser's whole checkpoints and adapters: toy shapes, refused as a network or a merge.
            ("tests/fixtures/pickles/checkpoint_v2.pkl", refused(&["parameter `engrams_0/embedding` is missing"])),
            ("tests/fixtures/pickles/checkpoint_v2_f16_p2.pkl", refused(&["`num_kv_heads` 4 must divide num_heads 2"])),
            (
                "tests/fixtures/pickles/adapter.pkl",
                refused(&["`stack/layers/block/mlp/up/kernel` names a weight the base model does not have"]),
            ),
            // The hostile corpus (`tests/fixtures/make_hostile.py`): each must be refused, in bounds.
            (
                "tests/fixtures/hostile/pickle-amplification.pkl",
                refused(&["_codecs.encode would take the copies", "malformed or hostile"]),
            ),
            (
                "tests/fixtures/hostile/pickle-build-amplification.pkl",
                refused(&["BUILD would take the copies", "malformed or hostile"]),
            ),
            (
                "tests/fixtures/hostile/config-huge-lanes.pkl",
                refused(&["config value `mhc_lanes` is 1099511627776; it must be in 1..=64"]),
            ),
            (
                "tests/fixtures/hostile/config-engram-heads-wrap.pkl",
                refused(&["config value `engram_heads` is 4611686018427387904"]),
            ),
            (
                "tests/fixtures/hostile/build-zero-sized-huge-dims.pkl",
                refused(&["`confidence_head/proj/kernel` has shape [0, 1099511627776], which holds no elements"]),
            ),
            (
                "tests/fixtures/hostile/build-shape-mismatch.pkl",
                refused(&["`embedding/embedding` has shape [512, 32] but the config implies [512, 64]"]),
            ),
            // Hand-made hostile seeds (`fuzz/make_seeds.py`).
            ("fuzz/seeds/pickle/cut-in-header.pkl", refused(&["at byte 96", "the file is truncated"])),
            ("fuzz/seeds/pickle/empty.pkl", refused(&["at byte 0: the data ends without a STOP opcode"])),
            (
                "fuzz/seeds/pickle/marks-without-stop.pkl",
                refused(&["at byte 20002: the data ends without a STOP opcode"]),
            ),
            (
                "fuzz/seeds/pickle/memo-get-unset.pkl",
                refused(&["BINGET refers to memo slot 5, which was never stored"]),
            ),
            ("fuzz/seeds/pickle/protocol-99.pkl", refused(&["protocol 99 is newer than 5"])),
        ]
        .into_iter()
        .map(|(path, expect)| (path.to_string(), expect)),
    );
    replay("pickle", fuzz_pickle, cases);
}

#[test]
fn dataset_jsonl_regressions() {
    replay(
        "dataset_jsonl",
        fuzz_dataset_jsonl,
        vec![
            ("tests/fixtures/data/tool_calls.jsonl", Accepted),
            ("examples/smart_home.jsonl", Accepted),
            ("tests/fixtures/data/bad/mixed.jsonl", Accepted),
            ("tests/fixtures/data/bad/not_utf8.jsonl", Accepted),
            ("tests/fixtures/data/bad/no_usable.jsonl", refused(&["no usable example", "line 2: no \"query\" field"])),
            // Hand-made hostile seeds (`fuzz/make_seeds.py`).
            (
                "fuzz/seeds/dataset_jsonl/array-rows.jsonl",
                refused(&["no usable example", "line 1: the line is a list, not a JSON object"]),
            ),
            (
                "fuzz/seeds/dataset_jsonl/deep-nesting.jsonl",
                refused(&["no usable example", "invalid JSON (recursion limit exceeded)"]),
            ),
            ("fuzz/seeds/dataset_jsonl/empty.jsonl", refused(&["no usable example", "the file has no non-blank line"])),
            (
                "fuzz/seeds/dataset_jsonl/missing-fields.jsonl",
                refused(&["no usable example", "line 1: no \"query\" field"]),
            ),
            (
                "fuzz/seeds/dataset_jsonl/not-json.jsonl",
                refused(&["no usable example", "line 1, column 2: invalid JSON"]),
            ),
        ],
    );
}

#[test]
fn tokenizer_model_regressions() {
    replay(
        "tokenizer_model",
        fuzz_tokenizer_model,
        vec![
            ("tests/fixtures/models/tokenizer.model", Accepted),
            ("tests/fixtures/tokenizer/variants/no_byte_fallback.model", Accepted),
            ("tests/fixtures/tokenizer/variants/remove_ws.model", Accepted),
            // A RAW blob: refused as a .model, read by the blob reader in the same body.
            ("tests/fixtures/tokenizer/tokenizer.blob", refused(&["byte offset 34: field 12 has wire type 4"])),
            ("tests/fixtures/hostile/tokenizer-many-user-pieces.model", Accepted),
            (
                "tests/fixtures/hostile/tokenizer-truncated.model",
                refused(&["byte offset 3435: the record of piece 200 ends past the end of the file"]),
            ),
            // Hand-made hostile seeds (`fuzz/make_seeds.py`).
            (
                "fuzz/seeds/tokenizer_model/cut-in-header.model",
                refused(&["the record of piece 2 ends past the end of the file"]),
            ),
            // An empty protobuf is a model of every field's default, whose type is UNIGRAM.
            ("fuzz/seeds/tokenizer_model/empty.model", refused(&["model_type is UNIGRAM, but only BPE is supported"])),
            (
                "fuzz/seeds/tokenizer_model/length-past-end.model",
                refused(&["the record of piece 0 ends past the end of the file (65535 bytes needed, 10 left)"]),
            ),
            (
                "fuzz/seeds/tokenizer_model/varint-overflow.model",
                refused(&["the length of the record of piece 0 is not a valid varint"]),
            ),
            ("fuzz/seeds/tokenizer_model/wrong-wire-type.model", refused(&["field 1 has wire type 7"])),
        ],
    );
}

#[test]
fn cact_regressions() {
    replay(
        "cact",
        fuzz_cact,
        vec![
            ("tests/fixtures/golden/tiny_f16/w2.cact", Accepted),
            ("tests/fixtures/golden/tiny_f32/w4_lora.cact", Accepted),
            ("tests/fixtures/golden/pretrained/w4.cact", Accepted),
            (
                "tests/fixtures/hostile/cact-truncated.cact",
                refused(&["blob [91008, +6336) runs past the end of the 93263-byte file"]),
            ),
            (
                "tests/fixtures/hostile/cact-lying-count.cact",
                refused(&["starts inside the directory, which the header's num_tensors (1065)"]),
            ),
            // Hand-made hostile seeds (`fuzz/make_seeds.py`).
            (
                "fuzz/seeds/cact/directory-cut.cact",
                refused(&["the file is 160 bytes but its codebook needs bytes up to 232"]),
            ),
            ("fuzz/seeds/cact/empty.cact", refused(&["the file is 0 bytes but its 4-byte tag needs bytes up to 4"])),
            (
                "fuzz/seeds/cact/engram-orders-overflow.cact",
                refused(&["num_engram_orders is 9, the header holds at most 4"]),
            ),
            ("fuzz/seeds/cact/header-cut.cact", refused(&["the file is 64 bytes but its 120-byte Needle 2 header"])),
            (
                "fuzz/seeds/cact/huge-count.cact",
                refused(&["num_tensors is 4294967295, whose directory would end at byte 188978561212"]),
            ),
            ("fuzz/seeds/cact/tag-only.cact", refused(&["the file is 4 bytes but its 120-byte Needle 2 header"])),
            ("fuzz/seeds/cact/wrong-tag.cact", refused(&["bad tag 0x45504f4e at byte 0", "not a .cact file"])),
        ],
    );
}

#[test]
fn safetensors_checkpoint_regressions() {
    replay(
        "safetensors_checkpoint",
        fuzz_safetensors_checkpoint,
        vec![
            ("tests/fixtures/models/needle3_tiny.safetensors", Accepted),
            ("tests/fixtures/models/needle3_tiny_out.safetensors", Accepted),
            ("tests/fixtures/models/needle3_heads.safetensors", Accepted),
            ("tests/fixtures/models/tiny_f16.pkl", Accepted),
            ("tests/fixtures/golden/needle3_heads/adapter.safetensors", refused(&["without the `format_version` metadata a Needle 3 checkpoint carries"])),
            // The hostile Needle 3 corpus (`tests/fixtures/hostile_needle3.py`).
            ("tests/fixtures/hostile/needle3-valid-header-0x80.safetensors", Accepted),
            ("tests/fixtures/hostile/needle3-valid-max-seq-len-2-24.safetensors", Accepted),
            ("tests/fixtures/hostile/needle3-header-0x80-truncated.safetensors", refused(&["`stack/layers/block/self_attn/k_proj/kernel` ends at byte 263704, past the end of the 261296-byte file"])),
            ("tests/fixtures/hostile/needle3-offsets-overlap.safetensors", refused(&["`stack/layers/block/self_attn/q_proj/kernel` begins at byte 314100", "but the tensor before it"])),
            ("tests/fixtures/hostile/needle3-shape-mismatch.safetensors", refused(&["has shape [4, 48, 47] of F32, which takes 36096 bytes, but its data_offsets"])),
            ("tests/fixtures/hostile/needle3-format-version-3.safetensors", refused(&["is not a format-v2 checkpoint (got format_version=\"3\")"])),
            ("tests/fixtures/hostile/needle3-act-bits-65.safetensors", refused(&["config value `act_bits` is 65; it must be in 2..=32"])),
            ("tests/fixtures/hostile/needle3-bf16-nan.safetensors", refused(&["`stack/layers/block/self_attn/q_proj/kernel` holds NaN at [0, 0, 5]"])),
            // Hand-made hostile seeds (`fuzz/make_seeds.py`).
            ("fuzz/seeds/safetensors_checkpoint/cut-in-data.safetensors", refused(&["`engrams_0/value_proj/kernel` ends at byte 136232, past the end of the 130616-byte file"])),
            ("fuzz/seeds/safetensors_checkpoint/empty.safetensors", refused(&["neither a Needle 2 checkpoint", "it begins with nothing (the file is empty)"])),
            ("fuzz/seeds/safetensors_checkpoint/header-length-huge.safetensors", refused(&["header length (bytes 0..8) is 4611686018427387904, more than the 100000000 bytes"])),
            ("fuzz/seeds/safetensors_checkpoint/header-not-json.safetensors", refused(&["neither a Needle 2 checkpoint", "it begins with the bytes 08 00 00 00"])),
            ("fuzz/seeds/safetensors_checkpoint/no-metadata.safetensors", refused(&["without the `format_version` metadata a Needle 3 checkpoint carries"])),
            ("fuzz/seeds/safetensors_checkpoint/offsets-past-end.safetensors", refused(&["`embedding/embedding` ends at byte 4194440, past the end of the 200-byte file"])),
        ],
    );
}

#[test]
fn safetensors_adapter_regressions() {
    replay(
        "safetensors_adapter",
        fuzz_safetensors_adapter,
        vec![
            ("tests/fixtures/golden/needle3_heads/adapter.safetensors", Accepted),
            ("tests/fixtures/models/needle3_tiny.safetensors", refused(&["metadata `base` is missing"])),
            (
                "tests/fixtures/hostile/adapter3-nan-factor.safetensors",
                refused(&["`lora/stack/layers/block/self_attn/q_proj/kernel/A` holds NaN at [0, 1, 3]"]),
            ),
            (
                "tests/fixtures/hostile/adapter3-truncated.safetensors",
                refused(&["header length (bytes 0..8) is 1272, but only 636 bytes follow"]),
            ),
            (
                "tests/fixtures/hostile/adapter-huge-product.safetensors",
                refused(&[
                    "has shape [100000, 1], but the base weight [4, 48, 48] at the adapter's rank 1 needs [4, 48, 1]",
                ]),
            ),
            // Hand-made hostile seeds (`fuzz/make_seeds.py`).
            (
                "fuzz/seeds/safetensors_adapter/a-without-b.safetensors",
                refused(&["tensor `lora/stack/layers/block/self_attn/gate_proj/kernel/B` is missing"]),
            ),
            (
                "fuzz/seeds/safetensors_adapter/empty.safetensors",
                refused(&["it is 0 bytes long, shorter than the 8-byte header length"]),
            ),
            (
                "fuzz/seeds/safetensors_adapter/header-not-json.safetensors",
                refused(&["its header (bytes 8..16) is not a JSON object"]),
            ),
            (
                "fuzz/seeds/safetensors_adapter/no-factors.safetensors",
                refused(&["holds no LoRA factors (no `p/A` and `p/B` tensors for any weight `p`)"]),
            ),
            (
                "fuzz/seeds/safetensors_adapter/offsets-past-end.safetensors",
                refused(&["ends at byte 67109120, past the end of the 320-byte file"]),
            ),
        ],
    );
}

#[test]
fn cact_v3_regressions() {
    replay(
        "cact_v3",
        fuzz_cact_v3,
        vec![
            ("tests/fixtures/golden/needle3_heads/base.cact", Accepted),
            ("tests/fixtures/golden/needle3_heads/lora.cact", Accepted),
            ("tests/fixtures/golden/needle3_heads/layers3.cact", Accepted),
            (
                "tests/fixtures/golden/tiny_f32/w4.cact",
                refused(&["not a Needle 3 .cact: the first four bytes are not its tag"]),
            ),
            (
                "tests/fixtures/hostile/cact3-truncated.cact",
                refused(&["blob [97472, +3168) runs past the end of the 97455-byte file"]),
            ),
            (
                "tests/fixtures/hostile/cact3-lying-count.cact",
                refused(&["starts inside the directory, which the header's num_tensors (1154)"]),
            ),
            // Hand-made hostile seeds (`fuzz/make_seeds.py`).
            (
                "fuzz/seeds/cact_v3/directory-cut.cact",
                refused(&["the file is 260 bytes but its codebook needs bytes up to 308"]),
            ),
            (
                "fuzz/seeds/cact_v3/header-cut.cact",
                refused(&["the file is 100 bytes but its 196-byte Needle 3 header"]),
            ),
            (
                "fuzz/seeds/cact_v3/huge-count.cact",
                refused(&["num_tensors is 4294967295, whose directory would end at byte 188978561288"]),
            ),
            (
                "fuzz/seeds/cact_v3/needle2-tag.cact",
                refused(&["not a Needle 3 .cact: the first four bytes are not its tag"]),
            ),
            ("fuzz/seeds/cact_v3/tag-only.cact", refused(&["the file is 4 bytes but its 196-byte Needle 3 header"])),
        ],
    );
}
