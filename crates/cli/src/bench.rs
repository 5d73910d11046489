//! `needle bench`: training-step time and memory on a random-init model of a given shape, in
//! memory (no files): what `bench/side_by_side.sh` compares with the reference's JAX step.

use std::time::Instant;

use anyhow::{anyhow, Result};
use needle_engine::backend::{self, DeviceRequest, Selected};
use needle_engine::calls::decode_bench::{BenchPrecision, DecodeBench, BENCH_ROWS};
use needle_engine::config::ModelConfig;
use needle_engine::train::bench::{self, BenchOptions};

/// Time LoRA training steps on a random-init model held in memory.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Model shape: `needle` (the released Needle 2: d_model 768, 27 layers), `needle3` (the
    /// released Needle 3: d_model 768, 20 layers, trained quantization-aware), `mid` (the whole-run
    /// benchmarks' d_model 256, 6 layers) or `tiny`
    #[arg(long, default_value = "needle")]
    pub preset: String,
    /// Rows per step
    #[arg(long, default_value_t = 4)]
    pub batch: usize,
    /// Tokens per row (the second half of each row is scored)
    #[arg(long, default_value_t = 128)]
    pub seq: usize,
    /// Training steps to time (the first includes start-up)
    #[arg(long, default_value_t = 5)]
    pub steps: usize,
    /// LoRA rank (alpha is twice the rank)
    #[arg(long, default_value_t = 16)]
    pub rank: usize,
    /// Recompute activations layer by layer: auto (the memory plan decides), on or off
    #[arg(long, value_enum, default_value_t = Recompute::Auto)]
    pub recompute: Recompute,
    /// Time greedy decoding of exactly this many new tokens after a --seq-token prompt instead of
    /// training: one turn, and 16 rows, at each precision
    #[arg(long)]
    pub decode: Option<usize>,
    /// With --decode, time one precision alone (so that its peak memory is its own): `f32` (rows
    /// one at a time, as scoring did before batching), `simulated` (W4 weights and 8-bit
    /// activations simulated in float, 16 rows together) or `w4a8` (the model built into a `.cact`
    /// in memory and run from the file's codes, no f32 copy of them, on the integer kernels, 16
    /// rows together; its peak memory counted from the built .cact)
    #[arg(long, requires = "decode")]
    pub precision: Option<String>,
    /// Force a backend (auto, cpu, cuda, metal); default: NEEDLE_DEVICE, else auto
    #[arg(long)]
    pub device: Option<String>,
    /// Print one JSON line {"startup_s", "first_step_s", "step_s", "tokens_per_s", "peak_rss_mb", …};
    /// with --decode {"cpu", "preset", …, "precisions": [{"precision", "prefill_s", "turn_s",
    /// "decode_tokens_per_s", "rows_per_s", "peak_rss_mb", "batch"}, w4a8's with "cact_mb"]}
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum Recompute {
    Auto,
    On,
    Off,
}

pub fn run(args: Args, process_start: Instant) -> Result<()> {
    let config = bench::preset(&args.preset)
        .ok_or_else(|| anyhow!("--preset {}: unknown; use `needle`, `needle3`, `mid` or `tiny`", args.preset))?;
    let selected = backend::select(DeviceRequest::resolve(args.device.as_deref())?)?;
    noteln!("  {:<9} {}  {}", "backend", selected.info.backend, selected.info.device);
    if let Some(new_tokens) = args.decode {
        return decode(&args, config, new_tokens, &selected);
    }
    let recompute = match args.recompute {
        Recompute::Auto => None,
        Recompute::On => Some(true),
        Recompute::Off => Some(false),
    };
    let options =
        BenchOptions { config, batch: args.batch, seq: args.seq, steps: args.steps, rank: args.rank, recompute };
    let report = bench::run(&options, &selected.device, process_start)?;
    if args.json {
        let mut line = serde_json::to_value(&report)?;
        line["preset"] = args.preset.into();
        line["batch"] = args.batch.into();
        line["seq"] = args.seq.into();
        line["backend"] = selected.info.backend.to_string().into();
        outln!("{line}")?;
    } else {
        outln!("  {:<11} {} × {} tokens, rank {}, {}", "shape", args.batch, args.seq, args.rank, args.preset)?;
        outln!(
            "  {:<11} {:.2} s (from process start; start-up {:.2} s)",
            "first step",
            report.first_step_s,
            report.startup_s
        )?;
        outln!("  {:<11} {:.3} s (median)  {:.0} tokens/s", "step", report.step_s, report.tokens_per_s)?;
        outln!("  {:<11} {:.0} MB (plan: {:.0} MB)", "peak RSS", report.peak_rss_mb, report.estimate_mb)?;
        outln!("  {:<11} {}", "recompute", report.recompute)?;
        if let Some(mb) = report.device_memory_mb {
            outln!("  {:<11} {mb:.0} MB", "GPU memory")?;
        }
    }
    Ok(())
}

/// `--decode`: one turn and [`BENCH_ROWS`] rows at each precision (or the one `--precision` names).
fn decode(args: &Args, config: ModelConfig, new_tokens: usize, selected: &Selected) -> Result<()> {
    let precisions = match &args.precision {
        None => BenchPrecision::ALL.to_vec(),
        Some(name) => vec![BenchPrecision::named(name).ok_or_else(|| {
            let names: Vec<&str> = BenchPrecision::ALL.iter().map(|p| p.name()).collect();
            anyhow!("--precision {name}: unknown; use one of {}", names.join(", "))
        })?],
    };
    let bench = DecodeBench { config, prompt_tokens: args.seq, new_tokens };
    if !args.json {
        outln!("  {:<11} {} prompt tokens, {new_tokens} new, {}", "shape", args.seq, args.preset)?;
        outln!(
            "  {:<11} {:>10} {:>10} {:>12} {:>14} {:>10}",
            "precision",
            "prefill s",
            "turn s",
            "decode tok/s",
            format!("rows/s ({BENCH_ROWS})"),
            "peak MB"
        )?;
    }
    let mut figures = Vec::new();
    for precision in precisions {
        let got = bench.run(precision, &selected.device)?;
        if !args.json {
            outln!(
                "  {:<11} {:>10.3} {:>10.3} {:>12.1} {:>14.2} {:>10.0}{}",
                precision.name(),
                got.prefill_s,
                got.turn_s,
                got.decode_tokens_per_s,
                got.rows_per_s,
                got.peak_rss_mb,
                if got.batch == 1 {
                    "  (rows one at a time)".to_string()
                } else {
                    format!("  ({} together)", got.batch)
                }
            )?;
            if let Some(mb) = got.cact_mb {
                outln!("  {:<11} the .cact it runs from: {mb:.0} MB (its peak counted from it held in memory)", "")?;
            }
        }
        figures.push(got);
    }
    if args.json {
        let line = serde_json::json!({
            "cpu": backend::cpu_name(),
            "backend": selected.info.backend.to_string(),
            "device": selected.info.device,
            "preset": args.preset,
            "prompt_tokens": args.seq,
            "new_tokens": new_tokens,
            "rows": BENCH_ROWS,
            "precisions": figures,
        });
        outln!("{line}")?;
    }
    Ok(())
}
