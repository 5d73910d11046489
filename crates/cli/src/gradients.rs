//! `needle gradients`: one reverse pass's loss and LoRA gradients on a given batch and adapter, written
//! out, so that the same pass on two devices (or against the reference's goldens) can be compared:
//! bench/gpu_check.sh runs it on the GPU and the CPU on the committed fixtures.

use std::path::PathBuf;

use anyhow::{Context, Result};
use needle_engine::backend::{self, DeviceRequest};
use needle_engine::train::gradients::{self, gradients};
use needle_engine::train::Schedule;

/// Compute the loss and every LoRA factor's gradient on one batch, and write them (safetensors).
#[derive(clap::Args)]
pub struct Args {
    /// Base checkpoint (.pkl, or a Needle 3 .safetensors)
    #[arg(long)]
    pub checkpoint: PathBuf,
    /// The batch: safetensors with `ids` and `mask` of [rows, length] (e.g.
    /// tests/fixtures/golden/<stem>/forward.safetensors)
    #[arg(long)]
    pub batch: PathBuf,
    /// The adapter: safetensors with `<weight>/A` and `<weight>/B` for each weight LoRA adapts (e.g. the
    /// golden lora.safetensors beside that batch)
    #[arg(long)]
    pub adapter: PathBuf,
    /// The adapter's rank
    #[arg(long)]
    pub lora_rank: usize,
    /// The adapter's alpha (its factors are scaled by alpha / rank)
    #[arg(long)]
    pub lora_alpha: f64,
    /// Force a backend (auto, cpu, cuda, metal); default: NEEDLE_DEVICE, else auto
    #[arg(long)]
    pub device: Option<String>,
    /// Where to write `loss` and `<weight>/grad_A`, `<weight>/grad_B` (safetensors)
    #[arg(long)]
    pub out: PathBuf,
}

pub fn run(args: Args) -> Result<()> {
    let selected = backend::select(DeviceRequest::resolve(args.device.as_deref())?)?;
    // No step is taken, so the schedule never matters.
    let schedule = Schedule::reference(1e-3, 1);
    let (mut trainer, _) = gradients::trainer(
        &args.checkpoint,
        &args.adapter,
        (args.lora_rank, args.lora_alpha),
        // As the goldens were made: Needle 3 quantization-aware by its recipe, Needle 2 in float.
        false,
        schedule,
        &selected.device,
    )?;
    let rows = gradients::batch(&args.batch)?;
    let (loss, grads) = gradients(&mut trainer, &rows)?;
    gradients::save(&args.out, loss, grads).with_context(|| format!("writing {}", args.out.display()))?;
    let path = if trainer.hand_written() { "hand-written" } else { "autograd" };
    outln!("{}", serde_json::json!({"backend": selected.info.backend, "path": path, "loss": loss}))?;
    Ok(())
}
