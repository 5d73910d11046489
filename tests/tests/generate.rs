//! `needle generate-data` and `needle data`'s doctor end to end, against an OpenAI-compatible endpoint
//! on loopback (`fake_llm`) that answers well, with prose around the JSON, with malformed or truncated
//! JSON, with rows that break the schema or repeat, busy (429), failing (500), stalled, or refusing the
//! key (401).

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use needle_tests::fake_llm::{Answer, FakeLlm};
use needle_tests::{fixture, needle};
use serde_json::{json, Value};

const KEY: &str = "sk-test";

fn tools() -> Value {
    json!([{"name": "set_alarm", "description": "Set an alarm", "parameters": {"type": "object", "properties": {
        "time": {"type": "string"}, "repeat": {"type": "string", "enum": ["daily", "weekdays"]}}, "required": ["time"]}}])
}

fn alarm(query: &str, time: &str) -> Value {
    json!({"query": query, "reasoning": "time from the query", "answers": [{"name": "set_alarm", "arguments": {"time": time}}]})
}

fn reply(rows: &[Value]) -> Answer {
    Answer::Reply(Value::Array(rows.to_vec()).to_string())
}

/// `needle generate-data` at `llm` with the key set, other settings from `extra`.
fn generate(llm: &FakeLlm, dir: &Path, extra: &[&str]) -> Command {
    let tools_path = dir.join("tools.json");
    std::fs::write(&tools_path, tools().to_string()).unwrap();
    let mut command = needle!();
    command
        .current_dir(dir)
        .env_remove("OPENROUTER_API_KEY")
        .env("OPENAI_API_KEY", KEY)
        .env("OPENROUTER_URL", llm.url())
        .arg("generate-data")
        .arg("--tools")
        .arg(&tools_path)
        .args(["--workers", "1", "--events", "jsonl"])
        .args(extra);
    command
}

fn events(output: &Output) -> Vec<Value> {
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON event"))
        .collect()
}

/// The last event, which says the file is written.
fn written(output: &Output) -> Value {
    assert!(output.status.success(), "needle failed: {}", String::from_utf8_lossy(&output.stderr));
    events(output).pop().filter(|e| e["event"] == "written").expect("a written event last")
}

fn rows(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path).unwrap().lines().map(|line| serde_json::from_str(line).unwrap()).collect()
}

#[test]
fn good_replies_become_rows_with_their_tools() {
    let llm = FakeLlm::start([], reply(&[alarm("Wake me at 6:45", "6:45"), alarm("Alarm for 7 tomorrow", "7")]));
    let dir = tempfile::tempdir().unwrap();
    let output = generate(&llm, dir.path(), &["--num-samples", "2", "--batch-size", "2"]).output().unwrap();
    let done = written(&output);
    assert_eq!((done["generated"].as_u64(), done["failed_requests"].as_u64()), (Some(2), Some(0)));
    let written = rows(&dir.path().join("needle_data.jsonl"));
    assert_eq!(written.len(), 2);
    assert!(written.iter().all(|row| row["tools"] == tools()));
    let seen = llm.seen();
    assert_eq!(seen[0].authorization.as_deref(), Some("Bearer sk-test"));
    assert_eq!(seen[0].body["model"], "deepseek/deepseek-v4-flash");
    let prompt = seen[0].body["messages"][1]["content"].as_str().unwrap();
    assert!(prompt.contains("\"set_alarm\"") && prompt.contains("Write 2 different examples"), "{prompt}");
}

#[test]
fn prose_malformed_truncated_and_schema_breaking_replies_are_counted_by_reason() {
    let good = alarm("Wake me at 6:45", "6:45");
    let llm = FakeLlm::start(
        [
            Answer::Reply(format!("Sure! Here are your examples:\n```json\n{}\n```\nLet me know.", json!([good]))),
            Answer::Reply("[{\"query\": \"Wake me at 9\", \"answers\": [{\"name\": \"set_al".into()),
            Answer::Body("<html>not a completion</html>".into()),
            reply(&[
                good.clone(),
                json!({"query": "Play jazz", "answers": [{"name": "play_music", "arguments": {}}]}),
                json!({"query": "Wake me", "answers": [{"name": "set_alarm", "arguments": {}}]}),
                json!({"query": "Wake me at 5", "answers": [{"name": "set_alarm", "arguments": {"time": 5}}]}),
                json!({"query": "At 5 hourly", "answers": [{"name": "set_alarm", "arguments": {"time": "5", "repeat": "hourly"}}]}),
                json!({"query": "no answers at all"}),
                alarm("Set one for 8:10", "8:10"),
            ]),
        ],
        Answer::Status { status: 500, retry_now: true },
    );
    let dir = tempfile::tempdir().unwrap();
    let output = generate(&llm, dir.path(), &["--num-samples", "2", "--batch-size", "1"]).output().unwrap();
    let done = written(&output);
    assert_eq!(done["generated"], 2);
    assert_eq!(done["failed_requests"], 1, "the body that is not a completion");
    assert_eq!(
        done["rejected"],
        json!({"duplicate_row": 1, "missing_argument": 1, "not_an_example": 1, "not_in_enum": 1,
               "unknown_tool": 1, "unreadable_reply": 1, "wrong_type": 1})
    );
    let queries: Vec<Value> = rows(&dir.path().join("needle_data.jsonl")).iter().map(|r| r["query"].clone()).collect();
    assert_eq!(queries, [json!("Wake me at 6:45"), json!("Set one for 8:10")]);
}

