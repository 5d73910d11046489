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
fn a_negative_share_is_asked_for_and_each_category_keeps_to_its_share() {
    let no_call = |query: &str| json!({"query": query, "answers": []});
    let llm = FakeLlm::start(
        [
            reply(&[
                alarm("Wake me at 6:45", "6:45"),
                alarm("Alarm for 7 tomorrow", "7"),
                alarm("Set one for 8:10", "8:10"),
                no_call("Don't set an alarm for 6"),
            ]),
            reply(&[no_call("What's the weather?"), alarm("Alarm at 5:30", "5:30")]),
        ],
        Answer::Status { status: 500, retry_now: true },
    );
    let dir = tempfile::tempdir().unwrap();
    let args = ["--num-samples", "4", "--batch-size", "4", "--negative-share", "0.5"];
    let done = written(&generate(&llm, dir.path(), &args).output().unwrap());
    assert_eq!(done["generated"], 4);
    assert_eq!(done["rejected"], json!({"share_full": 2}), "the third and fourth alarms: two of four call");
    let kept = rows(&dir.path().join("needle_data.jsonl"));
    let without_call = kept.iter().filter(|row| row["answers"] == json!([])).count();
    assert_eq!((kept.len(), without_call), (4, 2));
    let prompt = llm.seen()[0].body["messages"][1]["content"].as_str().unwrap().to_owned();
    assert!(prompt.contains("Of the 4 examples, write 2 that must get no call"), "{prompt}");
    assert!(prompt.contains("leaves out a value a schema requires"), "{prompt}");

    let output = generate(&llm, dir.path(), &["--negative-share", "1.5"]).output().unwrap();
    let error = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success() && error.contains("--negative-share is 1.5"), "{error}");
}

/// A case of a suite as the LLM writes it.
fn case(query: &str, category: &str, calls: Value) -> Value {
    json!({"query": query, "category": category, "calls": calls})
}

fn alarm_call(time: &str) -> Value {
    json!({"name": "set_alarm", "arguments": {"time": time}})
}

