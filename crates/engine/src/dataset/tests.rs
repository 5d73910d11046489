//! Parity with the reference's goldens (made by `tests/fixtures/make_fixtures.py`) and the
//! handling of malformed files under `tests/fixtures/data/bad/`.

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::*;
use crate::generation::Generation;
use crate::tokenizer::Tokenizer;
use serde_json::json;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures");

fn fixture(relative: &str) -> PathBuf {
    Path::new(FIXTURES).join(relative)
}

fn golden_dataset() -> Dataset {
    Dataset::load(&fixture("data/tool_calls.jsonl"), Generation::Needle2).expect("the golden dataset loads")
}

fn fixture_tokenizer() -> Tokenizer {
    Tokenizer::load(&fixture("models/tokenizer.model")).expect("the fixture tokenizer loads")
}

/// `data/rendered.jsonl`: one object per example the reference trains on.
fn rendered_goldens() -> Vec<Value> {
    let text = std::fs::read_to_string(fixture("data/rendered.jsonl")).expect("rendered.jsonl is readable");
    text.lines().map(|line| serde_json::from_str(line).expect("rendered.jsonl holds JSON lines")).collect()
}

fn ids(value: &Value) -> Vec<u32> {
    serde_json::from_value(value.clone()).expect("golden ids are a list of integers")
}

fn problem_summary(problems: &[Problem]) -> Vec<(usize, Issue)> {
    problems.iter().map(|p| (p.line, p.issue.clone())).collect()
}

fn example(line: usize, query: &str) -> Example {
    Example {
        generation: Generation::Needle2,
        line,
        system: String::new(),
        query: query.to_owned(),
        reasoning: String::new(),
        tools: "[]".to_owned(),
        answers: "[]".to_owned(),
    }
}

#[test]
fn needle3_reads_and_renders_every_golden_example_as_3_2_8_does() {
    let goldens: Vec<Value> = std::fs::read_to_string(fixture("data/rendered3.jsonl"))
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let mut rendered = Vec::new();
    for file in ["tool_calls.jsonl", "needle3_chat.jsonl"] {
        let dataset = Dataset::load(&fixture(&format!("data/{file}")), Generation::Needle3).unwrap();
        rendered.extend(dataset.examples.iter().map(|e| {
            let (prompt, target) = render(e);
            json!({"file": file, "line": e.line, "prompt": prompt, "target": target})
        }));
    }
    assert_eq!(rendered.len(), goldens.len());
    for (got, want) in rendered.iter().zip(&goldens) {
        assert_eq!(got, want);
    }
    let chat = Dataset::load(&fixture("data/needle3_chat.jsonl"), Generation::Needle3).unwrap();
    assert_eq!(problem_summary(&chat.problems), vec![(4, Issue::NotChat), (5, Issue::NotChat)]);
    // Needle 2's package skips every chat line (no query), and crashes on a null reasoning, which
    // 3.x reads as none.
    let two = Dataset::load(&fixture("data/needle3_chat.jsonl"), Generation::Needle2).unwrap();
    assert_eq!(two.examples.iter().map(|e| e.line).collect::<Vec<_>>(), [6, 8]);
}

#[test]
fn unreadable_chat_lines_are_named_not_crashed_on() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("chat.jsonl");
    let lines = [
        r#"{"messages": [1, 2]}"#,
        r#"{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": [{"name": "f", "arguments": "{oops"}]}]}"#,
        r#"{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": 3}]}"#,
        r#"{"messages": [{"role": "user", "content": "q"}, {"role": "assistant"}], "reasoning": 5}"#,
        r#"{"messages": [{"role": "user", "content": "q"}, {"role": "assistant"}]}"#,
    ];
    std::fs::write(&path, lines.join("\n")).unwrap();
    let dataset = Dataset::load(&path, Generation::Needle3).unwrap();
    let kinds: Vec<&str> = dataset.problems.iter().map(|p| p.issue.kind()).collect();
    assert_eq!(kinds, ["bad_chat", "bad_chat", "bad_chat"]);
    assert!(
        dataset.problems[1].issue.to_string().contains("`arguments` text is not JSON"),
        "{}",
        dataset.problems[1].issue
    );
    // A chat line's `reasoning` is not read: from_chat keeps only query, tools, answers and system.
    assert_eq!(dataset.examples.len(), 2);
}