#[test]
fn busy_and_failing_servers_are_retried_and_persistent_failure_is_an_error() {
    let llm = FakeLlm::start(
        [Answer::Status { status: 429, retry_now: true }, Answer::Status { status: 503, retry_now: true }],
        reply(&[alarm("Wake me at 6:45", "6:45")]),
    );
    let dir = tempfile::tempdir().unwrap();
    let output = generate(&llm, dir.path(), &["--num-samples", "1", "--batch-size", "1"]).output().unwrap();
    let done = written(&output);
    assert_eq!((done["generated"].as_u64(), done["failed_requests"].as_u64()), (Some(1), Some(0)));
    assert_eq!(llm.seen().len(), 3, "429, 503, then the reply");

    let llm = FakeLlm::start([], Answer::Status { status: 500, retry_now: true });
    let output = generate(&llm, dir.path(), &["--num-samples", "1", "--batch-size", "1"]).output().unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("no example was generated: 3 request(s) failed") && stderr.contains("answered 500"),
        "{stderr}"
    );
    assert_eq!(llm.seen().len(), 12, "3 requests (the reference's limit for 1 row), 4 tries each");
}

#[test]
fn a_stalled_request_times_out_and_the_next_one_is_asked() {
    let llm = FakeLlm::start([Answer::Stall(Duration::from_secs(30))], reply(&[alarm("Wake me at 6:45", "6:45")]));
    let dir = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let output =
        generate(&llm, dir.path(), &["--num-samples", "1", "--batch-size", "1", "--timeout", "1"]).output().unwrap();
    let done = written(&output);
    assert_eq!((done["generated"].as_u64(), done["failed_requests"].as_u64()), (Some(1), Some(1)));
    assert!(started.elapsed() < Duration::from_secs(20), "took {:?}", started.elapsed());
    let failure = events(&output).into_iter().find(|e| e["event"] == "request_failed").unwrap();
    assert!(failure["message"].as_str().unwrap().contains("did not answer in time"), "{failure}");
}

#[test]
fn a_wrong_key_stops_at_once_and_names_the_variables() {
    let llm = FakeLlm::start([], reply(&[alarm("Wake me at 6:45", "6:45")]));
    llm.require_key("sk-right");
    let dir = tempfile::tempdir().unwrap();
    let output = generate(&llm, dir.path(), &["--num-samples", "50", "--batch-size", "5"]).output().unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("refused the key (401") && stderr.contains("OPENROUTER_API_KEY"), "{stderr}");
    assert!(!dir.path().join("needle_data.jsonl").exists());
}

