//! `needle download`: fetch the base model (or any file of a hub repository) into the cache, and the
//! terminal view of hub progress that every command shows when it has to download first.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

use anyhow::{Context, Result};
use indicatif::ProgressBar;
use needle_engine::generation::Generation;
use needle_engine::hub::{self, BaseModel, Hub, HubEvent, PublishedBase, RepoFile};

use crate::events::{print_json, EventFormat};
use crate::progress;

/// Download a base model's checkpoint and tokenizer (or the file named) into the Hugging Face cache.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// `org/repo` for its base-model files, or `org/repo/path/to/file` [default: the --generation's
    /// repository]
    pub spec: Option<String>,
    /// Whose base-model files to fetch: 3 (Cactus-Compute/needle3's checkpoints/needle3.safetensors, as
    /// cactus-needle 3.x) or 2 (Cactus-Compute/needle2's checkpoints/needle2.pkl) [default: the
    /// repository's own generation when it is one of these two, else 3]
    #[arg(long)]
    pub generation: Option<Generation>,
    /// Branch, tag or commit
    #[arg(long, default_value = hub::DEFAULT_REVISION)]
    pub revision: String,
    /// Also copy the files into this folder
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Print progress as one JSON event per line on stdout
    #[arg(long, value_enum)]
    pub events: Option<EventFormat>,
}

/// The files a spec names: `org/repo` means a base model's checkpoint and tokenizer in it (those of
/// `generation`, else of the published base model that repository is, else the CLI's default
/// generation's), more segments one file; no spec, `generation`'s published base model.
fn files(spec: Option<&str>, generation: Option<Generation>, revision: &str) -> Result<Vec<RepoFile>> {
    let Some(spec) = spec else {
        let base = PublishedBase::of(generation.unwrap_or_default());
        return Ok(base.files(base.repo, revision).to_vec());
    };
    let parts: Vec<&str> = spec.split('/').filter(|part| !part.is_empty()).collect();
    match parts[..] {
        [org, name] => {
            let repo = format!("{org}/{name}");
            let base = match (generation, PublishedBase::in_repo(&repo)) {
                (Some(generation), _) => PublishedBase::of(generation),
                (None, Some(published)) => published,
                (None, None) => PublishedBase::of(Generation::default()),
            };
            Ok(base.files(&repo, revision).to_vec())
        }
        [org, name, ref path @ ..] if !path.is_empty() => {
            Ok(vec![RepoFile::new(&format!("{org}/{name}"), revision, &path.join("/"))])
        }
        _ => anyhow::bail!(
            "{spec:?} is not a hub spec: pass org/repo (its checkpoint and tokenizer) or org/repo/path/to/file"
        ),
    }
}

pub fn run(args: Args) -> Result<()> {
    let hub = Hub::from_env();
    let mut stdout = std::io::stdout().lock();
    let mut view = HubView::new(args.events);
    for file in files(args.spec.as_deref(), args.generation, &args.revision)? {
        // An explicit download asks the hub, so a moved branch is followed; offline, the cache answers.
        let (mut on_event, cancel) = (|event: HubEvent| view.show(&event), AtomicBool::new(false));
        let fetched =
            if hub.offline { hub.get(&file, &mut on_event, &cancel) } else { hub.fetch(&file, &mut on_event, &cancel) };
        let cached = fetched.inspect_err(|error| view.show(&HubEvent::Failed { message: error.to_string() }))?;
        let path = match &args.out {
            Some(out) => copy_into(&cached, out)?,
            None => cached,
        };
        if args.events.is_none() {
            let bytes = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
            writeln!(stdout, "  {:<9} {}  {:.2} MB", "file", path.display(), bytes as f64 / 1e6)?;
        }
    }
    Ok(())
}

/// Copies a cached file into `out`, streamed through a temporary file there and renamed, so a cut
/// copy is never left at the destination.
fn copy_into(cached: &Path, out: &Path) -> Result<PathBuf> {
    let name = cached.file_name().context("a cached file has a name")?;
    let dest = out.join(name);
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let mut staged = tempfile::NamedTempFile::new_in(out).with_context(|| format!("writing into {}", out.display()))?;
    let mut source = std::fs::File::open(cached).with_context(|| format!("reading {}", cached.display()))?;
    std::io::copy(&mut source, &mut staged)
        .with_context(|| format!("copying {} into {}", cached.display(), out.display()))?;
    staged.persist(&dest).with_context(|| format!("writing {}", dest.display()))?;
    Ok(dest)
}

