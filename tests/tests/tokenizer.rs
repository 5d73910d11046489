//! Tokenizer parity with the real `sentencepiece` and with needle's `.cact` tokenizer blob code.
//! Goldens: tests/fixtures/tokenizer/corpus.jsonl + tokenizer.blob (make_fixtures.py) and
//! tests/fixtures/tokenizer/variants/ (make_tokenizer_variants.py).
use needle_engine::generation::Generation;
use needle_engine::tokenizer::{Tokenizer, TokenizerError, VocabularyProblem};
use needle_tests::{fixture, json, read};
use serde_json::Value;

fn ids(value: &Value) -> Vec<u32> {
    let list = value.as_array().unwrap_or_else(|| panic!("expected an id list, got {value}"));
    list.iter().map(|id| id.as_u64().and_then(|id| u32::try_from(id).ok()).expect("id")).collect()
}

fn text(value: &Value) -> &str {
    value.as_str().unwrap_or_else(|| panic!("expected a string, got {value}"))
}

fn fixture_tokenizer() -> Tokenizer {
    Tokenizer::load(&fixture("models/tokenizer.model")).expect("fixture tokenizer loads")
}

/// Every corpus.jsonl line: text, ids, pieces, decoded.
fn corpus() -> Vec<Value> {
    let raw = read("tokenizer/corpus.jsonl");
    let lines = String::from_utf8(raw).expect("corpus.jsonl is UTF-8");
    let rows: Vec<Value> = lines.lines().map(|l| serde_json::from_str(l).expect("corpus line is JSON")).collect();
    assert!(rows.len() >= 150, "corpus.jsonl has only {} lines", rows.len());
    rows
}

#[test]
fn fixture_model_encodes_and_decodes_the_corpus_like_sentencepiece() {
    let tok = fixture_tokenizer();
    assert_eq!(tok.vocab_size(), 512);
    for row in corpus() {
        let input = text(&row["text"]);
        let got = tok.encode(input);
        assert_eq!(got, ids(&row["ids"]), "encode({input:?})");
        let pieces: Vec<&str> = got.iter().map(|&id| tok.pieces()[id as usize].text.as_str()).collect();
        let expected_pieces: Vec<&str> = row["pieces"].as_array().expect("pieces").iter().map(text).collect();
        assert_eq!(pieces, expected_pieces, "pieces of {input:?}");
        assert_eq!(tok.decode(&got), text(&row["decoded"]), "decode of {input:?}");
    }
}

#[test]
fn fixture_model_writes_the_reference_cact_blob() {
    assert_eq!(fixture_tokenizer().to_cact_blob(Generation::Needle2), read("tokenizer/tokenizer.blob"));
}

#[test]
fn blob_tokenizer_matches_the_model_it_was_written_from() {
    let tok = Tokenizer::from_cact_blob(&read("tokenizer/tokenizer.blob")).expect("blob loads");
    let model = fixture_tokenizer();
    assert_eq!(tok.pieces(), model.pieces());
    assert!(tok.add_dummy_prefix() && tok.byte_fallback() && !tok.remove_extra_whitespaces());
    for row in corpus() {
        let input = text(&row["text"]);
        assert_eq!(tok.encode(input), ids(&row["ids"]), "blob encode({input:?})");
        assert_eq!(tok.decode(&ids(&row["ids"])), text(&row["decoded"]), "blob decode of {input:?}");
    }
    assert_eq!(
        tok.to_cact_blob(Generation::Needle2),
        read("tokenizer/tokenizer.blob"),
        "blob → tokenizer → blob round trip"
    );
}

const VARIANTS: [&str; 5] = ["base", "remove_ws", "no_byte_fallback", "no_dummy_prefix", "no_split_ws"];

/// Each variant model encodes every text as sentencepiece does, decodes as sp.Decode, and writes the blob
/// the reference writes.
#[test]
fn variant_models_match_sentencepiece() {
    let texts = json("tokenizer/variants/texts.json");
    let texts: Vec<&str> = texts.as_array().expect("texts").iter().map(text).collect();
    for name in VARIANTS {
        let tok = Tokenizer::load(&fixture(&format!("tokenizer/variants/{name}.model"))).expect(name);
        let golden = json(&format!("tokenizer/variants/{name}.json"));
        for (i, input) in texts.iter().enumerate() {
            let expected = ids(&golden["encode"][i]);
            assert_eq!(tok.encode(input), expected, "{name}: encode({input:?})");
            let decoded = golden["decoded"][i].as_str().unwrap_or(input);
            assert_eq!(tok.decode(&expected), decoded, "{name}: decode of {input:?}");
        }
        for case in golden["decode_cases"].as_array().expect("decode_cases") {
            assert_eq!(tok.decode(&ids(&case["ids"])), text(&case["text"]), "{name}: decode({})", case["ids"]);
        }
        assert_eq!(
            tok.to_cact_blob(Generation::Needle2),
            read(&format!("tokenizer/variants/{name}.blob")),
            "{name}: blob"
        );
    }
}

/// A tokenizer read back from each variant's blob encodes as the reference's RefTokenizer does (which
/// differs from sentencepiece where the blob cannot describe the model: dummy prefix, whitespace removal).
#[test]
fn variant_blobs_encode_like_the_reference_blob_tokenizer() {
    let texts = json("tokenizer/variants/texts.json");
    let texts: Vec<&str> = texts.as_array().expect("texts").iter().map(text).collect();
    for name in VARIANTS {
        let golden = json(&format!("tokenizer/variants/{name}.json"));
        let loaded = Tokenizer::from_cact_blob(&read(&format!("tokenizer/variants/{name}.blob")));
        if golden["blob_encode"].is_null() {
            // The reference writes byte_fallback = 1 even for a model without byte pieces.
            let err = loaded.expect_err(name);
            assert!(
                matches!(err, TokenizerError::Vocabulary { problem: VocabularyProblem::MissingBytePiece(0), .. }),
                "{name}: {err}"
            );
            continue;
        }
        let tok = loaded.expect(name);
        for (i, input) in texts.iter().enumerate() {
            let expected = match &golden["blob_encode"][i] {
                Value::Null => &golden["encode"][i],
                differs => differs,
            };
            assert_eq!(tok.encode(input), ids(expected), "{name} blob: encode({input:?})");
        }
    }
}

/// Ids past the vocabulary are skipped (documented on `Tokenizer::decode`) instead of failing the call.
#[test]
fn decode_skips_out_of_range_ids() {
    let tok = fixture_tokenizer();
    let hello = tok.encode("hello <think> world");
    let mut noisy = vec![512, u32::MAX];
    noisy.extend(&hello);
    noisy.push(100_000);
    assert_eq!(tok.decode(&noisy), "hello <think> world");
    assert_eq!(tok.decode(&noisy), tok.decode(&hello));
}