#[test]
fn without_a_key_openrouter_is_not_asked_and_the_variables_are_named() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("tools.json"), tools().to_string()).unwrap();
    let output = needle!()
        .current_dir(dir.path())
        .env_remove("OPENROUTER_API_KEY")
        .env_remove("OPENAI_API_KEY")
        .env_remove("OPENROUTER_URL")
        .args(["generate-data", "--tools", "tools.json"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    for variable in ["OPENROUTER_API_KEY", "OPENAI_API_KEY", "OPENROUTER_URL", "--endpoint"] {
        assert!(stderr.contains(variable), "{variable} not in {stderr}");
    }
}

#[test]
fn cancel_keeps_the_rows_that_arrived() {
    let llm = FakeLlm::start([reply(&[alarm("Wake me at 6:45", "6:45")])], Answer::Stall(Duration::from_secs(60)));
    let dir = tempfile::tempdir().unwrap();
    let mut child = generate(&llm, dir.path(), &["--num-samples", "5", "--batch-size", "1"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let progress = lines.by_ref().map(|line| serde_json::from_str::<Value>(&line.unwrap()).unwrap());
    let first = progress.take_while(|event| event["generated"] != 1).count();
    assert!(first < 5, "the first row was announced");
    writeln!(child.stdin.take().unwrap(), "cancel").unwrap();
    let rest: Vec<Value> = lines.map(|line| serde_json::from_str(&line.unwrap()).unwrap()).collect();
    assert!(child.wait().unwrap().success());
    let done = rest.last().unwrap();
    assert_eq!(
        (done["event"].as_str(), done["cancelled"].as_bool(), done["generated"].as_u64()),
        (Some("written"), Some(true), Some(1))
    );
    assert_eq!(rows(&dir.path().join("needle_data.jsonl")).len(), 1);
}

#[test]
fn augment_writes_the_originals_then_the_new_rows_without_repeating_them() {
    let dir = tempfile::tempdir().unwrap();
    let original = std::fs::read_to_string(fixture("../../examples/smart_home.jsonl")).unwrap();
    std::fs::write(dir.path().join("home.jsonl"), &original).unwrap();
    let first: Value = serde_json::from_str(original.lines().next().unwrap()).unwrap();
    let new = json!({"query": "Set a 9 minute timer for the rice",
                     "answers": [{"name": "start_timer", "arguments": {"minutes": 9, "label": "rice"}}]});
    let llm = FakeLlm::start([], reply(&[json!({"query": first["query"], "answers": first["answers"]}), new.clone()]));
    let output = needle!()
        .current_dir(dir.path())
        .env("OPENROUTER_API_KEY", KEY)
        .args(["generate-data", "--augment", "home.jsonl", "--num-samples", "1", "--batch-size", "2", "--workers", "1"])
        .args(["--endpoint", llm.url()])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("rejected  1 duplicate_row") && stdout.contains("wrote     24 examples"), "{stdout}");
    let written = std::fs::read_to_string(dir.path().join("home.augmented.jsonl")).unwrap();
    assert!(written.starts_with(&original), "the originals come first, as they were");
    let added: Value = serde_json::from_str(written.lines().last().unwrap()).unwrap();
    assert_eq!(added["query"], new["query"]);
    let offered: Vec<&str> = added["tools"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(offered, ["set_thermostat", "turn_on_lights", "start_timer"], "every tool of the file, each once");
}

#[test]
fn the_doctor_reports_in_data_and_fix_writes_the_rows_that_pass() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data.jsonl");
    let lines = [
        json!({"query": "Wake me at 6:45", "tools": tools(), "answers": [{"name": "set_alarm", "arguments": {"time": "6:45"}}]}),
        json!({"query": "wake me at 6:45", "tools": tools(), "answers": [{"name": "set_alarm", "arguments": {"time": "6:45"}}]}),
        json!({"query": "Wake me up", "tools": tools(), "answers": [{"name": "set_alarm", "arguments": {}}]}),
        json!({"query": "Alarm at seven", "tools": tools(), "answers": [{"name": "set_alarm", "arguments": {"time": "7:00"}}]}),
    ];
    let text: String = lines.iter().map(|line| format!("{line}\n")).collect();
    std::fs::write(&data, text + "not json\n").unwrap();
    let fixed = dir.path().join("fixed.jsonl");
    let output = needle!()
        .arg("data")
        .arg(&data)
        .arg("--tokenizer")
        .arg(fixture("models/tokenizer.model"))
        .arg("--fix")
        .arg(&fixed)
        .arg("--json")
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["usable_examples"], 4, "the report's fields stay");
    let doctor = &report["doctor"];
    assert!(doctor["summary"].as_str().unwrap().starts_with("Fix first: 1 line is not usable"), "{doctor}");
    let kinds: Vec<(&str, &Value)> =
        doctor["findings"].as_array().unwrap().iter().map(|f| (f["kind"].as_str().unwrap(), &f["lines"])).collect();
    assert_eq!(
        kinds[..3],
        [("missing_argument", &json!([3])), ("duplicate_row", &json!([2])), ("ungrounded", &json!([4]))]
    );
    let kept: Vec<String> = std::fs::read_to_string(&fixed).unwrap().lines().map(str::to_owned).collect();
    assert_eq!(kept, [lines[0].to_string(), lines[3].to_string()]);
    assert!(String::from_utf8_lossy(&output.stderr).contains("2 rows written"));
}

#[test]
fn finetune_generate_trains_on_the_augmented_file() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("calls.jsonl");
    std::fs::copy(fixture("data/tool_calls.jsonl"), &data).unwrap();
    // A row for the fixture's log_workout tool that no fixture row has.
    let row = json!({"query": "Log 40 minutes of zebra riding",
                     "answers": [{"name": "log_workout", "arguments": {"activity": "zebra riding", "minutes": 40}}]});
    let llm = FakeLlm::start([], reply(&[row]));
    let plan = |extra: &[&str]| {
        let output = needle!()
            .arg("finetune")
            .arg(&data)
            .arg("--checkpoint")
            .arg(fixture("models/tiny_f32.pkl"))
            .args(["--dry-run", "--events", "jsonl", "--endpoint", llm.url()])
            .env("OPENROUTER_API_KEY", KEY)
            .args(extra)
            .output()
            .unwrap();
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        events(&output)
    };
    let before = plan(&[]).last().unwrap()["examples"].as_u64().unwrap();
    let events = plan(&["--generate", "1", "--workers", "1"]);
    assert_eq!(events.iter().find(|e| e["event"] == "written").unwrap()["generated"], 1);
    assert_eq!(events.last().unwrap()["examples"].as_u64(), Some(before + 1), "the plan counts the new row");
    assert_eq!(rows(&dir.path().join("calls.augmented.jsonl")).len(), 99, "the file's 98 lines, then the new row");
}
