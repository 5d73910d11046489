//! `needle backend`: which device training would run on, and why.

use needle_engine::backend::{self, DeviceRequest};

#[derive(clap::Args, serde::Serialize)]
pub struct Args {
    /// Force a backend (auto, cpu, cuda, metal); default: NEEDLE_DEVICE, else auto.
    #[arg(long)]
    pub device: Option<String>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let selected = backend::select(DeviceRequest::resolve(args.device.as_deref())?)?;
    let info = selected.info;
    if args.json {
        outln!("{}", serde_json::to_string(&info)?)?;
        return Ok(());
    }
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    outln!("  {:<9} {}", "backend", info.backend)?;
    outln!("  {:<9} {}", "device", info.device)?;
    match (info.memory_bytes, info.memory_free_bytes) {
        (Some(total), Some(free)) => outln!("  {:<9} {:.1} GiB ({:.1} GiB free)", "memory", gib(total), gib(free))?,
        (Some(total), None) => outln!("  {:<9} {:.1} GiB", "memory", gib(total))?,
        _ => outln!("  {:<9} unknown", "memory")?,
    }
    let compiled: Vec<String> = info.compiled.iter().map(ToString::to_string).collect();
    outln!("  {:<9} {}", "compiled", compiled.join(", "))?;
    outln!("  {:<9} {}", "reason", info.reason)?;
    Ok(())
}