#[test]
fn renders_every_golden_example_byte_for_byte() {
    let dataset = golden_dataset();
    let goldens = rendered_goldens();
    assert_eq!(dataset.examples.len(), goldens.len());
    for (example, golden) in dataset.examples.iter().zip(&goldens) {
        assert_eq!(json!(example.line), golden["line"]);
        let (prompt, target) = render(example);
        assert_eq!(prompt, golden["prompt"].as_str().expect("prompt is a string"), "line {}", example.line);
        assert_eq!(target, golden["target"].as_str().expect("target is a string"), "line {}", example.line);
    }
}

#[test]
fn golden_dataset_reports_only_its_line_without_query() {
    assert_eq!(problem_summary(&golden_dataset().problems), vec![(94, Issue::MissingQuery)]);
}

#[test]
fn tokenizes_every_golden_example_like_the_reference() {
    let tokenizer = fixture_tokenizer();
    for (example, golden) in golden_dataset().examples.iter().zip(&rendered_goldens()) {
        let tokenized = Tokenized::new(&tokenizer, example);
        assert_eq!(tokenized.prompt_ids, ids(&golden["prompt_ids"]), "line {}", example.line);
        assert_eq!(tokenized.target_ids, ids(&golden["target_ids"]), "line {}", example.line);
    }
}

#[test]
fn encodes_the_golden_dataset_like_load_jsonl() {
    let text = std::fs::read_to_string(fixture("data/encoded.json")).expect("encoded.json is readable");
    let goldens: Value = serde_json::from_str(&text).expect("encoded.json is JSON");
    let cases = goldens["cases"].as_array().expect("encoded.json has a cases list");
    assert!(!cases.is_empty());
    let dataset = golden_dataset();
    let tokenizer = fixture_tokenizer();
    for case in cases {
        let cap: usize = serde_json::from_value(case["cap"].clone()).expect("cap is an integer");
        let prepared = dataset.prepare(&tokenizer, cap).expect("the golden dataset prepares");
        assert_eq!(json!(prepared.seq_len), case["max_len"], "cap {cap}");
        let golden_ids: Vec<Vec<u32>> = serde_json::from_value(case["ids"].clone()).expect("ids are integer rows");
        let golden_mask: Vec<Vec<f32>> = serde_json::from_value(case["mask"].clone()).expect("mask rows are floats");
        let rows: Vec<Encoded> = prepared.rows().collect();
        // Rows are cut to seq_len but padded only when batched; padded, they are the reference's.
        assert!(rows.iter().all(|row| row.ids.len() <= prepared.seq_len && row.ids.len() == row.mask.len()));
        let padded = |row: &Encoded| {
            let (mut ids, mut mask) = (row.ids.clone(), row.mask.clone());
            ids.resize(prepared.seq_len, PAD);
            mask.resize(prepared.seq_len, 0.0);
            (ids, mask)
        };
        let (rows_ids, rows_mask): (Vec<Vec<u32>>, Vec<Vec<f32>>) = rows.iter().map(padded).unzip();
        assert_eq!(rows_ids, golden_ids, "cap {cap}");
        assert_eq!(rows_mask, golden_mask, "cap {cap}");
        let truncated = rows.iter().filter(|row| row.truncated).count();
        assert_eq!(prepared.report.truncated, truncated, "cap {cap}");
    }
}

#[test]
fn encode_masks_the_prompt_and_pads() {
    let tokenized = Tokenized { line: 1, prompt_ids: vec![10, 11], target_ids: vec![20] };
    let encoded = tokenized.encode(7);
    assert_eq!(encoded.ids, vec![BOS, 10, 11, 20, EOS, PAD, PAD]);
    assert_eq!(encoded.mask, vec![0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0]);
    assert!(!encoded.truncated);
}

#[test]
fn encode_truncates_at_the_end() {
    let tokenized = Tokenized { line: 1, prompt_ids: vec![10, 11], target_ids: vec![20, 21, 22] };
    let encoded = tokenized.encode(5);
    assert_eq!(encoded.ids, vec![BOS, 10, 11, 20, 21]);
    assert_eq!(encoded.mask, vec![0.0, 0.0, 0.0, 1.0, 1.0]);
    assert!(encoded.truncated);
    assert_eq!(tokenized.target_tokens_kept(5), 2);
    assert_eq!(tokenized.target_tokens_kept(2), 0);
    assert_eq!(tokenized.target_tokens_kept(100), 3);
}

