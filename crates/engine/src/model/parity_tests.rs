//! Parity with the reference on the fixture checkpoints (goldens made by `tests/fixtures/make_fixtures.py`):
//! logits within 1e-4 absolute, losses within 1e-5 relative.

use candle_core::{DType, Device};

use super::{evaluate, masked_loss, Network, Params};
use crate::checkpoint::Checkpoint;
use crate::dataset::Dataset;
use crate::generation::Generation;
use crate::tokenizer::Tokenizer;

const STEMS: [&str; 3] = ["tiny_f32", "tiny_f16", "pretrained"];
/// Needle 3 checkpoints, made by cactus-needle 3.2.8 (`make_needle3_fixtures.py`).
const NEEDLE3_STEMS: [&str; 2] = ["needle3_tiny", "needle3_tiny_out"];

use crate::fixtures::{checkpoint_path, fixture};

fn network(stem: &str) -> Network {
    let checkpoint = Checkpoint::load(&checkpoint_path(stem)).unwrap();
    Network::from_checkpoint(&checkpoint, &Device::Cpu).unwrap()
}

fn relative_error(got: f64, want: f64) -> f64 {
    ((got - want) / want).abs()
}

#[test]
fn logits_and_loss_match_the_reference_forward() {
    for stem in STEMS.into_iter().chain(NEEDLE3_STEMS) {
        let golden =
            candle_core::safetensors::load(fixture(&format!("golden/{stem}/forward.safetensors")), &Device::Cpu)
                .unwrap();
        let ids = golden["ids"].to_dtype(DType::U32).unwrap();
        let logits = network(stem).forward(&ids).unwrap();
        let max_diff: f32 = (&logits - &golden["logits"])
            .unwrap()
            .abs()
            .unwrap()
            .flatten_all()
            .unwrap()
            .max(0)
            .unwrap()
            .to_scalar()
            .unwrap();
        assert!(max_diff <= 1e-4, "{stem}: logits differ by up to {max_diff}");
        let loss: f32 = masked_loss(&logits, &ids, &golden["mask"]).unwrap().to_scalar().unwrap();
        let want = golden["loss"].to_vec1::<f32>().unwrap()[0];
        assert!(relative_error(loss.into(), want.into()) <= 1e-5, "{stem}: loss {loss} vs reference {want}");
    }
}

#[test]
fn whole_file_loss_matches_the_reference_single_batch() {
    let goldens: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("golden/eval.json")).unwrap()).unwrap();
    let tokenizer = Tokenizer::load(&fixture("models/tokenizer.model")).unwrap();
    let prepared = Dataset::load(&fixture("data/tool_calls.jsonl"), Generation::Needle2)
        .unwrap()
        .prepare(&tokenizer, 1024)
        .unwrap();
    for stem in STEMS {
        let want = &goldens[stem];
        // A batch size that does not divide the file, so a short last batch is exercised.
        let summary = evaluate(&network(stem), prepared.rows(), prepared.seq_len, 10, |_, _| {}).unwrap();
        assert_eq!(summary.seq_len as u64, want["seq_len"].as_u64().unwrap(), "{stem}");
        assert_eq!(summary.examples as u64, want["examples"].as_u64().unwrap(), "{stem}");
        assert_eq!(summary.tokens as f64, want["tokens"].as_f64().unwrap(), "{stem}");
        let loss = want["loss"].as_f64().unwrap();
        assert!(relative_error(summary.loss, loss) <= 1e-5, "{stem}: loss {} vs reference {loss}", summary.loss);
    }
}

/// Quantization turns the last bit of a float into a whole level now and then, so the reference is
/// matched as closely as it matches itself: weights perturbed by 1e-7 of themselves move its own QAT
/// logits by 2.3e-4 on average (5e-3 at most; `tests/fixtures/measure_needle3_spread.py`), against
/// 2.5e-2 that QAT moves them by.
#[test]
fn needle3_quantization_aware_logits_and_loss_match_the_reference() {
    for stem in NEEDLE3_STEMS {
        let checkpoint = Checkpoint::load(&checkpoint_path(stem)).unwrap();
        let params = Params::from_checkpoint(&checkpoint, &Device::Cpu).unwrap().for_qat(&checkpoint.config).unwrap();
        let network = Network::load(&checkpoint.config, &params).unwrap();
        let golden =
            candle_core::safetensors::load(fixture(&format!("golden/{stem}/forward.safetensors")), &Device::Cpu)
                .unwrap();
        let ids = golden["ids"].to_dtype(DType::U32).unwrap();
        let logits = network.forward(&ids).unwrap();
        let diff = (&logits - &golden["logits_qat"]).unwrap().abs().unwrap().flatten_all().unwrap();
        let (mean, max): (f32, f32) =
            (diff.mean_all().unwrap().to_scalar().unwrap(), diff.max(0).unwrap().to_scalar().unwrap());
        assert!(
            mean <= 1e-3 && max <= 2e-2,
            "{stem}: quantization-aware logits differ by {mean} on average, {max} at most"
        );
        let loss: f32 = masked_loss(&logits, &ids, &golden["mask"]).unwrap().to_scalar().unwrap();
        let want = golden["loss_qat"].to_vec1::<f32>().unwrap()[0];
        assert!(relative_error(loss.into(), want.into()) <= 1e-4, "{stem}: loss {loss} vs reference {want}");
    }
}