#[test]
fn a_suite_for_the_tools_is_checked_case_by_case_and_repeats_no_query_of_the_data() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("alarms.jsonl");
    let lines: Vec<String> = [("Wake me at 6:45", "6:45"), ("Alarm for 7 tomorrow", "7")]
        .iter()
        .map(|(query, time)| json!({"query": query, "tools": tools(), "answers": [alarm_call(time)]}).to_string())
        .collect();
    std::fs::write(&data, lines.join("\n") + "\n").unwrap();
    let llm = FakeLlm::start(
        [
            // The one new training row.
            reply(&[alarm("Alarm at 5:30", "5:30")]),
            // The suite's first request: three good positive cases and a missing one, and the rest refused.
            reply(&[
                case("Set an alarm for 9:15", "positive", json!([alarm_call("9:15")])),
                case("Alarm at 10:20 please", "positive", json!([alarm_call("10:20")])),
                case("I need an alarm at 11:05", "positive", json!([alarm_call("11:05")])),
                case("Set an alarm", "missing", json!([])),
                case("WAKE ME AT 6:45", "positive", json!([alarm_call("6:45")])),
                case("Alarm at 5:30", "positive", json!([alarm_call("5:30")])),
                case(
                    "Alarm at 4:40 hourly",
                    "positive",
                    json!([{"name": "set_alarm", "arguments": {"time": "4:40", "repeat": "hourly"}}]),
                ),
                case("Alarm at 12:00", "missing", json!([alarm_call("12:00")])),
                case("Wake me later", "positive", json!([alarm_call("7:00")])),
            ]),
            // The second asks for what is missing.
            reply(&[
                case("Alarm for 3:25", "positive", json!([alarm_call("3:25")])),
                case(
                    "Alarm for 2:50, daily",
                    "positive",
                    json!([{"name": "set_alarm", "arguments": {"time": "2:50", "repeat": "daily"}}]),
                ),
                case("Alarm for 1:10", "positive", json!([alarm_call("1:10")])),
                case("Order a pizza", "irrelevant", json!([])),
                case("Don't set an alarm for 8", "negation", json!([])),
            ]),
        ],
        Answer::Status { status: 500, retry_now: true },
    );
    let suite_path = dir.path().join("alarms.suite.json");
    let output = needle!()
        .current_dir(dir.path())
        .env("OPENROUTER_API_KEY", KEY)
        .args(["generate-data", "--augment", "alarms.jsonl", "--num-samples", "1", "--batch-size", "1"])
        .args(["--workers", "1", "--events", "jsonl", "--endpoint", llm.url()])
        .args(["--suite", "alarms.suite.json", "--suite-cases", "8"])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let all = events(&output);
    let done = all.last().unwrap();
    assert_eq!((done["event"].as_str(), done["cases"].as_u64()), (Some("suite_written"), Some(8)));
    assert_eq!(
        done["rejected"],
        json!({"repeated_query": 2, "call_outside_schema": 1, "calls_unfit_for_category": 1, "ungrounded": 1,
               "category_full": 1})
    );
    // 8 cases in upstream's proportions: 4.5 positive, 1 missing, 0.75 irrelevant and negation, 0.5 invalid
    // and parallel, the largest remainders rounded up.
    let wanted = json!({"positive": 5, "missing": 1, "irrelevant": 1, "negation": 1, "invalid": 0, "parallel": 0});
    assert_eq!(done["wanted"], wanted);
    assert!(all.iter().any(|e| e["event"] == "written"), "the rows are written first");

    let suite = needle_engine::suite::Suite::load(&suite_path).expect("the suite needle suite reads");
    assert_eq!(suite.name, "alarms");
    assert_eq!(suite.tools, tools().as_array().unwrap().clone());
    let categories: Vec<(&str, bool)> = suite.cases.iter().map(|c| (c.category.name(), c.critical)).collect();
    assert_eq!(
        categories,
        [
            ("positive", false),
            ("positive", false),
            ("positive", false),
            ("positive", false),
            ("positive", false),
            ("missing", true),
            ("irrelevant", false),
            ("negation", true)
        ]
    );
    let trained: Vec<String> = rows(&dir.path().join("alarms.augmented.jsonl"))
        .iter()
        .map(|row| row["query"].as_str().unwrap().to_lowercase())
        .collect();
    assert_eq!(trained.len(), 3);
    for case in &suite.cases {
        assert!(!trained.contains(&case.query.to_lowercase()), "{} is a training row's query", case.query);
    }
    let seen = llm.seen();
    let ask = |n: usize| seen[n].body["messages"][1]["content"].as_str().unwrap().to_owned();
    assert!(ask(1).contains("- 5 positive: ") && ask(1).contains("- 1 missing: "), "{}", ask(1));
    let second = ask(2);
    assert!(second.contains("- 2 positive: ") && second.contains("- 1 negation: "), "{second}");
    assert!(!second.contains("missing:"), "a category already whole is not asked for again: {second}");
}

#[test]
fn a_suite_alone_writes_no_rows_and_a_suite_without_a_case_is_an_error() {
    let llm = FakeLlm::start(
        [reply(&[case("Set an alarm for 9:15", "positive", json!([alarm_call("9:15")]))])],
        reply(&[case("Wake me whenever", "positive", json!([alarm_call("6:00")]))]),
    );
    let dir = tempfile::tempdir().unwrap();
    let args = ["--num-samples", "0", "--suite", "one.suite.json", "--suite-cases", "1"];
    let output = generate(&llm, dir.path(), &args).output().unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(!dir.path().join("needle_data.jsonl").exists());
    let suite = needle_engine::suite::Suite::load(&dir.path().join("one.suite.json")).unwrap();
    assert_eq!(suite.cases.len(), 1);

    // Every later reply's case is ungrounded: eight requests, nothing kept, nothing written.
    let args = ["--num-samples", "0", "--suite", "none.suite.json"];
    let output = generate(&llm, dir.path(), &args).output().unwrap();
    let error = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success() && error.contains("no case of the suite was kept (8 ungrounded)"), "{error}");
    assert!(!dir.path().join("none.suite.json").exists());
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
