//! `needle build`: export a checkpoint (optionally with a LoRA adapter merged) to a `.cact`.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use needle_engine::cact::{build_cact, merge_lora, write_cact, Bits, BitsChoice};
use needle_engine::checkpoint::Checkpoint;
use needle_engine::lora::load_adapter;
use needle_engine::tokenizer::Tokenizer;

/// Export a checkpoint to the `.cact` the runtime loads.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Base checkpoint (.pkl) to export
    pub checkpoint: PathBuf,
    /// LoRA adapter (.pkl) to merge before export
    #[arg(long)]
    pub lora: Option<PathBuf>,
    /// Output .cact path [default: the checkpoint's stem + .cact, in the current directory]
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Uniform CQ width [default: the checkpoint's weight_bits map, else 4]
    #[arg(long, value_parser = parse_bits)]
    pub bits: Option<Bits>,
    /// SentencePiece model [default: tokenizer.model beside the checkpoint]
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
}

/// `--bits` takes the reference's choices, 2 or 4.
fn parse_bits(value: &str) -> Result<Bits, String> {
    match value {
        "2" => Ok(Bits::Two),
        "4" => Ok(Bits::Four),
        other => Err(format!("{other:?} is not a supported width; use 2 or 4")),
    }
}

/// The reference's default: the checkpoint's file stem + `.cact`, in the current directory.
fn default_out(checkpoint: &Path) -> PathBuf {
    let stem = checkpoint.file_stem().map_or_else(|| "needle".into(), |s| s.to_os_string());
    let mut name = stem;
    name.push(".cact");
    PathBuf::from(name)
}

/// Python's `repr` of a path string, for the `next` hint line the reference prints.
fn python_repr(path: &Path) -> String {
    format!("'{}'", path.display().to_string().replace('\\', "\\\\").replace('\'', "\\'"))
}

pub fn run(args: Args) -> Result<()> {
    let mut ckpt = Checkpoint::load(&args.checkpoint)?;
    if let Some(lora) = &args.lora {
        let adapter = load_adapter(lora)?;
        merge_lora(&mut ckpt, &adapter)?;
        let groups = adapter.lora.len();
        writeln!(std::io::stdout().lock(), "  {:<9} {groups} weight groups  {}", "merged", lora.display())?;
    }
    let bits = BitsChoice::resolve(args.bits, &ckpt.config)
        .with_context(|| format!("{}: config weight_bits", args.checkpoint.display()))?;
    let tokenizer_path =
        args.tokenizer.clone().unwrap_or_else(|| needle_engine::tokenizer::default_path(&args.checkpoint));
    let tokenizer = Tokenizer::load(&tokenizer_path)?;
    let built = build_cact(&ckpt, &bits, &tokenizer.to_cact_blob())?;
    let out = args.out.clone().unwrap_or_else(|| default_out(&args.checkpoint));
    write_cact(&out, &built.bytes)?;
    // Written, not println!'d: a closed pipe (`needle build … | head`) is an error, not a panic.
    let mut stdout = std::io::stdout().lock();
    writeln!(
        stdout,
        "  {:<9} {}  {:.2} MB  {} tensors  {}A8",
        "wrote",
        out.display(),
        built.bytes.len() as f64 / 1e6,
        built.num_tensors,
        bits.scheme()
    )?;
    writeln!(stdout, "  {:<9} needle.Needle(weights={}, tools=[...])", "next", python_repr(&out))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use needle_engine::cact::CactFile;

    use super::*;

    const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures");

    #[test]
    fn builds_a_fixture_with_its_adapter_like_the_reference() {
        let out = std::env::temp_dir().join(format!("needle-build-test-{}.cact", std::process::id()));
        let args = Args {
            checkpoint: PathBuf::from(FIXTURES).join("models/tiny_f16.pkl"),
            lora: Some(PathBuf::from(FIXTURES).join("golden/tiny_f16/adapter.pkl")),
            out: Some(out.clone()),
            bits: Some(Bits::Two),
            tokenizer: None,
        };
        run(args).unwrap();
        let ours = CactFile::open(&out).unwrap();
        std::fs::remove_file(&out).unwrap();
        let gold = CactFile::open(&PathBuf::from(FIXTURES).join("golden/tiny_f16/w2_lora.cact")).unwrap();
        assert_eq!(ours.preamble(), gold.preamble());
        ours.verify().unwrap();
    }

    #[test]
    fn output_defaults_to_the_checkpoint_stem_in_the_current_directory() {
        assert_eq!(default_out(Path::new("runs/base.v2.pkl")), PathBuf::from("base.v2.cact"));
        assert_eq!(default_out(Path::new("ckpt")), PathBuf::from("ckpt.cact"));
    }

    #[test]
    fn bits_accepts_only_the_reference_choices() {
        assert_eq!(parse_bits("2"), Ok(Bits::Two));
        assert_eq!(parse_bits("4"), Ok(Bits::Four));
        assert!(parse_bits("3").is_err());
    }

    #[test]
    fn next_hint_quotes_the_path_like_python() {
        assert_eq!(python_repr(Path::new("it's.cact")), r"'it\'s.cact'");
    }
}
