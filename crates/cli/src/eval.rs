//! `needle eval`: the masked answer loss of a checkpoint (optionally with a LoRA adapter) over a
//! whole dataset file.

use std::io::Write;
use std::path::PathBuf;

use crate::inputs::ModelInputs;
use anyhow::{Context, Result};
use needle_engine::backend::{self, DeviceRequest};
use needle_engine::checkpoint::Checkpoint;
use needle_engine::dataset::Dataset;
use needle_engine::lora::load_adapter;
use needle_engine::model::{evaluate, EvalSummary, Network, Params};
use needle_engine::tokenizer::Tokenizer;

/// Measure the masked cross-entropy of the answer tokens over a JSONL file.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub inputs: ModelInputs,
    /// LoRA adapter (.pkl or .safetensors from needle finetune or the reference) to merge first
    #[arg(long)]
    pub lora: Option<PathBuf>,
    /// Longest sequence length; rows use the reference's fit_max_len bucket under it
    #[arg(long, default_value_t = 1024)]
    pub max_len: usize,
    /// Examples per forward pass (memory grows with it; the result does not change)
    #[arg(long, default_value_t = 16)]
    pub batch_size: usize,
    /// Force a backend (auto, cpu, cuda, metal); default: NEEDLE_DEVICE, else auto
    #[arg(long)]
    pub device: Option<String>,
    /// Print one JSON line {"loss", "examples", "tokens", "seq_len", "tokens_per_s"} instead of text
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: Args) -> Result<()> {
    let selected = backend::select(DeviceRequest::resolve(args.device.as_deref())?)?;
    eprintln!("  {:<9} {}  {}", "backend", selected.info.backend, selected.info.device);
    let device = selected.device;
    let base = args.inputs.base_model()?;
    let (config, mut params) = {
        let checkpoint = Checkpoint::load(&base.checkpoint)?;
        // The f32 copy replaces the stored arrays: the checkpoint itself is dropped here.
        let params = Params::from_checkpoint(&checkpoint, &device)
            .with_context(|| format!("reading the weights of {}", base.checkpoint.display()))?;
        (checkpoint.config, params)
    };
    if let Some(path) = &args.lora {
        let merged = params
            .merge_pickled_adapter(&load_adapter(path)?)
            .with_context(|| format!("merging {} into {}", path.display(), base.checkpoint.display()))?;
        eprintln!("  {:<9} {merged} weight groups  {}", "merged", path.display());
    }
    let network = Network::load(&config, &params)
        .with_context(|| format!("building the network of {}", base.checkpoint.display()))?;

    let tokenizer = Tokenizer::load(&base.tokenizer)?;
    network.check_tokenizer_vocab(tokenizer.vocab_size(), &base.tokenizer)?;

    let dataset = Dataset::load(&args.inputs.data)?;
    for problem in &dataset.problems {
        eprintln!("  {:<9} {}: {problem}", "warning", args.inputs.data.display());
    }
    let prepared = dataset.prepare(&tokenizer, args.max_len)?;
    let summary = evaluate(&network, prepared.rows(), prepared.seq_len, args.batch_size, report_progress)?;
    eprintln!();
    print_summary(&summary, args.json)
}

/// `name` in the directory that holds `file`.
fn report_progress(done: usize, total: usize) {
    eprint!("\r  {:<9} {done}/{total} examples", "eval");
    // Progress is best-effort: a closed stderr must not fail the evaluation.
    let _ = std::io::stderr().flush();
}

fn print_summary(summary: &EvalSummary, json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string(summary)?);
    } else {
        println!(
            "  {:<9} {:.4}  ({} answer tokens in {} examples, seq_len {}, {:.0} tokens/s)",
            "loss", summary.loss, summary.tokens, summary.examples, summary.seq_len, summary.tokens_per_s
        );
    }
    Ok(())
}