const BOS: u32 = crate::tokenizer::BOS_ID;
const EOS: u32 = crate::tokenizer::EOS_ID;
const PAD: u32 = crate::tokenizer::PAD_ID;

#[test]
fn fit_max_len_doubles_from_128_up_to_the_cap() {
    assert_eq!(fit_max_len(0, 1024), 128);
    assert_eq!(fit_max_len(128, 1024), 128);
    assert_eq!(fit_max_len(129, 1024), 256);
    assert_eq!(fit_max_len(600, 1024), 1024);
    assert_eq!(fit_max_len(700, 512), 512);
    assert_eq!(fit_max_len(300, 300), 300);
    assert_eq!(fit_max_len(10, 64), 64);
}

#[test]
fn system_turn_only_for_a_non_empty_system_string() {
    let mut with_system = example(1, "q");
    with_system.system = "Be brief.".to_owned();
    let (prompt, _) = render(&with_system);
    assert!(prompt.starts_with("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n"));
    let (prompt, target) = render(&example(1, "q"));
    assert_eq!(prompt, "<|im_start|>user\n<tools>[]</tools>\nq<|im_end|>\n<|im_start|>assistant\n");
    assert_eq!(target, "<think></think>\n<tool_call>[]</tool_call><|im_end|>");
}

#[test]
fn a_question_is_rendered_as_a_row_holding_it_would_be() {
    let tools = json!([{"name": "set_light", "parameters": {}}]);
    for generation in [Generation::Needle2, Generation::Needle3] {
        let row = json!({"query": "Lights on", "tools": tools, "system": "  Be brief.\n"});
        let read = Example::from_object(row.as_object().unwrap(), generation).unwrap();
        let asked = Example::question(&tools, "Lights on", "  Be brief.\n", generation).unwrap();
        assert_eq!(render(&asked), render(&read), "{generation}");
    }
    // 3.x strips the system prompt (`render_example`); 2.x keeps it as written.
    let asked = |generation| Example::question(&tools, "q", "  Be brief.\n", generation).unwrap().system;
    assert_eq!(
        (asked(Generation::Needle3).as_str(), asked(Generation::Needle2).as_str()),
        ("Be brief.", "  Be brief.\n")
    );
}

#[test]
fn reports_each_bad_line_with_its_number() {
    let dataset =
        Dataset::load(&fixture("data/bad/mixed.jsonl"), Generation::Needle2).expect("mixed.jsonl has usable lines");
    let expected = vec![
        (3, Issue::InvalidJson { column: 26, reason: "expected value".to_owned() }),
        (4, Issue::NotAnObject { found: "a list" }),
        (5, Issue::MissingQuery),
        (6, Issue::NotAString { field: Field::Query, found: "a number" }),
        (7, Issue::NotAString { field: Field::Reasoning, found: "null" }),
        (8, Issue::NotAString { field: Field::System, found: "a list" }),
        (9, Issue::SystemIgnored { found: "null" }),
        (10, Issue::RenderedAsJson { field: Field::Tools, found: "an object" }),
        (11, Issue::RenderedAsJson { field: Field::Answers, found: "null" }),
        (12, Issue::InvalidJson { column: 22, reason: "trailing comma".to_owned() }),
        (13, Issue::NotAnObject { found: "a string" }),
        (15, Issue::NonFiniteNumber { column: 24 }),
        (16, Issue::NonFiniteNumber { column: 24 }),
    ];
    assert_eq!(problem_summary(&dataset.problems), expected);
    let lines: Vec<usize> = dataset.examples.iter().map(|e| e.line).collect();
    assert_eq!(lines, vec![1, 9, 10, 11, 14]);
}

