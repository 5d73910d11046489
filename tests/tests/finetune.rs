//! `needle finetune` end to end on the fixtures: events, adapter files other commands accept,
//! input errors before training, and held-out loss going down.

use std::path::Path;
use std::process::Output;

use needle_tests::{fixture, needle};
use serde_json::Value;

fn finetune(stem: &str, out: &Path, extra: &[&str]) -> Output {
    needle!()
        .arg("finetune")
        .arg(fixture("data/tool_calls.jsonl"))
        .arg("--checkpoint")
        .arg(fixture(&format!("models/{stem}.pkl")))
        .arg("--out")
        .arg(out)
        .args(["--events", "jsonl"])
        .args(extra)
        .output()
        .expect("needle runs")
}

fn events(output: &Output) -> Vec<Value> {
    assert!(output.status.success(), "needle failed: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON event per line"))
        .collect()
}

fn kinds(events: &[Value]) -> Vec<&str> {
    events.iter().map(|e| e["event"].as_str().expect("an event tag")).collect()
}

fn eval_loss(stem: &str, adapter: Option<&Path>) -> f64 {
    let mut command = needle!();
    command
        .arg("eval")
        .arg(fixture("data/tool_calls.jsonl"))
        .arg("--checkpoint")
        .arg(fixture(&format!("models/{stem}.pkl")))
        .args(["--max-len", "128", "--json"]);
    if let Some(adapter) = adapter {
        command.arg("--lora").arg(adapter);
    }
    let output = command.output().expect("needle runs");
    assert!(output.status.success(), "eval failed: {}", String::from_utf8_lossy(&output.stderr));
    let summary: Value = serde_json::from_slice(&output.stdout).expect("eval --json prints JSON");
    summary["loss"].as_f64().expect("a loss")
}

#[test]
fn one_epoch_emits_typed_events_and_writes_an_adapter_eval_accepts() {
    let dir = tempfile::tempdir().unwrap();
    let adapter = dir.path().join("tiny.safetensors");
    // A head left beside an earlier adapter of that name belongs to other weights.
    let stale_head = adapter.with_extension("safetensors.head.safetensors");
    std::fs::write(&stale_head, b"a head fitted to other weights").unwrap();
    let events = events(&finetune("tiny_f32", &adapter, &["--epochs", "1", "--max-len", "128", "--batch-size", "32"]));
    let kinds = kinds(&events);
    assert_eq!(kinds.first(), Some(&"started"));
    assert_eq!(kinds[kinds.len() - 4..], ["epoch", "saved", "scoring", "finished"]);
    let started = &events[0];
    let steps = started["steps"].as_u64().unwrap();
    // 97 usable examples, int(97 · 0.1) = 9 held out, 88 in batches of 32.
    assert_eq!((started["examples"].as_u64(), started["validation"].as_u64(), steps), (Some(88), Some(9), 3));
    assert_eq!(kinds.iter().filter(|k| **k == "step").count() as u64, steps);
    assert!(events.iter().filter(|e| e["event"] == "step").all(|e| e["loss"].as_f64().unwrap().is_finite()));
    assert!(events[events.len() - 4]["val"].as_f64().unwrap().is_finite());
    let finished = events.last().unwrap();
    assert_eq!(finished["partial"], false);
    // The held-out examples were answered by the base and the tuned model.
    for model in ["base", "tuned"] {
        assert_eq!(finished["accuracy"][model]["calls"]["examples"].as_u64(), Some(9), "{finished}");
        assert!(finished["accuracy"][model]["loss"].as_f64().unwrap().is_finite(), "{finished}");
    }
    assert!(adapter.with_extension("safetensors.state.safetensors").exists());
    // Not asked for, no confidence head is fitted (no event says one was, or why not), and the stale
    // one is gone.
    assert!(!stale_head.exists());
    assert!(eval_loss("tiny_f32", Some(&adapter)).is_finite());
}

#[test]
fn fine_tuning_lowers_the_held_out_loss_of_the_pretrained_fixture() {
    let dir = tempfile::tempdir().unwrap();
    let adapter = dir.path().join("pretrained.pkl");
    let settings = [
        "--epochs",
        "3",
        "--lr",
        "3e-3",
        "--max-len",
        "128",
        "--val-split",
        "0.2",
        "--lora-rank",
        "8",
        "--lora-alpha",
        "16",
        "--confidence",
    ];
    let events = events(&finetune("pretrained", &adapter, &settings));
    let vals: Vec<f64> = events.iter().filter(|e| e["event"] == "epoch").map(|e| e["val"].as_f64().unwrap()).collect();
    assert_eq!(vals.len(), 3);
    assert!(vals[2] < vals[0], "validation loss went {vals:?}");
    // The base model is confidently wrong on the fixture's unseen tools; the adapter must fix much of it.
    let (before, after) = (eval_loss("pretrained", None), eval_loss("pretrained", Some(&adapter)));
    assert!(after < before - 1.0, "eval loss {before} → {after}");
    // Asked for, the confidence head is fitted to the tuned model and kept beside the adapter, an
    // event says so with the rows it labelled and its time (before the held-out scoring), and it
    // reads the tuned model's held-out answers (the base has none).
    let head = dir.path().join("pretrained.pkl.head.safetensors");
    assert!(head.exists());
    let kinds = kinds(&events);
    let fitted = kinds.iter().position(|&kind| kind == "head_fitted").expect("a head_fitted event");
    assert_eq!(kinds[fitted + 1..], ["scoring", "finished"]);
    let fitted = &events[fitted];
    assert_eq!(fitted["path"].as_str(), head.to_str());
    assert_eq!(fitted["rows"], events[0]["examples"], "{fitted}");
    assert!(fitted["right"].as_u64().unwrap() < fitted["rows"].as_u64().unwrap(), "{fitted}");
    assert!(fitted["seconds"].as_f64().unwrap() > 0.0, "{fitted}");
    let accuracy = &events.last().unwrap()["accuracy"];
    let wrong = |model: &str| accuracy[model]["wrong"].as_array().unwrap().clone();
    assert!(!wrong("tuned").is_empty(), "{accuracy}");
    assert!(wrong("tuned").iter().all(|answer| answer["head"].as_f64().is_some()), "{accuracy}");
    assert!(wrong("base").iter().all(|answer| answer["head"].is_null()), "{accuracy}");
}

