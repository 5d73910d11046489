//! Times `model::evaluate` on a random-init full-size Needle 2 (d_model 768, 27 layers, 12/6 heads,
//! engram at layers 2 and 15, vocab 8192, 4 lanes) at 16 examples × 256 tokens, batch 16.
//! Run under `/usr/bin/time -v` (see `bench/eval.sh`) for peak memory.

use std::time::Instant;

use needle_engine::config::ModelConfig;
use needle_engine::dataset::Encoded;
use needle_engine::model::{evaluate, Device, Network, Params};

const EXAMPLES: usize = 16;
const SEQ_LEN: usize = 256;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let cfg = ModelConfig::needle2();
    let start = Instant::now();
    let params = Params::random_init(&Device::Cpu);
    let network = Network::load(&cfg, &params)?;
    println!("random init: {:.2} s", start.elapsed().as_secs_f64());

    // Deterministic pseudo-random tokens (an LCG): the cost does not depend on the values.
    let mut state = 0x2545_F491_u32;
    let rows: Vec<Encoded> = (0..EXAMPLES)
        .map(|_| {
            let ids = (0..SEQ_LEN)
                .map(|_| {
                    state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                    state % cfg.vocab_size as u32
                })
                .collect();
            let mask = (0..SEQ_LEN).map(|i| if i < SEQ_LEN / 2 { 0.0 } else { 1.0 }).collect();
            Encoded { ids, mask, truncated: false }
        })
        .collect();
    let start = Instant::now();
    let summary = evaluate(&network, rows.into_iter(), SEQ_LEN, EXAMPLES, |_, _| {})?;
    println!(
        "eval {EXAMPLES} x {SEQ_LEN}: {:.2} s, loss {:.4} over {} tokens",
        start.elapsed().as_secs_f64(),
        summary.loss,
        summary.tokens
    );
    Ok(())
}
