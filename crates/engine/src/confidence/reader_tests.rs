//! A trained head read where a tuned model answers: the companion file found beside the adapter,
//! each answer's head probability the calibrated head on that turn's cells, and the turn's
//! confidence the smaller of it and the decode probability.

use std::path::Path;
use std::sync::atomic::AtomicBool;

use candle_core::{DType, Device, Tensor};

use super::cells::row_cells;
use super::file::{companion_path, Reading, TrainedHead};
use super::fit::Calibration;
use super::head::ConfidenceHead;
use super::reader::TurnHead;
use crate::cact::CactFile;
use crate::calls::{answer_each, prompt_ids, Answer, Loaded, Precision, Weights};
use crate::checkpoint::Checkpoint;
use crate::config::ModelConfig;
use crate::dataset::{render, Dataset};
use crate::fixtures::fixture;
use crate::generation::Generation;
use crate::lora::{save_adapter, AdapterMeta, Lora};
use crate::model::{Forward, Params};
use crate::tokenizer::Tokenizer;

/// An adapter for the tiny Needle 2 fixture saved in `dir`, and the fixture's config.
fn adapter(dir: &Path) -> (std::path::PathBuf, ModelConfig) {
    let checkpoint = Checkpoint::load(&fixture("models/tiny_f32.pkl")).unwrap();
    let params = Params::from_checkpoint(&checkpoint, &Device::Cpu).unwrap();
    let lora = Lora::init(&params, 2, 4.0, 0).unwrap();
    let meta =
        AdapterMeta { base: "models/tiny_f32.pkl".into(), partial: false, generation: Generation::Needle2, seed: 0 };
    let path = dir.join("adapter.safetensors");
    save_adapter(&path, &lora, &meta).unwrap();
    (path, checkpoint.config)
}

#[test]
fn a_head_beside_the_adapter_reads_every_answer_and_caps_its_confidence() {
    let dir = tempfile::tempdir().unwrap();
    let (adapter, cfg) = adapter(dir.path());
    let weights = Weights::Checkpoint { checkpoint: fixture("models/tiny_f32.pkl"), lora: Some(adapter.clone()) };
    let network = weights.load(&Device::Cpu).unwrap().network;
    assert!(TurnHead::beside(&adapter, &cfg).unwrap().is_none(), "no companion file, no head");

    let calibration = Calibration { scale: 1.7, shift: 0.4 };
    for reads in [Reading::Prompt, Reading::PromptAndAnswer] {
        let head = ConfidenceHead::initial(&cfg, &Device::Cpu, 3).unwrap();
        TrainedHead { head: head.clone(), calibration, reads }.save(&companion_path(&adapter)).unwrap();
        let turn_head = TurnHead::beside(&adapter, &cfg).unwrap().expect("the companion file is read");

        let tokenizer = Tokenizer::load(&fixture("models/tokenizer.model")).unwrap();
        let examples = Dataset::load(&fixture("data/tool_calls.jsonl"), Generation::Needle2).unwrap().examples;
        let prompts: Vec<(Vec<u32>, usize)> =
            examples[..4].iter().map(|example| (prompt_ids(&tokenizer, &render(example).0), 12)).collect();
        let mut answers = Vec::new();
        answer_each(&network, Some(&turn_head), &tokenizer, &prompts, &AtomicBool::new(false), |index, answer| {
            answers.push((index, answer))
        })
        .unwrap();
        assert_eq!(answers.len(), prompts.len());

        // The head's forward run directly on each turn's cells, as the file's reading says.
        let mut forward = Forward::new(network.clone()).unwrap();
        for (index, answer) in answers {
            let tokens = match reads {
                Reading::Prompt => prompts[index].0.clone(),
                Reading::PromptAndAnswer => [prompts[index].0.as_slice(), &answer.completion.ids].concat(),
            };
            let cells = row_cells(&mut forward, std::slice::from_ref(&tokens), None).unwrap().remove(0);
            let keep = Tensor::ones((1, tokens.len()), DType::F32, &Device::Cpu).unwrap();
            let logit = head.logits(&cells, &keep, None).unwrap().to_vec1::<f32>().unwrap()[0];
            let want = calibration.confidence(f64::from(logit));
            let read = answer.head.expect("every answer is read by the head");
            assert!((read - want).abs() < 1e-6, "{reads:?}, answer {index}: head {read}, the forward gives {want}");
            assert_eq!(answer.confidence, read.min(answer.decode), "{reads:?}, answer {index}");
        }
    }
}

