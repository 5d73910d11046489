//! Times LoRA training steps (rank 16, alpha 32, the reference's defaults) on a random-init full-size
//! Needle 2 at batch 4 × seq 128, the shape the reference's figure in NOTES.md was measured at.
//! Run through `bench/train_full.sh`.

use std::time::Instant;

use candle_core::{Device, Tensor};
use needle_engine::cact::synthetic::random_checkpoint;
use needle_engine::config::ModelConfig;
use needle_engine::lora::Lora;
use needle_engine::model::Params;
use needle_engine::train::trainer::Trainer;
use needle_engine::train::Schedule;

const BATCH: usize = 4;
const SEQ_LEN: usize = 128;
const STEPS: usize = 3;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let cfg = ModelConfig::needle2();
    let start = Instant::now();
    let params = Params::from_checkpoint(&random_checkpoint(&cfg, false, 0)?, &Device::Cpu)?;
    let lora = Lora::init(&params, 16, 32.0, 0)?;
    let mut trainer = Trainer::new(cfg.clone(), params, lora, Schedule::reference(1e-4, STEPS + 1))?;
    println!("random init: {:.2} s", start.elapsed().as_secs_f64());

    // Deterministic pseudo-random tokens (an LCG); the answer is the second half of each row.
    let mut state = 0x2545_F491_u32;
    let ids: Vec<u32> = (0..BATCH * SEQ_LEN)
        .map(|_| {
            state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            state % cfg.vocab_size as u32
        })
        .collect();
    let mask: Vec<f32> = (0..BATCH * SEQ_LEN).map(|i| if i % SEQ_LEN < SEQ_LEN / 2 { 0.0 } else { 1.0 }).collect();
    let ids = Tensor::from_vec(ids, (BATCH, SEQ_LEN), &Device::Cpu)?;
    let mask = Tensor::from_vec(mask, (BATCH, SEQ_LEN), &Device::Cpu)?;
    for step in 1..=STEPS {
        let start = Instant::now();
        let outcome = trainer.step(&ids, &mask)?;
        let secs = start.elapsed().as_secs_f64();
        println!(
            "step {step}: {secs:.2} s ({:.3} steps/s, {:.0} tokens/s), loss {:.4}",
            1.0 / secs,
            (BATCH * SEQ_LEN) as f64 / secs,
            outcome.loss
        );
    }
    Ok(())
}
