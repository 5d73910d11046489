//! The `needle` binary end to end: what a user (or the app's worker) sees on stdout, stderr and in
//! the exit code.

use std::path::Path;
use std::process::Output;

use needle_engine::cact::CactFile;
use needle_engine::calls::{Reliability, Scored};
use needle_tests::{fixture, json, jsonl, needle, read};
use serde_json::Value;

fn run(args: &[&str]) -> Output {
    needle!().args(args).output().expect("needle runs")
}

fn stdout(output: &Output) -> String {
    String::from_utf8(output.stdout.clone()).expect("stdout is UTF-8")
}

fn stderr(output: &Output) -> String {
    String::from_utf8(output.stderr.clone()).expect("stderr is UTF-8")
}

fn tokenizer_path() -> String {
    fixture("models/tokenizer.model").display().to_string()
}

#[test]
fn tokenize_prints_the_reference_ids_one_array_per_line() {
    // The corpus texts without a newline of their own, one per line of the input file.
    let rows: Vec<Value> = jsonl("tokenizer/corpus.jsonl")
        .into_iter()
        .filter(|row| !row["text"].as_str().unwrap().contains('\n'))
        .collect();
    assert!(rows.len() > 100);
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("input.txt");
    let text: Vec<&str> = rows.iter().map(|row| row["text"].as_str().unwrap()).collect();
    std::fs::write(&input, text.join("\n") + "\n").unwrap();

    let output = run(&["tokenize", "--tokenizer", &tokenizer_path(), "--file", input.to_str().unwrap()]);
    assert!(output.status.success(), "{}", stderr(&output));
    let printed: Vec<Value> = stdout(&output).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(printed.len(), rows.len(), "one array per input line");
    for (row, ids) in rows.iter().zip(&printed) {
        assert_eq!(ids, &row["ids"], "ids of {:?}", row["text"]);
    }
}