#[test]
fn a_head_for_another_model_is_refused_naming_the_file_and_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let (adapter, cfg) = adapter(dir.path());
    let path = companion_path(&adapter);
    let others = [
        ModelConfig { d_model: 8, num_layers: 2, ..ModelConfig::defaults_for(Generation::Needle3) },
        ModelConfig { d_model: cfg.d_model + 8, ..cfg.clone() },
    ];
    for (other, problem) in others.iter().zip(["a Needle 3 head but the model is Needle 2", "do not fit a model"]) {
        let head = ConfidenceHead::initial(other, &Device::Cpu, 0).unwrap();
        TrainedHead { head, calibration: Calibration::IDENTITY, reads: Reading::Prompt }.save(&path).unwrap();
        let err = TurnHead::beside(&adapter, &cfg).unwrap_err().to_string();
        assert!(err.contains(&path.display().to_string()), "{err}");
        assert!(err.contains(problem) && err.contains("needle finetune --confidence"), "{err}");
    }
    std::fs::write(&path, b"half a file").unwrap();
    let err = TurnHead::beside(&adapter, &cfg).unwrap_err().to_string();
    assert!(err.contains(&path.display().to_string()) && err.contains("not a safetensors file"), "{err}");
    assert!(err.contains("needle finetune --confidence"), "{err}");
}

/// `rel` under the fixtures, opened as a `.cact`, with its path.
fn cact(rel: &str) -> (CactFile, std::path::PathBuf) {
    let path = fixture(rel);
    (CactFile::open(&path).unwrap(), path)
}

/// The first `count` rows of the Needle 3 fixture data, each prompt with a budget of 12 new tokens.
fn needle3_prompts(tokenizer: &Tokenizer, count: usize) -> Vec<(Vec<u32>, usize)> {
    let examples = Dataset::load(&fixture("data/tool_calls.jsonl"), Generation::Needle3).unwrap().examples;
    examples[..count].iter().map(|example| (prompt_ids(tokenizer, &render(example).0), 12)).collect()
}

/// Each prompt's answer by `loaded` as `--weights` runs a `.cact` (W4A8, from its codes), read by
/// the head the file carries.
fn answers_of(loaded: &Loaded, prompts: &[(Vec<u32>, usize)]) -> Vec<Answer> {
    let tokenizer = loaded.tokenizer.as_ref().expect("the fixture .cact carries its tokenizer");
    let mut got: Vec<Option<Answer>> = vec![None; prompts.len()];
    answer_each(&loaded.network, loaded.head.as_ref(), tokenizer, prompts, &AtomicBool::new(false), |i, answer| {
        got[i] = Some(answer)
    })
    .unwrap();
    got.into_iter().map(|answer| answer.expect("every prompt is answered")).collect()
}

/// The largest difference in probability, and the head's probability without its calibration,
/// allowed between the head a `.cact` ships and the trained head it was built from: the build
/// rounds `gain`, `row_bias` and the folded bias to FP16 and quantizes the folded projection
/// (`a·w`, where the companion file's head is quantized as `w` and then scaled), so the norms of
/// its CQ groups round to FP16 at another scale. Measured on lora_head.cact: 5.4e-5.
const SHIPPED_HEAD_TOLERANCE: f64 = 2e-4;

