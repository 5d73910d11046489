//! Answers decoded together are the answers decoded alone: every held-out row of the bundled demo
//! (the Quick preset's split, 60 of its 302 rows) answered by `calls::answer_each`, which decodes up
//! to `ANSWER_BATCH` rows at a time, against the same row decoded on its own, for each generation's
//! base at the precisions scoring runs it at.

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;

use needle_engine::calls::{answer_each, prompt_ids, Answer, Precision, Weights, ANSWER_SLACK};
use needle_engine::dataset::{render, Dataset};
use needle_engine::generation::Generation;
use needle_engine::model::{Device, Forward, Network};
use needle_engine::tokenizer::Tokenizer;

fn demo(relative: &str) -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/demo")).join(relative)
}

/// The demo's held-out rows for the base of `generation`: its network at `precision`, its
/// tokenizer and each row's prompt with its budget (as `calls::accuracy` sets it).
fn demo_held_out(generation: Generation, precision: Precision) -> (Network, Tokenizer, Vec<(Vec<u32>, usize)>) {
    let (checkpoint, tokenizer) = match generation {
        Generation::Needle2 => (demo("base.pkl"), demo("tokenizer.model")),
        Generation::Needle3 => (demo("needle3/base.safetensors"), demo("needle3/tokenizer.model")),
    };
    let tokenizer = Tokenizer::load(&tokenizer).unwrap();
    let weights = Weights::Checkpoint { checkpoint, lora: None };
    let network = weights.load_as(&Device::Cpu, precision).unwrap().network;
    let examples = Dataset::load(&demo("smart_home.jsonl"), generation).unwrap().examples;
    let quick = needle_engine::settings::preset("quick").unwrap().settings;
    let held_out = needle_engine::train::finetune::split(examples, quick.val_split, quick.seed).1;
    let prompts = held_out
        .iter()
        .map(|example| {
            let (prompt, target) = render(example);
            (prompt_ids(&tokenizer, &prompt), tokenizer.encode(&target).len() + ANSWER_SLACK)
        })
        .collect();
    (network, tokenizer, prompts)
}

#[test]
fn answered_together_each_demo_row_gets_the_answer_it_gets_alone() {
    // The rows' products are one matrix product per step together, not one each: the sums may
    // round differently in the last bit, which the simulated path's 8-bit activations now and then
    // turn into a whole level (seen: 2e-6 apart in float, 1e-3 at most simulated).
    for (generation, precision, tolerance) in [
        (Generation::Needle2, Precision::Float, 1e-5),
        (Generation::Needle3, Precision::QuantizedWeights, 1e-5),
        (Generation::Needle2, Precision::Simulated, 1e-2),
        (Generation::Needle3, Precision::Simulated, 1e-2),
    ] {
        let (network, tokenizer, prompts) = demo_held_out(generation, precision);
        assert_eq!(prompts.len(), 60, "the Quick preset holds out 60 of the demo's 302 rows");
        let mut together: Vec<Option<Answer>> = vec![None; prompts.len()];
        let mut order = Vec::new();
        answer_each(&network, None, &tokenizer, &prompts, &AtomicBool::new(false), |index, answer| {
            order.push(index);
            together[index] = Some(answer);
        })
        .unwrap();
        let mut forward = Forward::new(network.clone()).unwrap();
        for (row, ((prompt, budget), got)) in prompts.iter().zip(together).enumerate() {
            let at = format!("{generation:?} {precision:?}, held-out row {row}");
            let got = got.unwrap_or_else(|| panic!("{at}: not answered"));
            let alone = forward.generate_from(None, prompt, *budget).unwrap();
            assert_eq!((&got.completion.ids, got.completion.stop), (&alone.ids, alone.stop), "{at}");
            for (p, q) in got.completion.probabilities.iter().zip(&alone.probabilities) {
                assert!((p - q).abs() <= tolerance, "{at}: probability {p} together, {q} alone");
            }
        }
        // All share the demo's tools prompt: handed on in the order they were started.
        assert_eq!(order, (0..prompts.len()).collect::<Vec<_>>(), "{generation:?}: each row once, in order");
    }
}