#[test]
fn kept_lines_render_as_the_reference_does() {
    let dataset =
        Dataset::load(&fixture("data/bad/mixed.jsonl"), Generation::Needle2).expect("mixed.jsonl has usable lines");
    let tools_object = &dataset.examples[2];
    assert_eq!(tools_object.tools, r#"{"name":"x"}"#);
    // "answers": null wins over "function_calls", as `dict.get` does.
    assert_eq!(dataset.examples[3].answers, "null");
    assert_eq!(dataset.examples[4].query, "ok");
    assert_eq!(dataset.examples[4].system, "");
}

#[test]
fn problem_messages_name_line_column_and_fix() {
    let dataset =
        Dataset::load(&fixture("data/bad/mixed.jsonl"), Generation::Needle2).expect("mixed.jsonl has usable lines");
    let messages: Vec<String> = dataset.problems.iter().map(Problem::to_string).collect();
    assert_eq!(
        messages[0],
        "line 3, column 26: invalid JSON (expected value); each line must hold exactly one complete JSON object \
         (line skipped)"
    );
    assert_eq!(
        messages[3],
        "line 6: \"query\" is a number but must be a string; write it as text (or remove the field) (line skipped)"
    );
    assert!(messages[7].starts_with("line 10: \"tools\" is an object, expected a list"), "{}", messages[7]);
    assert!(!messages[7].contains("skipped"));
}

#[test]
fn invalid_utf8_is_reported_with_its_column() {
    let dataset = Dataset::load(&fixture("data/bad/not_utf8.jsonl"), Generation::Needle2)
        .expect("not_utf8.jsonl has usable lines");
    assert_eq!(problem_summary(&dataset.problems), vec![(2, Issue::NotUtf8 { column: 15 })]);
    assert_eq!(dataset.examples.iter().map(|e| e.line).collect::<Vec<_>>(), vec![1, 3]);
}

#[test]
fn byte_order_mark_is_reported() {
    let dataset =
        Dataset::load(&fixture("data/bad/bom.jsonl"), Generation::Needle2).expect("bom.jsonl has a usable line");
    assert_eq!(problem_summary(&dataset.problems), vec![(1, Issue::ByteOrderMark)]);
    assert_eq!(dataset.examples.len(), 1);
}

#[test]
fn crlf_and_lone_cr_end_lines() {
    let dataset = Dataset::load(&fixture("data/bad/newlines.jsonl"), Generation::Needle2)
        .expect("newlines.jsonl has usable lines");
    assert_eq!(problem_summary(&dataset.problems), vec![(3, Issue::MissingQuery)]);
    let queries: Vec<(usize, &str)> = dataset.examples.iter().map(|e| (e.line, e.query.as_str())).collect();
    assert_eq!(queries, vec![(1, "a"), (2, "b"), (4, "c")]);
}

#[test]
fn a_file_without_usable_examples_is_an_error_naming_it() {
    let path = fixture("data/bad/no_usable.jsonl");
    let error = Dataset::load(&path, Generation::Needle2).expect_err("no_usable.jsonl has no example");
    let message = error.to_string();
    assert!(message.contains(&path.display().to_string()), "{message}");
    assert!(message.contains("line 2: no \"query\" field"), "{message}");
    match error {
        DatasetError::NoUsableExample { problems, .. } => {
            assert_eq!(problem_summary(&problems), vec![(2, Issue::MissingQuery)]);
        }
        other => panic!("unexpected error {other}"),
    }
    let blank =
        Dataset::load(&fixture("data/bad/blank.jsonl"), Generation::Needle2).expect_err("blank.jsonl has no example");
    assert!(blank.to_string().contains("the file has no non-blank line"), "{blank}");
}

#[test]
fn a_missing_file_is_an_error_naming_it() {
    let path = fixture("data/bad/does_not_exist.jsonl");
    let error = Dataset::load(&path, Generation::Needle2).expect_err("the file does not exist");
    assert!(matches!(error, DatasetError::Read { .. }));
    assert!(error.to_string().contains("does_not_exist.jsonl"), "{error}");
}

#[test]
fn report_counts_lengths_truncation_and_problems() {
    let dataset = Dataset::load(&fixture("data/bad/newlines.jsonl"), Generation::Needle2)
        .expect("newlines.jsonl has usable lines");
    let tokenized = vec![
        Tokenized { line: 1, prompt_ids: vec![7; 100], target_ids: vec![8; 10] },
        Tokenized { line: 2, prompt_ids: vec![7; 200], target_ids: vec![8; 40] },
        Tokenized { line: 4, prompt_ids: vec![7; 300], target_ids: vec![8; 50] },
    ];
    let report = DatasetReport::new(&dataset.path, &dataset.examples, &dataset.problems, &tokenized, 256, 256);
    assert_eq!(report.usable_examples, 3);
    assert_eq!(report.skipped_lines, 1);
    assert_eq!(report.token_lengths, LengthStats { min: 112, median: 242.0, max: 352 });
    assert_eq!(
        report.histogram,
        vec![
            HistogramBin { up_to: 128, count: 1 },
            HistogramBin { up_to: 256, count: 1 },
            HistogramBin { up_to: 512, count: 1 }
        ]
    );
    assert_eq!(report.truncated, 1);
    let truncation = Issue::Truncated { tokens: 352, seq_len: 256, target_tokens: 50, target_tokens_kept: 0 };
    assert_eq!(problem_summary(&report.problems), vec![(3, Issue::MissingQuery), (4, truncation)]);
    assert_eq!(report.samples.len(), 3);
    assert_eq!(report.samples[2].line, 4);
    assert_eq!(report.samples[2].tokens, 352);
}

#[test]
fn report_serializes_problems_with_kind_and_message() {
    let dataset = Dataset::load(&fixture("data/bad/newlines.jsonl"), Generation::Needle2)
        .expect("newlines.jsonl has usable lines");
    let tokenized: Vec<Tokenized> = dataset
        .examples
        .iter()
        .map(|e| Tokenized { line: e.line, prompt_ids: vec![5; 3], target_ids: vec![6; 2] })
        .collect();
    let report = serde_json::to_value(DatasetReport::new(
        &dataset.path,
        &dataset.examples,
        &dataset.problems,
        &tokenized,
        1024,
        128,
    ))
    .expect("serializes");
    assert_eq!(
        report["problems"][0],
        json!({
            "line": 3,
            "issue": {"kind": "missing_query"},
            "skipped": true,
            "message": "line 3: no \"query\" field; add the user request as \"query\": \"...\" (line skipped)",
        })
    );
    assert_eq!(report["seq_len"], json!(128));
    assert_eq!(report["token_lengths"], json!({"min": 7, "median": 7.0, "max": 7}));
    assert_eq!(
        report["samples"][0]["prompt"],
        json!("<|im_start|>user\n<tools>[]</tools>\na<|im_end|>\n<|im_start|>assistant\n")
    );
}

#[test]
fn prepare_rejects_a_cap_below_two() {
    let dataset = Dataset::load(&fixture("data/bad/newlines.jsonl"), Generation::Needle2)
        .expect("newlines.jsonl has usable lines");
    let error = dataset.prepare(&fixture_tokenizer(), 1).expect_err("cap 1 cannot train");
    assert!(error.to_string().contains("--max-len"), "{error}");
}

#[test]
fn a_file_of_many_bad_lines_keeps_the_first_problems_and_counts_them_all() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("many.jsonl");
    let mut text = String::from("{\"query\": \"ok\"}\n");
    for i in 0..5_000 {
        text.push_str(if i % 2 == 0 { "{not json\n" } else { "{\"q\": 1}\n" });
    }
    std::fs::write(&path, text).unwrap();
    let dataset = Dataset::load(&path, Generation::Needle2).unwrap();
    assert_eq!(dataset.problems.len(), KEPT_PROBLEMS);
    assert_eq!(dataset.problems.total, 5_000);
    assert_eq!(dataset.problems.counts["invalid_json"], 2_500);
    assert_eq!(dataset.problems.counts["missing_query"], 2_500);
    assert_eq!(dataset.problems[0].line, 2);
    let report = serde_json::to_value(dataset.prepare(&fixture_tokenizer(), 128).unwrap().report).unwrap();
    assert_eq!(report["skipped_lines"], json!(5_000));
    assert_eq!(report["problems_total"], json!(5_000));
    assert_eq!(report["problems"].as_array().unwrap().len(), KEPT_PROBLEMS);
}

#[test]
fn a_huge_line_makes_a_small_report() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("long.jsonl");
    let query = "word ".repeat(200_000);
    std::fs::write(&path, format!("{{\"query\": \"{query}\"}}\r")).unwrap();
    let dataset = Dataset::load(&path, Generation::Needle2).unwrap();
    let report = dataset.prepare(&fixture_tokenizer(), 128).unwrap().report;
    let sample = &report.samples[0];
    assert!(sample.query.chars().count() < 20_000 && sample.query.ends_with("more characters)"));
    assert!(sample.prompt.chars().count() < 20_000);
    assert_eq!(report.truncated, 1);
}
