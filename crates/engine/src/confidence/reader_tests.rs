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
use crate::calls::{answer_each, prompt_ids, Weights};
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