#[test]
fn out_of_range_flags_fail_before_training_and_name_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let adapter = dir.path().join("never.pkl");
    for (flag, value) in [("--lora-rank", "0"), ("--lr", "0"), ("--batch-size", "0"), ("--epochs", "0")] {
        let output = finetune("tiny_f32", &adapter, &[flag, value]);
        assert!(!output.status.success(), "{flag} {value} was accepted");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(&format!("{flag} {value} is out of range")), "{stderr}");
        assert!(!adapter.exists());
    }
}

#[test]
fn dry_run_prints_the_plan_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let adapter = dir.path().join("plan.pkl");
    let plan = events(&finetune("tiny_f32", &adapter, &["--dry-run", "--epochs", "2", "--batch-size", "16"]));
    assert_eq!(plan.len(), 1);
    assert_eq!((plan[0]["examples"].as_u64(), plan[0]["steps"].as_u64()), (Some(88), Some(12)));
    assert!(plan[0]["memory_estimate_bytes"].as_u64().unwrap() > 0);
    // How the step keeps within the activation budget, and the time from a timed step.
    assert!(plan[0]["recompute"].is_boolean());
    assert!((1..=16).contains(&plan[0]["micro_batch"].as_u64().unwrap()), "{}", plan[0]);
    assert!(plan[0]["seconds_estimate"].as_f64().unwrap() > 0.0);
    assert!(!adapter.exists());
}

#[test]
fn a_run_whose_answers_all_lie_past_the_sequence_length_is_refused_before_training() {
    let dir = tempfile::tempdir().unwrap();
    let adapter = dir.path().join("nothing.pkl");
    // The fixture's shortest prompt is 91 tokens: at 64 positions no answer token is left to learn.
    let output = finetune("tiny_f32", &adapter, &["--max-len", "64"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(stderr.contains("no training row's answer fits in 64 positions"), "{stderr}");
    assert!(stderr.contains("tool_calls.jsonl") && stderr.contains("shortest prompt takes 92"), "{stderr}");
    assert!(!adapter.exists());
}

#[test]
fn a_preset_fills_the_settings_that_no_flag_beside_it_gives() {
    let dir = tempfile::tempdir().unwrap();
    let plan = |extra: &[&str]| {
        let plan = events(&finetune("tiny_f32", &dir.path().join("plan.pkl"), &[&["--dry-run"], extra].concat()));
        (plan[0]["validation"].as_u64(), plan[0]["steps"].as_u64(), plan[0]["trainable_parameters"].as_u64().unwrap())
    };
    // Quick: val split 0.2 (19 of 97 held out), batch 4 (20 steps an epoch), 6 epochs, rank 8.
    let (validation, steps, quick_rank) = plan(&["--preset", "quick"]);
    assert_eq!((validation, steps), (Some(19), Some(120)));
    let (_, steps, half_rank) = plan(&["--preset", "quick", "--epochs", "2", "--lora-rank", "4"]);
    assert_eq!((steps, half_rank * 2), (Some(40), quick_rank));
    // Without a preset the reference's recipe: val split 0.1, batch 16, 3 epochs, rank 16.
    let (validation, steps, recipe_rank) = plan(&[]);
    assert_eq!((validation, steps, recipe_rank), (Some(9), Some(18), quick_rank * 2));
    let refused = finetune("tiny_f32", &dir.path().join("plan.pkl"), &["--preset", "fast"]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && stderr.contains("quick, balanced, thorough"), "{stderr}");
}

#[test]
fn a_worker_whose_reader_goes_away_saves_what_it_learned_and_exits_cleanly() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;

    let dir = tempfile::tempdir().unwrap();
    let adapter = dir.path().join("orphan.safetensors");
    let mut child = needle!()
        .arg("finetune")
        .arg(fixture("data/tool_calls.jsonl"))
        .arg("--checkpoint")
        .arg(fixture("models/tiny_f32.pkl"))
        .arg("--out")
        .arg(&adapter)
        .args(["--events", "jsonl", "--epochs", "500", "--max-len", "128", "--batch-size", "8"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("needle starts");
    // Read until training is under way, then close the pipe as a closing app would.
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let under_way = lines.by_ref().map_while(Result::ok).any(|line| line.contains("\"event\":\"step\""));
    assert!(under_way, "the worker never reported a step");
    drop(lines);
    let output = child.wait_with_output().expect("needle ends");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success() && !stderr.contains("panicked"), "{stderr}");
    assert!(adapter.exists(), "the partial adapter was saved");
}

#[test]
fn data_into_a_closed_pipe_is_not_a_panic() {
    use std::io::Read;
    use std::process::Stdio;

    let mut child = needle!()
        .arg("data")
        .arg(fixture("data/tool_calls.jsonl"))
        .arg("--tokenizer")
        .arg(fixture("models/tokenizer.model"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("needle starts");
    drop(child.stdout.take()); // `| head -0`
    let mut stderr = String::new();
    child.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
    child.wait().unwrap();
    assert!(!stderr.contains("panicked"), "{stderr}");
}
