//! `needle suite` end to end on the tiny pre-trained fixture: the report's cases in file order, each
//! verdict the contract's rule on the calls acted on, a prompt too long for the model failed and not
//! cut, the exit status the contract's, and a broken suite file an error that names its place.

use std::path::Path;
use std::process::Output;

use needle_tests::{fixture, needle};
use serde_json::Value;

fn suite(args: &[&str]) -> Output {
    let checkpoint = fixture("models/pretrained.pkl");
    let tokenizer = fixture("models/tokenizer.model");
    let mut command = needle!();
    command.args(["suite", "--checkpoint", checkpoint.to_str().unwrap(), "--tokenizer", tokenizer.to_str().unwrap()]);
    command.args(args).output().expect("needle runs")
}

fn report(output: &Output) -> Value {
    let stdout = String::from_utf8(output.stdout.clone()).unwrap();
    assert_eq!(stdout.lines().count(), 1, "one JSON line: {stdout}");
    serde_json::from_str(stdout.trim()).unwrap()
}

fn tiny() -> String {
    fixture("suites/tiny.suite.json").display().to_string()
}

#[test]
fn each_case_is_judged_on_the_calls_acted_on_and_the_exit_status_is_the_contract() {
    let output = suite(&[&tiny(), "--json"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let report = report(&output);
    let file: Value = serde_json::from_slice(&std::fs::read(tiny()).unwrap()).unwrap();
    let (cases, written) = (report["cases"].as_array().unwrap(), file["cases"].as_array().unwrap());
    assert_eq!(cases.len(), written.len());
    for (case, written) in cases.iter().zip(written) {
        for key in ["query", "category", "critical"] {
            assert_eq!(case[key], written[key], "in file order");
        }
        assert_eq!(case["expected"], written["calls"]);
    }
    // The long case does not fit the fixture's 256 positions: failed, never answered.
    let long = &cases[4];
    assert_eq!(
        (&long["reason"], &long["pass"], &long["confidence"]),
        (&"prompt too long".into(), &false.into(), &Value::Null)
    );
    assert_eq!((long["calls"].as_array().unwrap().len(), long["text"].as_str()), (0, Some("")));
    // The pre-trained fixture answers level 85 with a call of level 50, the tool's exclusive
    // maximum: that call is withheld, and the critical "invalid" case passes on the check alone.
    let invalid = &cases[2];
    assert_eq!(invalid["calls"], serde_json::json!([]), "{stderr}");
    let withheld = &invalid["withheld"][0];
    assert_eq!((&withheld["reason"], &withheld["bound"]), (&"out_of_bounds".into(), &"exclusiveMaximum".into()));
    assert_eq!(withheld["call"]["arguments"]["level"], withheld["given"]);
    assert!(invalid["text"].as_str().unwrap().contains(&withheld["call"].to_string().replace(' ', "")), "{invalid}");
    assert_eq!(invalid["pass"], true);
    for case in cases.iter().take(4) {
        let confidence = case["confidence"].as_f64().unwrap();
        assert!(confidence > 0.0 && confidence <= 1.0, "{case}");
        // A pass is the acted-on calls equal to the expected ones (these are already canonical).
        assert_eq!(case["pass"].as_bool().unwrap(), case["calls"] == case["expected"], "{case}");
    }
    let passed = cases.iter().filter(|case| case["pass"] == true).count();
    let critical_failures = cases.iter().filter(|case| case["pass"] == false && case["critical"] == true).count();
    assert_eq!((report["passed"].as_u64(), report["total"].as_u64()), (Some(passed as u64), Some(5)));
    assert_eq!(report["critical_failures"].as_u64(), Some(critical_failures as u64));
    // round(0.9 × 5) = 4 (a half, to even): with the long case failed, four passes are the most.
    let contract = passed >= 4 && critical_failures == 0;
    assert_eq!(report["contract"], contract);
    assert_eq!(output.status.code(), Some(if contract { 0 } else { 1 }), "{stderr}");
}

#[test]
fn the_gate_turns_every_turn_below_it_into_no_call_and_a_suite_wanting_none_then_passes() {
    // Only the cases that want no call, and a gate no turn reaches: the contract holds, exit 0.
    let dir = tempfile::tempdir().unwrap();
    let mut file: Value = serde_json::from_slice(&std::fs::read(tiny()).unwrap()).unwrap();
    let cases: Vec<Value> = (file["cases"].as_array().unwrap().iter())
        .filter(|case| case["calls"].as_array().unwrap().is_empty())
        .cloned()
        .chain([serde_json::json!({"query": "Please track the reminder with level 7.", "calls": [], "category": "negation", "critical": true})])
        .collect();
    file["cases"] = Value::Array(cases);
    // No bound on the level, so that the schema check lets the calls through to the gate.
    file["tools"][0]["parameters"]["properties"]["level"] = serde_json::json!({"type": "integer"});
    let path = dir.path().join("restraint.suite.json");
    std::fs::write(&path, file.to_string()).unwrap();
    let output = suite(&[path.to_str().unwrap(), "--json", "--min-confidence", "0.99999"]);
    let report = report(&output);
    assert_eq!(report["min_confidence"], 0.99999);
    let gated = &report["cases"][2];
    assert_eq!(gated["withheld"][0]["reason"], "below_confidence", "{gated}");
    assert_eq!(gated["withheld"][0]["call"]["name"], "track_reminder");
    assert!(gated["confidence"].as_f64().unwrap() < 0.99999);
    assert_eq!((&report["passed"], &report["contract"]), (&3.into(), &true.into()));
    assert_eq!(output.status.code(), Some(0));
}

#[test]
fn a_broken_suite_is_an_error_naming_the_file_the_case_and_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("broken.suite.json");
    let mut file: Value = serde_json::from_slice(&std::fs::read(tiny()).unwrap()).unwrap();
    file["cases"][1]["category"] = "postive".into();
    std::fs::write(&path, file.to_string()).unwrap();
    let output = suite(&[path.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    let want = format!("{}: cases[1].category: is \"postive\"; use one of positive", path.display());
    assert!(stderr.contains(&want), "{stderr}");
    assert!(output.stdout.is_empty());
    let missing = suite(&[Path::new("/nonexistent/s.json").to_str().unwrap()]);
    assert_eq!(missing.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("cannot read suite /nonexistent/s.json"));
}
