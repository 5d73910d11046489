//! `needle build`: export a checkpoint (optionally with a LoRA adapter merged) to a `.cact`, and with
//! `--upload` push it to the user's model repository on the hub, as the reference does.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

use anyhow::{Context, Result};
use needle_engine::cact::{export, Bits, ExportEvent, ExportOptions};
use needle_engine::generation::Generation;
use needle_engine::hub::upload::REPO_VAR;
use needle_engine::hub::{Hub, HubEvent, RepoFile, DEFAULT_REVISION};
use needle_engine::settings::parse_build_width;

use crate::download::HubView;
use crate::events::{print_json, EventFormat};

/// Export a checkpoint to the `.cact` the runtime loads.
#[derive(Debug, clap::Args, serde::Serialize)]
pub struct Args {
    /// Base checkpoint (Needle 2 .pkl or Needle 3 .safetensors) to export [default: the --generation's base
    /// model from the Hugging Face cache, downloaded if missing]
    pub checkpoint: Option<PathBuf>,
    /// LoRA adapter (.pkl or .safetensors) to merge before export
    #[arg(long)]
    pub lora: Option<PathBuf>,
    /// Output .cact path [default: the checkpoint's stem + .cact, in the current directory]
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Uniform CQ width [default: the checkpoint's weight_bits map, else 4; Needle 3 is 4 only]
    #[arg(long, value_parser = parse_build_width)]
    #[serde(serialize_with = "width_number")]
    pub bits: Option<Bits>,
    /// Needle 3: export this rung of the depth ladder (2 to the model's layers) [default: every layer]
    #[arg(long)]
    pub layers: Option<usize>,
    /// SentencePiece model [default: tokenizer.model beside the checkpoint, else its generation's]
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// The published base model built without a checkpoint: 2 (Cactus-Compute/needle2, as cactus-needle
    /// 2.0.8) or 3 (Cactus-Compute/needle3, 3.x's default)
    #[arg(long, default_value = Generation::default().number().to_string())]
    #[serde(serialize_with = "crate::inputs::as_number")]
    pub generation: Generation,
    /// Push the built .cact to the model repository named by NEEDLE_HF_REPO (`<you>/<model>`, created
    /// if missing) on the hub at HF_ENDPOINT, with the token in HF_TOKEN
    #[arg(long)]
    pub upload: bool,
    /// Print each stage as one JSON event per line on stdout
    #[arg(long, value_enum)]
    pub events: Option<EventFormat>,
}

/// A width as `--bits` reads it: its number.
fn width_number<S: serde::Serializer>(bits: &Option<Bits>, serializer: S) -> Result<S::Ok, S::Error> {
    serde::Serialize::serialize(&bits.map(Bits::record_bits), serializer)
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

/// `$NEEDLE_HF_REPO`, asked for before the build so that a missing one costs no export.
fn upload_repo() -> Result<String> {
    let repo = std::env::var(REPO_VAR).ok().filter(|repo| !repo.trim().is_empty());
    // The reference's words.
    repo.map(|repo| repo.trim().to_string()).with_context(|| format!("set {REPO_VAR}=<you>/<model> to upload"))
}

/// Pushes the built file to `repo` under its own name, with `needle download`'s progress; returns
/// that name.
fn upload(out: &Path, repo: &str, events: Option<EventFormat>) -> Result<String> {
    let name = out.file_name().with_context(|| format!("{} has no file name to upload under", out.display()))?;
    let name = name.to_string_lossy().into_owned();
    let mut view = HubView::new(events);
    let target = RepoFile::new(repo, DEFAULT_REVISION, &name);
    // The command line stops an upload as it stops a download: by ending the process.
    let never = AtomicBool::new(false);
    let uploaded = Hub::from_env().upload(out, &target, &mut |event| view.show(&event), &never);
    uploaded.inspect_err(|error| view.show(&HubEvent::Failed { message: error.to_string() }))?;
    Ok(name)
}

pub fn run(args: Args) -> Result<()> {
    let repo = args.upload.then(upload_repo).transpose()?;
    let base = crate::download::base_model_of(args.generation, args.checkpoint.as_deref(), args.tokenizer.as_deref())?;
    let options = ExportOptions {
        out: args.out.clone().unwrap_or_else(|| default_out(&base.checkpoint)),
        tokenizer: base.tokenizer,
        checkpoint: base.checkpoint,
        lora: args.lora,
        bits: args.bits,
        layers: args.layers,
    };
    if args.events.is_some() {
        export(&options, |event| drop(print_json(&event))).inspect_err(|error| {
            let _ = print_json(&ExportEvent::Failed { message: error.to_string() });
        })?;
        if let Some(repo) = &repo {
            upload(&options.out, repo, args.events)?;
        }
        return Ok(());
    }
    // Written, not println!'d: a closed pipe (`needle build … | head`) is an error, not a panic.
    let mut stdout = std::io::stdout().lock();
    let mut lines = Vec::new();
    export(&options, |event| lines.extend(text_line(&event)))?;
    for line in lines {
        writeln!(stdout, "{line}")?;
    }
    writeln!(stdout, "  {:<9} needle.Needle(weights={}, tools=[...])", "next", python_repr(&options.out))?;
    if let Some(repo) = &repo {
        let name = upload(&options.out, repo, None)?;
        writeln!(stdout, "  {:<9} {name}  {repo}", "uploaded")?;
    }
    Ok(())
}

/// The reference's two-column lines for the events worth a line.
fn text_line(event: &ExportEvent) -> Option<String> {
    match event {
        ExportEvent::Merged { adapter, groups, head } => {
            let merged = format!("  {:<9} {groups} weight groups  {}", "merged", adapter.display());
            Some(match head {
                Some(head) => {
                    format!("{merged}\n  {:<9} the confidence head trained for it  {}", "head", head.display())
                }
                None => merged,
            })
        }
        ExportEvent::Built { path, bytes, tensors, scheme } => Some(format!(
            "  {:<9} {}  {:.2} MB  {tensors} tensors  {scheme}",
            "wrote",
            path.display(),
            *bytes as f64 / 1e6
        )),
        ExportEvent::Stage { .. } | ExportEvent::Failed { .. } => None,
    }
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
            checkpoint: Some(PathBuf::from(FIXTURES).join("models/tiny_f16.pkl")),
            lora: Some(PathBuf::from(FIXTURES).join("golden/tiny_f16/adapter.pkl")),
            out: Some(out.clone()),
            bits: Some(Bits::Two),
            layers: None,
            tokenizer: None,
            generation: Generation::default(),
            upload: false,
            events: None,
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
        assert_eq!(parse_build_width("2"), Ok(Bits::Two));
        assert_eq!(parse_build_width("4"), Ok(Bits::Four));
        assert!(parse_build_width("3").is_err());
    }

    #[test]
    fn next_hint_quotes_the_path_like_python() {
        assert_eq!(python_repr(Path::new("it's.cact")), r"'it\'s.cact'");
    }
}