#[test]
fn a_cact_answers_with_the_head_it_ships_as_the_trained_head_beside_its_adapter_reads() {
    // lora_head.cact is 3.2.8's write_export of the tuned fixture with trained_head.safetensors in
    // place of the base's head, its calibration (1.75, -0.25) folded into the projection; our build
    // agrees with it (cact::golden_tests).
    let (file, path) = cact("golden/needle3_heads/lora_head.cact");
    let shipped = TurnHead::in_cact(&file, &path).unwrap().expect("lora_head.cact ships a confidence head");
    assert_eq!(shipped.path(), path);
    let dir = tempfile::tempdir().unwrap();
    let adapter = dir.path().join("adapter.safetensors");
    std::fs::copy(fixture("golden/needle3_heads/adapter.safetensors"), &adapter).unwrap();
    std::fs::copy(fixture("golden/needle3_heads/trained_head.safetensors"), companion_path(&adapter)).unwrap();
    let cfg = file.model_config();
    let beside = TurnHead::beside(&adapter, &cfg).unwrap().expect("the companion file is read");
    let trained = TrainedHead::load(&companion_path(&adapter)).unwrap();
    assert_eq!(trained.reads, Reading::PromptAndAnswer, "the reading a .cact's head is read with");
    let raw = trained.head.through_cq().unwrap();

    let loaded = Weights::Cact(path.clone()).load_as(&Device::Cpu, Precision::W4a8).unwrap();
    assert!(loaded.head.is_some(), "a loaded .cact brings its head");
    let prompts = needle3_prompts(loaded.tokenizer.as_ref().unwrap(), 4);
    let answers = answers_of(&loaded, &prompts);
    // The cells of the network that answered: the file's, from its codes.
    let mut forward = Forward::new(loaded.network.clone()).unwrap();
    let mut largest = 0f64;
    for ((prompt, _), answer) in prompts.iter().zip(&answers) {
        let read = answer.head.expect("every answer is read by the file's head");
        assert_eq!(answer.confidence, read.min(answer.decode));
        let want = beside.confidence(&mut forward, prompt, &answer.completion.ids).unwrap();
        largest = largest.max((read - want).abs());
        assert!((read - want).abs() <= SHIPPED_HEAD_TOLERANCE, "the file's head says {read}, the trained head {want}");
        // Read without its calibration, the trained head says something else: the fold is read.
        let tokens = Reading::PromptAndAnswer.tokens(prompt, &answer.completion.ids);
        let cells = row_cells(&mut forward, std::slice::from_ref(&tokens), None).unwrap().remove(0);
        let keep = Tensor::ones((1, tokens.len()), DType::F32, &Device::Cpu).unwrap();
        let logit = raw.logits(&cells, &keep, None).unwrap().to_vec1::<f32>().unwrap()[0];
        let uncalibrated = Calibration::IDENTITY.confidence(f64::from(logit));
        assert!((uncalibrated - want).abs() > 10.0 * SHIPPED_HEAD_TOLERANCE, "{uncalibrated} vs {want}");
    }
    eprintln!("largest difference, the file's head against the trained head: {largest:.2e}");
}

#[test]
fn a_cact_without_a_head_answers_with_its_decode_probability() {
    // 3.2.8's build of the adapter drops the base's head (lora.cact).
    let (file, path) = cact("golden/needle3_heads/lora.cact");
    assert!(TurnHead::in_cact(&file, &path).unwrap().is_none());
    let loaded = Weights::Cact(path).load_as(&Device::Cpu, Precision::W4a8).unwrap();
    assert!(loaded.head.is_none());
    let prompts = needle3_prompts(loaded.tokenizer.as_ref().unwrap(), 3);
    for answer in answers_of(&loaded, &prompts) {
        assert_eq!((answer.head, answer.confidence), (None, answer.decode));
    }
}

/// The largest difference in logit between a reference's head in its `.cact` and the same head in
/// its checkpoint, on the goldens' cells: FP16 rounding of every Needle 2 parameter (relative
/// 2^-11), and for Needle 3 of `gain`, `row_bias` and `bias` and the CQ-4 norms, with the CQ codes
/// of the reference's dense rotation, which may round a coordinate to the other side of a
/// boundary from ours (`cact::golden_tests`). Measured: 8.2e-6 (Needle 2), 9.0e-6 (Needle 3).
const STORED_HEAD_TOLERANCE: f32 = 1e-4;

#[test]
fn a_base_cact_carries_its_checkpoints_head_as_the_reference_stored_it() {
    // 2.0.8's export of the Needle 2 fixture (8 probes and the projection, FP16) and 3.2.8's of
    // the Needle 3 build fixture (probes, queries and projection CQ-4, the rest FP16).
    for (stem, checkpoint, built) in [
        ("tiny_f32", "models/tiny_f32.pkl", "golden/tiny_f32/w4.cact"),
        ("needle3_heads", "models/needle3_heads.safetensors", "golden/needle3_heads/base.cact"),
    ] {
        let checkpoint = Checkpoint::load(&fixture(checkpoint)).unwrap();
        let params = Params::from_checkpoint(&checkpoint, &Device::Cpu).unwrap();
        let head = ConfidenceHead::load(&checkpoint.config, &params).unwrap().unwrap().through_cq().unwrap();
        let (file, _) = cact(built);
        let stored = file.confidence_head(&Device::Cpu).unwrap().expect("the base's build keeps its head");
        assert_eq!(stored.generation(), checkpoint.config.generation);
        let golden =
            candle_core::safetensors::load(fixture(&format!("golden/{stem}/confidence.safetensors")), &Device::Cpu)
                .unwrap();
        let (cells, keep) = (&golden["cells"], &golden["keep"]);
        let (want, got) = (head.logits(cells, keep, None).unwrap(), stored.logits(cells, keep, None).unwrap());
        let gap: f32 = (&want - &got).unwrap().abs().unwrap().max(0).unwrap().to_scalar().unwrap();
        eprintln!("{stem}: the stored head's logits within {gap:.1e} of the checkpoint's");
        assert!(gap <= STORED_HEAD_TOLERANCE, "{stem}: {gap}");
    }
}
