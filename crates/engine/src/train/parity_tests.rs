//! Parity with the reference's LoRA step on the fixture checkpoints (goldens made by
//! `tests/fixtures/make_fixtures.py`, rank 4, alpha 8): the loss and the gradients of every factor
//! within 1e-4 relative, then three clipped AdamW steps on a warmup-cosine schedule within 1e-5.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};

use super::{Schedule, Trainer};
use crate::checkpoint::Checkpoint;
use crate::lora::{target_paths, Lora};
use crate::model::{Network, Params};

const STEMS: [&str; 3] = ["tiny_f32", "tiny_f16", "pretrained"];

fn fixture(relative: &str) -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures")).join(relative)
}

fn golden(stem: &str, file: &str) -> HashMap<String, Tensor> {
    candle_core::safetensors::load(fixture(&format!("golden/{stem}/{file}")), &Device::Cpu).unwrap()
}

fn scalar(tensors: &HashMap<String, Tensor>, key: &str) -> f32 {
    tensors[key].to_vec1::<f32>().unwrap()[0]
}

/// `max |got − want| / max |want|`: a relative error that tolerates entries near zero.
fn relative_error(got: &Tensor, want: &Tensor) -> f32 {
    let diff: f32 = (got - want).unwrap().abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar().unwrap();
    let size: f32 = want.abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar().unwrap();
    diff / size.max(f32::MIN_POSITIVE)
}

/// A trainer on `stem`'s checkpoint holding the golden factors, and the golden tensors.
fn golden_trainer(stem: &str) -> (Trainer, HashMap<String, Tensor>) {
    let checkpoint = Checkpoint::load(&fixture(&format!("models/{stem}.pkl"))).unwrap();
    let params = Params::from_checkpoint(&checkpoint, &Device::Cpu).unwrap();
    let lora = golden(stem, "lora.safetensors");
    let paths = target_paths(&params).unwrap();
    let mut want: Vec<&str> = lora.keys().filter_map(|k| k.strip_suffix("/A")).collect();
    want.sort_unstable();
    assert_eq!(paths, want, "{stem}: adapted weights");
    let factors = paths.iter().map(|p| (p.clone(), lora[&format!("{p}/A")].clone(), lora[&format!("{p}/B")].clone()));
    let adapter = Lora::from_factors(&params, 4, 8.0, factors).unwrap();
    let schedule = Schedule { peak: 1e-3, warmup: 1, total: 20 };
    let network = Network::load(&checkpoint.config, &params).unwrap();
    (Trainer::new(network, adapter, schedule).unwrap(), lora)
}

fn forward_batch(stem: &str) -> (Tensor, Tensor) {
    let batch = golden(stem, "forward.safetensors");
    (batch["ids"].to_dtype(DType::U32).unwrap(), batch["mask"].clone())
}

#[test]
fn loss_and_factor_gradients_match_the_reference() {
    // The whole batch in one pass, recomputed layer by layer, and recomputed in micro-batches of
    // one row (whose sums over the batch's count add up to the batch's loss and gradients).
    let ways = [(false, usize::MAX), (true, usize::MAX), (true, 1)];
    for (stem, (recompute, micro_batch)) in STEMS.iter().flat_map(|&stem| ways.map(|way| (stem, way))) {
        let (mut trainer, lora) = golden_trainer(stem);
        trainer.recompute = recompute;
        trainer.micro_batch = micro_batch;
        let (ids, mask) = forward_batch(stem);
        let (loss, grads) = trainer.loss_and_gradients(&ids, &mask).unwrap();
        let want = scalar(&lora, "loss");
        assert!(
            ((loss - want) / want).abs() <= 1e-4,
            "{stem} (recompute {recompute}, micro-batch {micro_batch}): loss {loss} vs {want}"
        );
        let names =
            trainer.lora.factors.iter().flat_map(|f| [format!("{}/grad_A", f.path), format!("{}/grad_B", f.path)]);
        for (name, grad) in names.zip(&trainer.lora.stacked(&grads).unwrap()) {
            let error = relative_error(grad, &lora[&name]);
            assert!(
                error <= 1e-4,
                "{stem} (recompute {recompute}, micro-batch {micro_batch}): {name} off by {error} relative"
            );
        }
    }
}

#[test]
fn three_clipped_adamw_steps_match_the_reference() {
    for stem in STEMS {
        let (mut trainer, lora) = golden_trainer(stem);
        let (ids, mask) = forward_batch(stem);
        for k in 1..=3 {
            let outcome = trainer.step(&ids, &mask).unwrap();
            assert_eq!(outcome.lr, scalar(&lora, &format!("lr@{}", k - 1)), "{stem}: lr of step {k}");
            let want = scalar(&lora, &format!("loss@{k}"));
            assert!(
                ((outcome.loss - want) / want).abs() <= 1e-4,
                "{stem}: loss of step {k} {} vs {want}",
                outcome.loss
            );
            for factor in &trainer.lora.factors {
                for (side, value) in [("A", factor.stacked_a().unwrap()), ("B", factor.stacked_b().unwrap())] {
                    let name = format!("{}/{side}@{k}", factor.path);
                    let error = relative_error(&value, &lora[&name]);
                    assert!(error <= 1e-5, "{stem}: {name} off by {error} relative");
                }
            }
        }
    }
}