#[test]
fn tokenize_text_gives_one_array_per_line_and_an_empty_line_gives_an_empty_array() {
    let golden = |text: &str| -> String {
        let rows = jsonl("tokenizer/corpus.jsonl");
        let row = rows.iter().find(|row| row["text"] == text).unwrap_or_else(|| panic!("{text:?} not in corpus"));
        row["ids"].to_string()
    };
    let output = run(&["tokenize", "--tokenizer", &tokenizer_path(), "--text", "hello\n\n<|im_end|>"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let text = stdout(&output);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines, [golden("hello"), "[]".to_string(), golden("<|im_end|>")]);
}

#[test]
fn tokenize_with_a_missing_tokenizer_names_the_file() {
    let output = run(&["tokenize", "--tokenizer", "/nonexistent/tokenizer.model", "--text", "hi"]);
    assert!(!output.status.success());
    let err = stderr(&output);
    assert!(err.contains("/nonexistent/tokenizer.model"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn data_json_reports_the_reference_sequence_length_and_the_skipped_line() {
    let data = fixture("data/tool_calls.jsonl");
    let output = run(&["data", data.to_str().unwrap(), "--tokenizer", &tokenizer_path(), "--json"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let report: Value = serde_json::from_str(stdout(&output).trim()).unwrap();

    let golden = &json("data/encoded.json")["cases"];
    let full = golden.as_array().unwrap().iter().find(|case| case["cap"] == 1024).expect("cap 1024 case");
    assert_eq!(report["seq_len"], full["max_len"]);
    assert_eq!(report["usable_examples"].as_u64().unwrap() as usize, full["ids"].as_array().unwrap().len());
    assert_eq!(report["usable_examples"].as_u64().unwrap() as usize, jsonl("data/rendered.jsonl").len());
    let lengths = &report["token_lengths"];
    assert!(lengths["min"].as_u64() <= lengths["max"].as_u64());
    let skipped: Vec<&Value> = report["problems"].as_array().unwrap().iter().filter(|p| p["skipped"] == true).collect();
    assert_eq!(skipped.len(), report["skipped_lines"].as_u64().unwrap() as usize);
    assert!(skipped.iter().all(|p| p["line"].as_u64().unwrap() > 0 && !p["message"].as_str().unwrap().is_empty()));
}

#[test]
fn data_with_a_small_cap_reports_truncation_in_text() {
    let data = fixture("data/tool_calls.jsonl");
    let output = run(&["data", data.to_str().unwrap(), "--tokenizer", &tokenizer_path(), "--max-len", "64"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let text = stdout(&output);
    assert!(text.contains("seq_len   64"), "{text}");
    assert!(text.contains("truncated"), "{text}");
}

#[test]
fn data_reports_each_category_share_and_warns_when_no_row_holds_back() {
    let demo = fixture("../../examples/demo");
    let data = demo.join("smart_home.jsonl");
    let tokenizer = demo.join("needle3/tokenizer.model");
    let output = run(&["data", data.to_str().unwrap(), "--tokenizer", tokenizer.to_str().unwrap(), "--json"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let report: Value = serde_json::from_str(stdout(&output).trim()).unwrap();
    // The categories counted from the file itself: one call, two or more, none.
    let text = std::fs::read_to_string(&data).unwrap();
    let mut counted = [0u64; 3];
    for line in text.lines() {
        let row: Value = serde_json::from_str(line).unwrap();
        counted[row["answers"].as_array().unwrap().len().min(2)] += 1;
    }
    let rows = counted.iter().sum::<u64>() as f64;
    let categories = report["doctor"]["categories"].as_array().unwrap();
    for (category, rows_of) in [("positive", counted[1]), ("parallel", counted[2]), ("no_call", counted[0])] {
        let entry = categories.iter().find(|c| c["category"] == category).unwrap_or_else(|| panic!("{category}"));
        assert_eq!(entry["rows"], rows_of, "{category}");
        assert!((entry["share"].as_f64().unwrap() - rows_of as f64 / rows).abs() < 1e-12, "{category}");
    }
    assert!(counted.iter().all(|&n| n > 0), "the demo teaches all three: {counted:?}");
    let findings = report["doctor"]["findings"].as_array().unwrap();
    assert!(findings.iter().all(|f| f["kind"] != "no_restraint"), "{findings:?}");

    // The same tools with only the rows that call: the text report warns that nothing holds back.
    let dir = tempfile::tempdir().unwrap();
    let calling: Vec<&str> = text.lines().filter(|line| !line.contains("\"answers\": []")).collect();
    assert!(calling.len() < text.lines().count(), "the demo writes an empty answer as `\"answers\": []`");
    let only_calls = dir.path().join("only_calls.jsonl");
    std::fs::write(&only_calls, calling.join("\n")).unwrap();
    let output = run(&["data", only_calls.to_str().unwrap(), "--tokenizer", tokenizer.to_str().unwrap()]);
    assert!(output.status.success(), "{}", stderr(&output));
    let shown = stdout(&output);
    let warning = format!("advice    none of the {} rows answers with no call", calling.len());
    assert!(shown.contains(&warning), "{shown}");
    assert!(shown.contains(&format!(" 0 no call (0%) of {} rows", calling.len())), "{shown}");
}

#[test]
fn data_without_a_usable_example_fails_naming_the_file_and_line() {
    let data = fixture("data/bad/no_usable.jsonl");
    let output = run(&["data", data.to_str().unwrap(), "--tokenizer", &tokenizer_path()]);
    assert!(!output.status.success());
    let err = stderr(&output);
    assert!(err.contains("no usable example") && err.contains("no_usable.jsonl") && err.contains("line "), "{err}");
}

#[test]
fn backend_json_describes_the_cpu_here() {
    let output = run(&["backend", "--json"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let info: Value = serde_json::from_str(stdout(&output).trim()).unwrap();
    for key in ["backend", "device", "memory_bytes", "compiled", "reason"] {
        assert!(info.get(key).is_some(), "missing {key} in {info}");
    }
    assert!(info["compiled"].as_array().unwrap().contains(&Value::from("cpu")));
    if info["compiled"] == serde_json::json!(["cpu"]) {
        assert_eq!(info["backend"], "cpu");
        assert!(info["memory_bytes"].as_u64().unwrap() > 0);
    }
}

#[test]
fn a_forced_backend_this_build_lacks_is_an_error_not_a_cpu_run() {
    let output = needle!().env("NEEDLE_DEVICE", "cuda").args(["backend"]).output().unwrap();
    assert!(!output.status.success(), "must not fall back to the CPU");
    let err = stderr(&output);
    assert!(err.contains("CUDA") && err.contains("NEEDLE_DEVICE=cpu"), "{err}");
}

#[test]
fn an_unknown_backend_lists_the_choices() {
    let output = needle!().env("NEEDLE_DEVICE", "tpu").args(["backend"]).output().unwrap();
    assert!(!output.status.success());
    let err = stderr(&output);
    assert!(err.contains("'tpu'") && err.contains("auto, cpu, cuda, metal"), "{err}");
    let output = run(&["backend", "--device", "tpu"]);
    assert!(stderr(&output).contains("auto, cpu, cuda, metal"));
}

#[test]
fn eval_prints_the_reference_whole_file_loss_for_every_fixture() {
    let golden = json("golden/eval.json");
    let data = fixture("data/tool_calls.jsonl");
    for stem in ["tiny_f32", "tiny_f16", "pretrained"] {
        let checkpoint = fixture(&format!("models/{stem}.pkl"));
        let output = run(&["eval", data.to_str().unwrap(), "--checkpoint", checkpoint.to_str().unwrap(), "--json"]);
        assert!(output.status.success(), "{stem}: {}", stderr(&output));
        let result: Value = serde_json::from_str(stdout(&output).trim()).unwrap();
        let (ours, theirs) = (result["loss"].as_f64().unwrap(), golden[stem]["loss"].as_f64().unwrap());
        assert!(((ours - theirs) / theirs).abs() < 1e-5, "{stem}: loss {ours} vs reference {theirs}");
        assert_eq!(result["examples"], golden[stem]["examples"]);
        assert_eq!(result["seq_len"], golden[stem]["seq_len"]);
        assert_eq!(result["tokens"].as_f64(), golden[stem]["tokens"].as_f64());
    }
}

#[test]
fn build_then_inspect_verify_agrees_with_the_reference_cact() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("tuned.cact");
    let checkpoint = fixture("models/tiny_f16.pkl");
    let adapter = fixture("golden/tiny_f16/adapter.pkl");
    let output = run(&[
        "build",
        checkpoint.to_str().unwrap(),
        "--lora",
        adapter.to_str().unwrap(),
        "--bits",
        "2",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(stdout(&output).contains("wrote"), "{}", stdout(&output));
    let ours = std::fs::read(&out).unwrap();
    assert_eq!(ours, read("golden/tiny_f16/w2_lora.cact"), "tiny_f16 W2 with adapter differs from the reference");

    let output = run(&["inspect", out.to_str().unwrap(), "--json", "--verify"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let report: Value = serde_json::from_str(stdout(&output).trim()).unwrap();
    assert!(report.to_string().contains("d_model"), "{report}");

    let truncated = dir.path().join("truncated.cact");
    std::fs::write(&truncated, &ours[..ours.len() / 2]).unwrap();
    let output = run(&["inspect", truncated.to_str().unwrap()]);
    assert!(!output.status.success());
    let err = stderr(&output);
    assert!(err.contains("truncated.cact") && !err.contains("panicked"), "{err}");
}

#[test]
fn a_needle3_build_agrees_with_the_reference_and_its_cact_answers() {
    let dir = tempfile::tempdir().unwrap();
    let (checkpoint, tokenizer) = (fixture("models/needle3_heads.safetensors"), fixture("models/tokenizer.model"));
    let adapter = fixture("golden/needle3_heads/adapter.safetensors");
    let build = |out: &Path, extra: &[&str]| {
        let args = ["build", checkpoint.to_str().unwrap(), "--tokenizer", tokenizer.to_str().unwrap()];
        run(&[&args[..], &["--out", out.to_str().unwrap()], extra].concat())
    };
    for (golden, extra) in [("lora", vec!["--lora", adapter.to_str().unwrap()]), ("layers3", vec!["--layers", "3"])] {
        let out = dir.path().join(format!("{golden}.cact"));
        let output = build(&out, &extra);
        assert!(output.status.success(), "{}", stderr(&output));
        assert!(stdout(&output).contains("W4A8"), "{}", stdout(&output));
        let (ours, gold) = (
            CactFile::open(&out).unwrap(),
            CactFile::open(&fixture(&format!("golden/needle3_heads/{golden}.cact"))).unwrap(),
        );
        assert_eq!(ours.preamble(), gold.preamble(), "{golden}: header, codebooks or directory differ from 3.2.8's");
        let output = run(&["inspect", out.to_str().unwrap(), "--verify"]);
        assert!(output.status.success() && stdout(&output).contains("Needle 3 .cact"), "{}", stderr(&output));
    }

    // The built file answers with the weights and tokenizer it ships.
    let tools = dir.path().join("tools.json");
    std::fs::write(
        &tools,
        r#"[{"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]"#,
    )
    .unwrap();
    let cact = dir.path().join("lora.cact");
    let output = run(&[
        "run",
        "--weights",
        cact.to_str().unwrap(),
        "--tools",
        tools.to_str().unwrap(),
        "--query",
        "weather in Paris",
        "--json",
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    let answer: Value = serde_json::from_str(stdout(&output).trim()).unwrap();
    assert!(answer["text"].is_string(), "{answer}");

    // What a Needle 3 .cact cannot be, and what Needle 2 has no ladder for, are refused by name.
    let output = build(&dir.path().join("w2.cact"), &["--bits", "2"]);
    assert!(!output.status.success() && stderr(&output).contains("W4 only"), "{}", stderr(&output));
    let needle2 = fixture("models/tiny_f16.pkl");
    let out = dir.path().join("rung.cact");
    let output = run(&["build", needle2.to_str().unwrap(), "--layers", "2", "--out", out.to_str().unwrap()]);
    assert!(!output.status.success() && stderr(&output).contains("a Needle 2 model has none"), "{}", stderr(&output));
    let output = build(&dir.path().join("deep.cact"), &["--layers", "9"]);
    assert!(
        !output.status.success() && stderr(&output).contains("--layers must be in [2, 4], got 9"),
        "{}",
        stderr(&output)
    );
    assert!(!dir.path().join("w2.cact").exists() && !out.exists());
}

#[test]
fn needle_build_of_a_bfloat16_checkpoint_writes_the_bytes_3_2_8_writes() {
    let dir = tempfile::tempdir().unwrap();
    let checkpoint = fixture("models/needle3_bf16.safetensors");
    let adapter = fixture("golden/needle3_bf16/adapter.safetensors");
    for (golden, extra) in [("base", vec![]), ("lora", vec!["--lora", adapter.to_str().unwrap()])] {
        let out = dir.path().join(format!("{golden}.cact"));
        let args =
            ["build", checkpoint.to_str().unwrap(), "--tokenizer", &tokenizer_path(), "--out", out.to_str().unwrap()];
        let output = run(&[&args[..], &extra].concat());
        assert!(output.status.success(), "{}", stderr(&output));
        assert!(
            std::fs::read(&out).unwrap() == read(&format!("golden/needle3_bf16/{golden}.cact")),
            "{golden} differs"
        );
    }
}

#[test]
fn bench_times_training_steps_on_a_random_model_and_names_a_bad_preset() {
    let output = run(&["bench", "--preset", "tiny", "--batch", "2", "--seq", "32", "--steps", "2", "--json"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let report: Value = serde_json::from_str(stdout(&output).trim()).expect("one JSON line");
    for key in ["startup_s", "first_step_s", "step_s", "tokens_per_s", "peak_rss_mb", "estimate_mb"] {
        assert!(report[key].as_f64().is_some_and(|v| v > 0.0), "{key} in {report}");
    }
    assert!(report["first_step_s"].as_f64() >= report["step_s"].as_f64(), "{report}");
    assert!(report["first_step_s"].as_f64() > report["startup_s"].as_f64(), "{report}");
    assert!(report["loss"].as_f64().unwrap().is_finite());
    let output = run(&["bench", "--preset", "huge"]);
    assert!(!output.status.success());
    assert!(
        stderr(&output).contains("--preset huge: unknown; use `needle`, `needle3`, `mid` or `tiny`"),
        "{}",
        stderr(&output)
    );
}

/// A golden decode case as a dataset row: the tools (as written in the prompt), the query, the
/// expected calls as written and the expected reasoning.
fn golden_row(case: &Value) -> Value {
    let prompt = case["prompt"].as_str().unwrap();
    let tools = prompt.split_once("<tools>").unwrap().1.split_once("</tools>").unwrap().0;
    let query = prompt.split_once("</tools>\n").unwrap().1.split_once("<|im_end|>").unwrap().0;
    let expected = case["expected"].as_str().unwrap();
    let reasoning = expected.split_once("<think>").unwrap().1.split_once("</think>").unwrap().0;
    let answers = expected.split_once("<tool_call>").unwrap().1.split_once("</tool_call>").unwrap().0;
    serde_json::json!({"query": query, "tools": tools, "answers": answers, "reasoning": reasoning})
}

/// The tools and query of the first golden decode prompt, as `needle run` takes them.
fn golden_question(dir: &std::path::Path) -> (std::path::PathBuf, String, Value) {
    let row = golden_row(&json("golden/pretrained/decode.json")["cases"][0]);
    let path = dir.join("tools.json");
    std::fs::write(&path, row["tools"].as_str().unwrap()).unwrap();
    let expected: Value = serde_json::from_str(row["answers"].as_str().unwrap()).unwrap();
    (path, row["query"].as_str().unwrap().to_string(), expected)
}

/// The golden decode cases as a dataset file: prompts the pretrained fixture answers right about
/// half the time (4 of 8), unlike the fixture dataset's unseen tools. Only those whose tokens the
/// Needle 3 fixtures' output head scores (their `out_vocab`, 508 of the tokenizer's 512 pieces).
fn golden_questions(dir: &std::path::Path) -> std::path::PathBuf {
    let tokenizer = needle_engine::tokenizer::Tokenizer::load(&fixture("models/tokenizer.model")).unwrap();
    let rows: Vec<String> = json("golden/pretrained/decode.json")["cases"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|case| {
            let text = format!("{}{}", case["prompt"].as_str().unwrap(), case["expected"].as_str().unwrap());
            tokenizer.encode(&text).iter().all(|&id| id < 508)
        })
        .map(|case| golden_row(case).to_string())
        .collect();
    assert!(rows.len() >= 6, "{} questions left", rows.len());
    let path = dir.join("questions.jsonl");
    std::fs::write(&path, rows.join("\n")).unwrap();
    path
}

#[test]
fn run_answers_with_the_calls_the_reference_decodes_and_so_does_the_built_cact() {
    let dir = tempfile::tempdir().unwrap();
    let (tools, query, expected) = golden_question(dir.path());
    let checkpoint = fixture("models/pretrained.pkl");
    let base =
        ["run", "--checkpoint", checkpoint.to_str().unwrap(), "--tools", tools.to_str().unwrap(), "--query", &query];
    let output = run(&[&base[..], &["--json"]].concat());
    assert!(output.status.success(), "{}", stderr(&output));
    let answer: Value = serde_json::from_str(stdout(&output).trim()).expect("one JSON object");
    assert_eq!(answer["calls"], expected, "{answer}");
    assert_eq!(answer["withheld"], serde_json::json!([]), "{answer}");
    let confidence = answer["confidence"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&confidence) && answer["decode"].as_f64().is_some(), "{answer}");
    assert!(answer["text"].as_str().unwrap().starts_with("<think>"), "{answer}");
    assert!(answer["tokens_per_s"].as_f64().unwrap() > 0.0);

    let text = run(&base);
    assert!(text.status.success(), "{}", stderr(&text));
    assert!(stdout(&text).contains("call      {\"name\":\"open_package\""), "{}", stdout(&text));
    assert!(stdout(&text).contains(&format!("confident {confidence:.3}")), "{}", stdout(&text));

    // The .cact carries its tokenizer and answers with the weights that ship.
    let cact = fixture("golden/pretrained/w4.cact");
    let output = run(&[
        "run",
        "--weights",
        cact.to_str().unwrap(),
        "--tools",
        tools.to_str().unwrap(),
        "--query",
        &query,
        "--json",
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    let shipped: Value = serde_json::from_str(stdout(&output).trim()).unwrap();
    assert!(shipped["calls"].is_array() || shipped["calls"].is_null(), "{shipped}");

    let not_a_list = dir.path().join("tool.json");
    std::fs::write(&not_a_list, "{\"name\": \"x\"}").unwrap();
    let output = run(&[
        "run",
        "--checkpoint",
        checkpoint.to_str().unwrap(),
        "--tools",
        not_a_list.to_str().unwrap(),
        "--query",
        "hi",
    ]);
    assert!(!output.status.success() && stderr(&output).contains("not a list of tool schemas"), "{}", stderr(&output));
}

#[test]
fn eval_accuracy_scores_exact_calls_per_tool() {
    let data = fixture("data/tool_calls.jsonl");
    let checkpoint = fixture("models/pretrained.pkl");
    let args = [
        "eval",
        data.to_str().unwrap(),
        "--checkpoint",
        checkpoint.to_str().unwrap(),
        "--accuracy",
        "--json",
        "--max-len",
        "512",
        "--max-examples",
        "24",
    ];
    let output = run(&args);
    assert!(output.status.success(), "{}", stderr(&output));
    // To a pipe the progress is one line per update, none redrawn into the one before.
    let err = stderr(&output);
    let progress: Vec<&str> = err.lines().filter(|line| line.contains(" examples")).collect();
    assert!(progress.len() > 2, "{err}");
    assert!(progress.iter().all(|line| line.matches(" examples").count() == 1 && !line.contains('\r')), "{err}");
    let report: Value = serde_json::from_str(stdout(&output).trim()).unwrap();
    let accuracy = &report["accuracy"];
    let examples = accuracy["examples"].as_u64().unwrap();
    assert_eq!(examples, report["examples"].as_u64().unwrap(), "{report}");
    let (exact, parsed) = (accuracy["exact"].as_u64().unwrap(), accuracy["parsed"].as_u64().unwrap());
    assert!(exact <= parsed && parsed <= examples, "{accuracy}");
    let per_tool = accuracy["per_tool"].as_object().unwrap();
    let tally = |key: &str| -> u64 { per_tool.values().map(|t| t[key].as_u64().unwrap()).sum() };
    // An example counts once per tool it expects (or once as "(no call)").
    assert!(tally("total") >= examples && tally("right") >= exact, "{accuracy}");
    // Every answer is of one kind, the right ones exact; each tool's kinds add up to its total.
    let breakdown = &accuracy["breakdown"];
    let sum = |kinds: &Value| -> u64 { kinds.as_object().unwrap().values().map(|n| n.as_u64().unwrap()).sum() };
    assert_eq!(sum(&breakdown["kinds"]), examples, "{breakdown}");
    assert_eq!(breakdown["kinds"]["exact"].as_u64().unwrap_or(0), exact, "{breakdown}");
    for (tool, score) in per_tool {
        assert_eq!(sum(&breakdown["per_tool"][tool]), score["total"].as_u64().unwrap(), "{tool}: {breakdown}");
    }

    // `--answers` writes the ones answered wrong, each with what was expected and what was given.
    let dir = tempfile::tempdir().unwrap();
    let answers = dir.path().join("wrong.jsonl");
    let output = run(&[&args[..], &["--answers", answers.to_str().unwrap()]].concat());
    assert!(output.status.success(), "{}", stderr(&output));
    let text = std::fs::read_to_string(&answers).unwrap();
    let wrong: Vec<Value> = text.lines().map(|line| serde_json::from_str(line).unwrap()).collect();
    assert_eq!(wrong.len() as u64, examples - exact, "one line per wrong answer");
    for row in &wrong {
        assert_eq!(row["exact"], false, "{row}");
        let kind = row["verdict"]["kind"].as_str().unwrap();
        assert!(kind != "exact" && breakdown["kinds"][kind].as_u64().unwrap() > 0, "{row}");
        assert!(row["line"].as_u64().unwrap() > 0 && row["query"].is_string() && row["text"].is_string(), "{row}");
        assert!(row["expected"].is_array() && row["expected"] != row["given"], "{row}");
    }
    let output = run(&["eval", data.to_str().unwrap(), "--answers", answers.to_str().unwrap()]);
    assert!(!output.status.success() && stderr(&output).contains("--accuracy"), "{}", stderr(&output));

    // The confidence figures sit under accuracy.confidence, and `--all-answers` writes every answer
    // with what they are made from: recomputed from the file, they are the printed ones.
    let figures = &accuracy["confidence"];
    assert_eq!(figures["answers"].as_u64(), Some(examples), "{figures}");
    assert_eq!(figures["bins"].as_array().unwrap().len(), 10, "{figures}");
    assert_eq!(figures["tradeoff"].as_array().unwrap().len(), 21, "{figures}");
    let output = run(&[&args[..], &["--answers", answers.to_str().unwrap(), "--all-answers"]].concat());
    assert!(output.status.success(), "{}", stderr(&output));
    let every: Vec<Value> =
        std::fs::read_to_string(&answers).unwrap().lines().map(|line| serde_json::from_str(line).unwrap()).collect();
    assert_eq!(every.len() as u64, examples, "one line per answer");
    let scored: Vec<Scored> = (every.iter())
        .map(|row| {
            assert!(row["decode"].as_f64().is_some() && row.get("head").is_some(), "{row}");
            Scored { exact: row["exact"].as_bool().unwrap(), confidence: row["confidence"].as_f64().unwrap() }
        })
        .collect();
    assert_eq!(scored.iter().filter(|s| s.exact).count() as u64, exact);
    let recomputed = serde_json::to_value(Reliability::of(&scored).unwrap()).unwrap();
    assert_eq!(&recomputed, figures, "the figures from the written answers");
    let output = run(&["eval", data.to_str().unwrap(), "--accuracy", "--all-answers"]);
    assert!(!output.status.success() && stderr(&output).contains("--answers"), "{}", stderr(&output));

    // The text says why, in the JSON's words.
    let output = run(&args.iter().copied().filter(|arg| *arg != "--json").collect::<Vec<_>>());
    assert!(output.status.success(), "{}", stderr(&output));
    let text = stdout(&output);
    let wrong_line =
        text.lines().find(|line| line.trim_start().starts_with("wrong ")).unwrap_or_else(|| panic!("{text}"));
    let first_kind = breakdown["kinds"].as_object().unwrap().keys().find(|kind| *kind != "exact").unwrap();
    assert!(wrong_line.contains(&first_kind.replace('_', " ")), "{text}");
    // Each answer's confidence, and the figures over them.
    assert_eq!(text.lines().filter(|line| line.trim_start().starts_with("answer ")).count() as u64, examples, "{text}");
    for label in ["AUROC ", "ECE ", "bin ", "gate ", "proposed "] {
        assert!(text.lines().any(|line| line.trim_start().starts_with(label)), "no {label}line: {text}");
    }
}

/// A confidence head kept beside the adapter (`ADAPTER.head.safetensors`) is read wherever the tuned
/// model answers: `eval --accuracy` writes each answer's `head`, the confidence the smaller of it and
/// the decode probability, and `run --json` prints it; a broken head file is an error naming it.
#[test]
fn a_confidence_head_beside_the_adapter_is_read_by_eval_and_run() {
    use needle_engine::confidence::{companion_path, Calibration, ConfidenceHead, Reading, TrainedHead};

    let dir = tempfile::tempdir().unwrap();
    let data = golden_questions(dir.path());
    let (tools, query, _) = golden_question(dir.path());
    let checkpoint = fixture("models/pretrained.pkl");
    let adapter = dir.path().join("adapter.pkl");
    std::fs::copy(fixture("golden/pretrained/adapter.pkl"), &adapter).unwrap();
    let config = needle_engine::checkpoint::Checkpoint::load(&checkpoint).unwrap().config;
    let head = ConfidenceHead::initial(&config, &needle_engine::model::Device::Cpu, 0).unwrap();
    // A fresh head's logit is near 0: about 0.3 once calibrated, below most decode probabilities.
    let calibration = Calibration { scale: 1.0, shift: -0.8 };
    let head_file = companion_path(&adapter);
    TrainedHead { head, calibration, reads: Reading::PromptAndAnswer }.save(&head_file).unwrap();

    let (checkpoint, adapter, answers) =
        (checkpoint.to_str().unwrap(), adapter.to_str().unwrap(), dir.path().join("answers.jsonl"));
    let eval = ["eval", data.to_str().unwrap(), "--checkpoint", checkpoint, "--lora", adapter, "--accuracy", "--json"];
    let output = run(&[&eval[..], &["--answers", answers.to_str().unwrap(), "--all-answers"]].concat());
    assert!(output.status.success(), "{}", stderr(&output));
    let every: Vec<Value> =
        std::fs::read_to_string(&answers).unwrap().lines().map(|line| serde_json::from_str(line).unwrap()).collect();
    assert!(every.len() >= 6, "{} answers", every.len());
    let mut capped = 0;
    for row in &every {
        let (head, decode, confidence) =
            (row["head"].as_f64(), row["decode"].as_f64().unwrap(), row["confidence"].as_f64().unwrap());
        let head = head.unwrap_or_else(|| panic!("no head in {row}"));
        assert!((0.0..=1.0).contains(&head), "{row}");
        assert_eq!(confidence, head.min(decode), "{row}");
        capped += usize::from(head < decode);
    }
    assert!(capped > 0, "the head lowered no answer's confidence: {every:?}");

    let asked = ["run", "--checkpoint", checkpoint, "--lora", adapter, "--tools", tools.to_str().unwrap()];
    let output = run(&[&asked[..], &["--query", &query, "--json"]].concat());
    assert!(output.status.success(), "{}", stderr(&output));
    let answer: Value = serde_json::from_str(stdout(&output).trim()).unwrap();
    let head = answer["head"].as_f64().unwrap_or_else(|| panic!("no head in {answer}"));
    assert_eq!(answer["confidence"].as_f64().unwrap(), head.min(answer["decode"].as_f64().unwrap()), "{answer}");

    std::fs::write(&head_file, b"half a head").unwrap();
    let output = run(&[&asked[..], &["--query", &query]].concat());
    let message = stderr(&output);
    assert!(!output.status.success() && !message.contains("panicked"), "{message}");
    assert!(
        message.contains(&head_file.display().to_string()) && message.contains("not a safetensors file"),
        "{message}"
    );
}

/// A `.cact` answers with the confidence head it carries: `eval --weights` writes each answer's `head`
/// (here the trained head `needle build` ships, its calibration folded into the projection) and the
/// confidence is the smaller of it and the decode probability; `run --weights --json` prints it. A
/// file without one (3.2.8's build of an adapter drops the base's head) answers with the decode
/// probability alone.
#[test]
fn a_cact_answers_with_the_confidence_head_it_carries() {
    let dir = tempfile::tempdir().unwrap();
    let data = golden_questions(dir.path());
    let (tools, query, _) = golden_question(dir.path());
    let answers = dir.path().join("answers.jsonl");
    for (cact, ships_a_head) in [("lora_head.cact", true), ("lora.cact", false)] {
        let cact = fixture(&format!("golden/needle3_heads/{cact}"));
        let output = run(&[
            "eval",
            data.to_str().unwrap(),
            "--weights",
            cact.to_str().unwrap(),
            "--accuracy",
            "--json",
            "--answers",
            answers.to_str().unwrap(),
            "--all-answers",
        ]);
        assert!(output.status.success(), "{}", stderr(&output));
        let every: Vec<Value> = std::fs::read_to_string(&answers)
            .unwrap()
            .lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect();
        assert!(every.len() >= 6, "{} answers", every.len());
        let asked = ["run", "--weights", cact.to_str().unwrap(), "--tools", tools.to_str().unwrap(), "--query", &query];
        let output = run(&[&asked[..], &["--json"]].concat());
        assert!(output.status.success(), "{}", stderr(&output));
        let answer: Value = serde_json::from_str(stdout(&output).trim()).unwrap();
        for row in every.iter().chain([&answer]) {
            let (decode, confidence) = (row["decode"].as_f64().unwrap(), row["confidence"].as_f64().unwrap());
            match (ships_a_head, row["head"].as_f64()) {
                (true, Some(head)) => assert_eq!(confidence, head.min(decode), "{}: {row}", cact.display()),
                (false, None) => assert_eq!(confidence, decode, "{}: {row}", cact.display()),
                _ => panic!("{}: {row}", cact.display()),
            }
        }
        let text = run(&asked);
        assert!(text.status.success(), "{}", stderr(&text));
        let said = if ships_a_head { "; confidence head " } else { "; no confidence head)" };
        assert!(stdout(&text).contains(said), "{}", stdout(&text));
    }
}

/// `needle eval --quant-rows`: the tuned model as trained, with the deployment's quantization
/// simulated, and its golden build read back and run the same way. The simulation says what the
/// file does: within one exact call and 1% of loss, on both generations' golden builds.
#[test]
fn eval_quant_rows_agree_between_the_simulation_and_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let data = golden_questions(dir.path());
    for (checkpoint, adapter, cact) in [
        ("models/pretrained.pkl", None, "golden/pretrained/w4.cact"),
        ("models/pretrained.pkl", Some("golden/pretrained/adapter.pkl"), "golden/pretrained/w4_lora.cact"),
        (
            "models/needle3_heads.safetensors",
            Some("golden/needle3_heads/adapter.safetensors"),
            "golden/needle3_heads/lora.cact",
        ),
        (
            "models/needle3_bf16.safetensors",
            Some("golden/needle3_bf16/adapter.safetensors"),
            "golden/needle3_bf16/lora.cact",
        ),
    ] {
        let (checkpoint, adapter, cact) = (fixture(checkpoint), adapter.map(fixture), fixture(cact));
        let lora = adapter.iter().flat_map(|adapter| ["--lora", adapter.to_str().unwrap()]);
        let args = ["eval", data.to_str().unwrap(), "--checkpoint", checkpoint.to_str().unwrap(), "--accuracy"];
        let output = run(&args
            .into_iter()
            .chain(lora)
            .chain(["--quant-rows", cact.to_str().unwrap(), "--json"])
            .collect::<Vec<_>>());
        assert!(output.status.success(), "{}", stderr(&output));
        let report: Value = serde_json::from_str(stdout(&output).trim()).unwrap();
        let rows = &report["quant_rows"];
        assert_eq!(rows["float"]["calls"], report["accuracy"], "the float row is the model as given");
        let (exact, loss) = (
            |row: &str| rows[row]["calls"]["exact"].as_u64().unwrap(),
            |row: &str| rows[row]["loss"].as_f64().unwrap(),
        );
        let name = cact.display();
        assert!(exact("simulated").abs_diff(exact("cact")) <= 1, "{name}: {rows}");
        assert!((loss("simulated") - loss("cact")).abs() <= 0.01 * loss("cact"), "{name}: {rows}");
        assert!(loss("float") != loss("simulated"), "{name}: the simulation quantizes nothing: {rows}");
        eprintln!(
            "{name}: exact {} / {} / {}, loss {:.4} / {:.4} / {:.4}",
            exact("float"),
            exact("simulated"),
            exact("cact"),
            loss("float"),
            loss("simulated"),
            loss("cact")
        );
    }

    // A .cact of another model is refused before anything is scored, by name.
    let output = run(&[
        "eval",
        data.to_str().unwrap(),
        "--checkpoint",
        fixture("models/pretrained.pkl").to_str().unwrap(),
        "--accuracy",
        "--quant-rows",
        fixture("golden/needle3_heads/lora.cact").to_str().unwrap(),
    ]);
    let err = stderr(&output);
    assert!(!output.status.success() && err.contains("not a build of") && !err.contains("examples"), "{err}");
}

/// `needle eval --ladder`: every rung of the Needle 3 fixture scored as its `.cact` runs, one row
/// per depth, shallowest first, each file bigger than the last and the whole one the size of
/// 3.2.8's build; each rung's answers of one kind each. A Needle 2 model is told the ladder is
/// Needle 3's, and a cancelled sweep prints no table.
#[test]
fn eval_ladder_scores_each_rung_as_it_ships_and_a_cancel_leaves_no_table() {
    let dir = tempfile::tempdir().unwrap();
    let data = golden_questions(dir.path());
    let (checkpoint, adapter) =
        (fixture("models/needle3_heads.safetensors"), fixture("golden/needle3_heads/adapter.safetensors"));
    let args = [
        "eval",
        data.to_str().unwrap(),
        "--checkpoint",
        checkpoint.to_str().unwrap(),
        "--lora",
        adapter.to_str().unwrap(),
        "--ladder",
    ];
    let output = run(&[&args[..], &["--json"]].concat());
    assert!(output.status.success(), "{}", stderr(&output));
    let ladder: Value = serde_json::from_str(stdout(&output).trim()).unwrap();
    let rungs = ladder["rungs"].as_array().unwrap();
    let field = |key: &str| rungs.iter().map(|rung| rung[key].as_u64().unwrap()).collect::<Vec<_>>();
    assert_eq!((ladder["num_layers"].as_u64(), field("layers")), (Some(4), vec![2, 3, 4]), "{ladder}");
    let sizes = field("cact_bytes");
    assert!(sizes.windows(2).all(|pair| pair[0] < pair[1]), "{sizes:?}");
    let whole = std::fs::metadata(fixture("golden/needle3_heads/lora.cact")).unwrap().len();
    assert_eq!(sizes[2], whole, "the whole rung is the size of 3.2.8's build");
    let examples = ladder["examples"].as_u64().unwrap();
    for rung in rungs {
        let calls = &rung["calls"];
        let kinds = calls["breakdown"]["kinds"].as_object().unwrap();
        assert_eq!(kinds.values().map(|n| n.as_u64().unwrap()).sum::<u64>(), examples, "{rung}");
        assert_eq!(kinds.get("exact").and_then(Value::as_u64).unwrap_or(0), calls["exact"].as_u64().unwrap());
        assert!(calls["decode_tokens_per_s"].as_f64().unwrap() > 0.0, "{rung}");
    }

    // The text: a line per rung, its exact calls and its file's size.
    let output = run(&args);
    assert!(output.status.success(), "{}", stderr(&output));
    let text = stdout(&output);
    for (rung, bytes) in rungs.iter().zip(&sizes) {
        let calls = format!("{}/{examples}", rung["calls"]["exact"]);
        let line = text.lines().find(|line| line.trim_start().starts_with(&rung["layers"].to_string()));
        let line = line.unwrap_or_else(|| panic!("no line for rung {}: {text}", rung["layers"]));
        assert!(line.contains(&calls) && line.contains(&format!("{:.2} MB", *bytes as f64 / 1e6)), "{text}");
    }

    // Cancelled from the app (`cancel` on stdin): the events end there, and no table is printed.
    let mut child = needle!()
        .args([&args[..], &["--events", "jsonl"]].concat())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write as _;
    writeln!(child.stdin.take().unwrap(), "{}", needle_cli::CANCEL_LINE).unwrap();
    let output = child.wait_with_output().unwrap();
    let events: Vec<Value> = stdout(&output).lines().map(|line| serde_json::from_str(line).unwrap()).collect();
    assert!(!output.status.success() && stderr(&output).contains("cancelled"), "{}", stderr(&output));
    assert_eq!(events.last().map(|event| &event["event"]), Some(&Value::from("cancelled")), "{events:?}");
    assert!(events.iter().all(|event| event["event"] != "finished"), "{events:?}");

    let needle2 = fixture("models/pretrained.pkl");
    let output = run(&["eval", data.to_str().unwrap(), "--checkpoint", needle2.to_str().unwrap(), "--ladder"]);
    let err = stderr(&output);
    assert!(
        !output.status.success() && err.contains("a Needle 2 model has no depth ladder; the ladder is Needle 3's"),
        "{err}"
    );
}