/// The checkpoint and tokenizer a model command uses: the paths given, else `generation`'s published
/// base model from the cache, else from the hub with a progress bar on stderr.
pub fn base_model_of(generation: Generation, checkpoint: Option<&Path>, tokenizer: Option<&Path>) -> Result<BaseModel> {
    let mut view = HubView::new(None);
    let resolved = hub::resolve_base_model(
        &Hub::from_env(),
        generation,
        checkpoint,
        tokenizer,
        &mut |e| view.show(&e),
        &AtomicBool::new(false),
    );
    Ok(resolved?)
}

/// The tokenizer a command uses: the one given, else `generation`'s from the cache or the hub.
pub fn tokenizer(generation: Generation, tokenizer: Option<&Path>) -> Result<PathBuf> {
    let mut view = HubView::new(None);
    let resolved = hub::resolve_tokenizer(
        &Hub::from_env(),
        generation,
        tokenizer,
        None,
        &mut |e| view.show(&e),
        &AtomicBool::new(false),
    );
    Ok(resolved?)
}

/// Hub progress in a terminal: a byte bar with rate and ETA on stderr, or JSON lines on stdout.
pub(crate) struct HubView {
    json: bool,
    bar: Option<ProgressBar>,
}

impl HubView {
    pub(crate) fn new(events: Option<EventFormat>) -> Self {
        Self { json: events.is_some(), bar: None }
    }

    pub(crate) fn show(&mut self, event: &HubEvent) {
        if self.json {
            // A closed stdout ends nothing here: the transfer goes on.
            let _ = print_json(event);
            return;
        }
        match event {
            HubEvent::Started { file, total, resumed_from } => {
                let resumed = if *resumed_from > 0 {
                    format!("  resuming at {:.1} MB", *resumed_from as f64 / 1e6)
                } else {
                    String::new()
                };
                self.start_bar("fetch", file, *total, *resumed_from, &resumed);
            }
            HubEvent::Uploading { file, total } => self.start_bar("push", file, *total, 0, ""),
            HubEvent::Progress { bytes, .. } => {
                if let Some(bar) = &self.bar {
                    bar.set_position(*bytes);
                }
            }
            HubEvent::Downloaded { .. } | HubEvent::Uploaded(_) | HubEvent::Failed { .. } => {
                if let Some(bar) = self.bar.take() {
                    bar.finish_and_clear();
                }
            }
            HubEvent::Cached { .. } => {}
        }
    }

    /// The header line of a transfer (`fetch`, `push`) and its bar, at `position` of `total` bytes.
    fn start_bar(&mut self, verb: &str, file: &str, total: u64, position: u64, note: &str) {
        let bar = progress::bar(total, "{bytes}/{total_bytes}  {bytes_per_sec}  eta {eta}");
        // Printed, not `bar.println`'d: the bar is hidden when stderr is not a terminal.
        noteln!("  {verb:<9} {file}  {:.1} MB{note}", total as f64 / 1e6);
        bar.set_position(position);
        self.bar = Some(bar);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spec_names_the_base_model_files_or_one_file() {
        let [needle2, needle3] = [Generation::Needle2, Generation::Needle3].map(PublishedBase::of);
        let own = |base: &PublishedBase| base.files(base.repo, "main").to_vec();
        assert_eq!(files(None, None, "main").unwrap(), own(needle3), "the CLI's default is Needle 3");
        assert_eq!(files(None, Some(Generation::Needle2), "main").unwrap(), own(needle2));
        // A published repository names its own files; a mirror takes the generation's layout.
        assert_eq!(files(Some("Cactus-Compute/needle3"), None, "main").unwrap(), own(needle3));
        let mirror = files(Some("me/mirror"), Some(Generation::Needle3), "v1").unwrap();
        assert_eq!(mirror, needle3.files("me/mirror", "v1"));
        assert_eq!(files(Some("me/mirror"), None, "v1").unwrap(), needle3.files("me/mirror", "v1"));
        let one = files(Some("org/repo/weights/model.cact"), None, "v1").unwrap();
        assert_eq!(one, [RepoFile::new("org/repo", "v1", "weights/model.cact")]);
        assert!(files(Some("needle2"), None, "main").unwrap_err().to_string().contains("org/repo"));
    }
}
