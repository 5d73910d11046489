//! `needle bench`: LoRA training steps on a random-init model held in memory (no files), timed
//! the way a run is felt: the first step from process start, then the median step.

use std::time::Instant;

use serde::Serialize;

use super::memory::{activation_budget, StepShape};
use super::schedule::Schedule;
use super::trainer::Trainer;
use crate::config::ModelConfig;
use crate::dataset::Encoded;
use crate::lora::Lora;
use crate::model::{CpuNetwork, Device, ModelError, Network, Params, Result};

/// The model shapes `--preset` names: the released Needle 2 and Needle 3; the model of the
/// whole-run benchmarks (`bench/finetune_side_by_side.sh`: d_model 256, 6 layers, a 2048-piece
/// vocabulary); and a tiny one for quick checks.
pub fn preset(name: &str) -> Option<ModelConfig> {
    match name {
        "needle" => Some(ModelConfig::needle2()),
        "needle3" => Some(ModelConfig::needle3()),
        "mid" => Some(ModelConfig {
            vocab_size: 2048,
            d_model: 256,
            num_heads: 4,
            num_kv_heads: 2,
            num_layers: 6,
            engram_layers: vec![2],
            engram_slots: 2048,
            ..ModelConfig::default()
        }),
        "tiny" => Some(ModelConfig {
            d_model: 128,
            num_heads: 4,
            num_kv_heads: 2,
            num_layers: 2,
            mhc_lanes: 2,
            engram_layers: vec![1],
            ..ModelConfig::default()
        }),
        _ => None,
    }
}

/// What to time.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    pub config: ModelConfig,
    pub batch: usize,
    pub seq: usize,
    pub steps: usize,
    pub rank: usize,
    /// Force layer-by-layer recomputation on or off; `None` lets the memory plan decide.
    pub recompute: Option<bool>,
}

/// What `needle bench --json` prints.
#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    /// From `process_start` to the model and adapter ready for the first step: the random draw
    /// standing in for a checkpoint's load, and under QAT the weights' round trips.
    pub startup_s: f64,
    /// From `process_start` to the end of the first step (start-up and first-step costs included).
    pub first_step_s: f64,
    /// Median of the steps after the first (the first alone when there is one step).
    pub step_s: f64,
    pub tokens_per_s: f64,
    pub peak_rss_mb: f64,
    /// Memory in use on the GPU at the end, where the backend reports it.
    pub device_memory_mb: Option<f64>,
    /// What the memory model predicted for this step (see [`super::memory`]).
    pub estimate_mb: f64,
    pub recompute: bool,
    pub micro_batch: usize,
    pub loss: f32,
}

/// Builds the model and adapter (rank r, alpha 2r) and runs `steps` training steps on
/// pseudo-random tokens whose second half of each row is the scored answer.
pub fn run(options: &BenchOptions, device: &Device, process_start: Instant) -> Result<BenchReport> {
    let BenchOptions { config, batch, seq, steps, rank, recompute } = options.clone();
    if batch == 0 || seq < 2 || steps == 0 || rank == 0 {
        return Err(ModelError::InvalidConfig {
            field: "bench",
            reason: format!(
                "batch {batch}, seq {seq}, steps {steps}, rank {rank}: use batch, steps, rank ≥ 1 and seq ≥ 2"
            ),
        });
    }
    let params = Params::random_init(device);
    // Building the network invents every weight, which the training recipe (Needle 3 quantizes) needs.
    Network::load(&config, &params)?;
    let params = params.for_training(&config, false)?;
    let network = Network::load(&config, &params)?;
    let lora = Lora::init(&params, rank, 2.0 * rank as f64, 0)?;
    let shape = StepShape {
        config: &config,
        parameters: params.parameter_count(),
        trainable: lora.parameter_count(),
        batch,
        seq_len: seq,
        scored: batch * (seq - seq / 2),
        rank,
        hand_written: CpuNetwork::supports(&network),
        activation_budget: activation_budget(device),
    };
    let memory = shape.plan();
    drop(params);
    let mut trainer = Trainer::new(network, lora, Schedule::reference(1e-4, steps + 1))?;
    trainer.recompute = recompute.unwrap_or(memory.recompute);
    // Forcing recomputation off or on keeps the whole batch in one pass, as asked.
    trainer.tokens_per_pass = if recompute.is_some() { usize::MAX } else { memory.tokens_per_pass };

    // An LCG: the cost does not depend on the token values.
    let mut state = 0x2545_F491_u32;
    let ids: Vec<u32> = (0..batch * seq)
        .map(|_| {
            state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (state >> 8) % config.vocab_size as u32
        })
        .collect();
    let mask: Vec<f32> = (0..seq).map(|t| if t < seq / 2 { 0.0 } else { 1.0 }).collect();
    let rows: Vec<Encoded> =
        ids.chunks(seq).map(|ids| Encoded { ids: ids.to_vec(), mask: mask.clone(), truncated: false }).collect();

    let mut times = Vec::with_capacity(steps);
    let mut loss = 0.0;
    let mut first_step_s = 0.0;
    let startup_s = process_start.elapsed().as_secs_f64();
    for step in 0..steps {
        let start = Instant::now();
        loss = trainer.step(&rows)?.loss;
        times.push(start.elapsed().as_secs_f64());
        if step == 0 {
            first_step_s = process_start.elapsed().as_secs_f64();
        }
    }
    let mut later = if times.len() > 1 { times[1..].to_vec() } else { times.clone() };
    later.sort_by(f64::total_cmp);
    let step_s = later[later.len() / 2];
    Ok(BenchReport {
        startup_s,
        first_step_s,
        step_s,
        tokens_per_s: (batch * seq) as f64 / step_s,
        peak_rss_mb: peak_rss_bytes() as f64 / 1e6,
        device_memory_mb: crate::backend::device_memory_used(device).map(|b| b as f64 / 1e6),
        estimate_mb: memory.peak_bytes as f64 / 1e6,
        recompute: trainer.recompute,
        micro_batch: (trainer.tokens_per_pass / seq).clamp(1, batch),
        loss,
    })
}

/// The process's peak resident memory so far (0 where the platform does not say).
pub fn peak_rss_bytes() -> u64 {
    #[cfg(unix)]
    {
        // SAFETY: getrusage writes into the zeroed struct it is given and reads nothing else.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
            return 0;
        }
        let max = usage.ru_maxrss.max(0) as u64;
        // Linux reports kilobytes, macOS bytes.
        if cfg!(target_os = "macos") {
            max
        } else {
            max * 1024
        }
    }
    #[cfg(not(unix))]
    {
        0
    }
}
