//! The W4A8 path against the simulated path it stands for, on the decode fixtures (both
//! generations): each fixture checkpoint built into a `.cact` in memory as `needle build` builds
//! it ([`Precision::W4a8`]), decoded from its codes, and decoded from the same weights through CQ
//! with 8-bit activations simulated ([`Precision::Simulated`]).

use crate::calls::{Precision, Weights};
use crate::fixtures::{checkpoint_path, fixture};
use crate::model::{CpuNetwork, Device, Forward, Network, Workspace};
use crate::tokenizer::BOS_ID;

/// Each decode fixture, and whether its greedy tokens are held equal: the Needle 3 fixtures are
/// random-init models whose greedy picks are near ties (the two paths' logits 3 % apart, relative
/// L2, already pick another token on some steps), so only their logits and probabilities are held.
const STEMS: [(&str, bool); 4] =
    [("tiny_f32", true), ("pretrained", true), ("needle3_tiny", false), ("needle3_tiny_out", false)];

fn network(stem: &str, precision: Precision) -> Network {
    let weights = Weights::Checkpoint { checkpoint: checkpoint_path(stem), lora: None };
    weights.load_as(&Device::Cpu, precision).unwrap().network
}

/// The decode tests' prompts (a shared prefix and tails of several lengths, one short row), and
/// a fixture's own `decode.json` prompts where it has them.
fn prompts(stem: &str) -> Vec<Vec<u32>> {
    let prefix: Vec<u32> = std::iter::once(BOS_ID).chain((0..30).map(|i| 20 + i % 40)).collect();
    let mut prompts: Vec<Vec<u32>> = (0..7u32)
        .map(|r| match r {
            5 => vec![BOS_ID, 41, 300 + r],
            _ => prefix.iter().copied().chain((0..3 + 2 * r).map(|i| 40 + (i * 7 + r * 13) % 260)).collect(),
        })
        .collect();
    if let Ok(bytes) = std::fs::read(fixture(&format!("golden/{stem}/decode.json"))) {
        let golden: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        for case in golden["cases"].as_array().into_iter().flatten() {
            if let Ok(ids) = serde_json::from_value(case["prompt_ids"].clone()) {
                prompts.push(ids);
            }
        }
    }
    prompts
}

/// Logits after prefilling `prompt`, on the CPU path.
fn logits(network: &Network, prompt: &[u32]) -> Vec<f32> {
    let cpu = CpuNetwork::new(network).unwrap();
    let mut state = cpu.decode_state();
    cpu.decode_steps(&[prompt], &mut [&mut state], &mut Workspace::default()).unwrap().remove(0)
}

fn softmax(logits: &[f32]) -> Vec<f64> {
    let max = logits.iter().fold(f32::NEG_INFINITY, |m, &l| m.max(l));
    let exp: Vec<f64> = logits.iter().map(|&l| f64::from(l - max).exp()).collect();
    let sum: f64 = exp.iter().sum();
    exp.iter().map(|e| e / sum).collect()
}

/// Greedy decoding from the codes gives the simulated path's tokens on at least 23 rows in 24
/// (every differing row printed; Needle 2's fixtures), and its next-token distribution after each
/// prompt is within 1e-3 of the simulated one in every probability, its logits within 5 %
/// (relative L2; every fixture).
#[test]
fn decoding_from_the_codes_follows_the_simulated_path_on_the_fixtures() {
    for (stem, tokens_held) in STEMS {
        let (simulated, w4a8) = (network(stem, Precision::Simulated), network(stem, Precision::W4a8));
        assert!(w4a8.codes().is_some() && simulated.codes().is_none(), "{stem}");
        // Its float tensors of the coded weights are placeholders: candle's path refuses it.
        let ids = candle_core::Tensor::new(&[[BOS_ID, 41, 300]], &Device::Cpu).unwrap();
        let refused = w4a8.forward(&ids).unwrap_err().to_string();
        assert!(refused.contains("W4A8 network"), "{stem}: {refused}");
        let (mut reference, mut integer) =
            (Forward::new(simulated.clone()).unwrap(), Forward::new(w4a8.clone()).unwrap());
        let prompts = prompts(stem);
        let mut differing = Vec::new();
        let (mut worst_logits, mut worst_probability) = (0f64, 0f64);
        for (row, prompt) in prompts.iter().enumerate() {
            let want = reference.generate_from(None, prompt, 24).unwrap();
            let got = integer.generate_from(None, prompt, 24).unwrap();
            if (&got.ids, got.stop) != (&want.ids, want.stop) {
                eprintln!("{stem} row {row}: simulated {:?}, W4A8 {:?}", want.ids, got.ids);
                differing.push(row);
            }
            let (s, w) = (logits(&simulated, prompt), logits(&w4a8, prompt));
            let norm = s.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>().sqrt();
            let error = s.iter().zip(&w).map(|(&a, &b)| f64::from(a - b).powi(2)).sum::<f64>().sqrt();
            worst_logits = worst_logits.max(error / norm.max(1e-12));
            let (ps, pw) = (softmax(&s), softmax(&w));
            worst_probability = ps.iter().zip(&pw).map(|(a, b)| (a - b).abs()).fold(worst_probability, f64::max);
        }
        eprintln!(
            "{stem}: tokens equal on {}/{} rows; logits within {worst_logits:.4} (relative L2), probabilities \
             within {worst_probability:.5}",
            prompts.len() - differing.len(),
            prompts.len()
        );
        assert!(!tokens_held || 24 * differing.len() <= prompts.len(), "{stem}: rows {differing:?} differ");
        assert!(worst_logits <= 0.05, "{stem}: logits {worst_logits} apart (relative L2)");
        assert!(worst_probability <= 1e-3, "{stem}: a probability {worst_probability} apart");
    }
}
