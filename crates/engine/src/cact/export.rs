//! The whole `needle build` flow — load the checkpoint, merge an adapter, quantize, write — as one
//! function that reports its stages, so the CLI's text, its `--events jsonl` stream and the desktop
//! app's progress bar all come from the same steps.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::ladder::{rung, LadderError};
use super::tensors::check_params;
use super::{build_cact, write_cact, Bits, BitsChoice, BitsMapError, BuildError, WriteError};
use crate::checkpoint::Checkpoint;
use crate::confidence::file::{companion_path, HeadFileError, Reading, TrainedHead};
use crate::confidence::head::KEY;
use crate::generation::Generation;
use crate::lora::{merge_adapter_file, LoadError, MergeInto};
use crate::tokenizer::{Tokenizer, TokenizerError};

/// What to export, and where.
#[derive(Debug, Clone)]
pub struct ExportOptions {
    pub checkpoint: PathBuf,
    /// A LoRA adapter (`.pkl` or `.safetensors`) to merge first.
    pub lora: Option<PathBuf>,
    pub tokenizer: PathBuf,
    /// A uniform width; `None` uses the checkpoint's `weight_bits` map, else 4.
    pub bits: Option<Bits>,
    /// Needle 3: the depth-ladder rung to export (`None`: every layer).
    pub layers: Option<usize>,
    pub out: PathBuf,
}

/// One thing that happened during an export, in order: `stage`s (with `merged` after the merge),
/// then `built` — or `failed` at any point.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum ExportEvent {
    /// Stage `index` (1-based) of `of` is starting.
    Stage {
        label: String,
        index: usize,
        of: usize,
    },
    Merged {
        adapter: PathBuf,
        groups: usize,
        /// The confidence head trained for this adapter, shipped in place of the base's.
        head: Option<PathBuf>,
    },
    Built {
        path: PathBuf,
        bytes: u64,
        tensors: usize,
        scheme: String,
    },
    Failed {
        message: String,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error("{}: config weight_bits: {source}", checkpoint.display())]
    Bits { checkpoint: PathBuf, source: BitsMapError },
    #[error("{}: {refusal}; leave out --bits", checkpoint.display())]
    Width { checkpoint: PathBuf, refusal: String },
    #[error("{}: {source}", checkpoint.display())]
    Ladder { checkpoint: PathBuf, source: LadderError },
    #[error("{}: --layers picks a rung of a depth ladder; a {generation} model has none, so export it whole", checkpoint.display())]
    NoLadder { checkpoint: PathBuf, generation: Generation },
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error(transparent)]
    Build(#[from] BuildError),
    #[error(transparent)]
    Write(#[from] WriteError),
    #[error(transparent)]
    Head(#[from] HeadFileError),
    #[error("{}: the confidence head does not fit the checkpoint: {problem}; fit it again with `needle finetune --confidence` on this checkpoint, or move the file away to build without it", head.display())]
    HeadMismatch { head: PathBuf, problem: String },
}

/// What a generation's build writes.
#[derive(Debug)]
pub struct Shipping {
    /// The weight widths its package builds, the default first.
    pub bits: &'static [Bits],
    /// Whether every depth of the model is a smaller model (`needle build --layers`).
    pub depth_ladder: bool,
    /// Parameter prefixes a build with an adapter leaves out: a probe head the adapter did not
    /// train would judge the tuned model's answers with the base's judgement.
    pub dropped_on_merge: &'static [&'static str],
}

static NEEDLE2_SHIPS: Shipping =
    Shipping { bits: &[Bits::Four, Bits::Two], depth_ladder: false, dropped_on_merge: &[] };
static NEEDLE3_SHIPS: Shipping =
    Shipping { bits: &[Bits::Four], depth_ladder: true, dropped_on_merge: &["confidence_head/"] };

impl Shipping {
    pub fn of(generation: Generation) -> &'static Self {
        match generation {
            Generation::Needle2 => &NEEDLE2_SHIPS,
            Generation::Needle3 => &NEEDLE3_SHIPS,
        }
    }

    /// Why a build of `generation` at `bits` is refused, if it is: a generation ships only the
    /// widths its package builds.
    pub fn refuses(&self, generation: Generation, bits: Bits) -> Option<String> {
        (!self.bits.contains(&bits)).then(|| {
            let offered: Vec<String> = self.bits.iter().map(|b| format!("W{}", b.record_bits())).collect();
            format!(
                "a {generation} .cact is {} only (as {} builds it), not W{}",
                offered.join(" or "),
                generation.package(),
                bits.record_bits()
            )
        })
    }
}

/// Exports `options.checkpoint` (with `options.lora` merged) to `options.out`, written atomically.
/// Returns the `built` event it emitted last.
pub fn export(options: &ExportOptions, emit: impl FnMut(ExportEvent)) -> Result<ExportEvent, ExportError> {
    let mut progress = Progress { emit, index: 0, of: if options.lora.is_some() { 5 } else { 4 } };
    progress.stage("Loading the checkpoint");
    let mut ckpt = load_checked(&options.checkpoint)?;
    let generation = ckpt.config.generation;
    let ships = Shipping::of(generation);
    let checkpoint = || options.checkpoint.clone();
    if options.layers.is_some() && !ships.depth_ladder {
        return Err(ExportError::NoLadder { checkpoint: checkpoint(), generation });
    }
    if let Some(refusal) = options.bits.and_then(|bits| ships.refuses(generation, bits)) {
        return Err(ExportError::Width { checkpoint: checkpoint(), refusal });
    }
    if let Some(lora) = &options.lora {
        progress.stage("Merging the adapter");
        let MergedAdapter { groups, head } = merge_adapter(&mut ckpt, lora)?;
        (progress.emit)(ExportEvent::Merged { adapter: lora.clone(), groups, head });
    }
    rung(&mut ckpt, options.layers).map_err(|source| ExportError::Ladder { checkpoint: checkpoint(), source })?;
    progress.stage("Loading the tokenizer");
    let tokenizer = Tokenizer::load(&options.tokenizer)?;
    let bits = BitsChoice::resolve(options.bits, &ckpt.config)
        .map_err(|source| ExportError::Bits { checkpoint: checkpoint(), source })?;
    progress.stage("Quantizing");
    let built = build_cact(&ckpt, &bits, &tokenizer.to_cact_blob(generation))?;
    progress.stage("Writing");
    write_cact(&options.out, &built.bytes)?;
    let done = ExportEvent::Built {
        path: options.out.clone(),
        bytes: built.bytes.len() as u64,
        tensors: built.num_tensors,
        scheme: format!("{}A8", bits.scheme()),
    };
    (progress.emit)(done.clone());
    Ok(done)
}

/// The checkpoint at `path` with its params checked against its config: the merge and the
/// quantizer slice and loop over the params' dimensions, so those must be the config's before
/// either runs.
pub fn load_checked(path: &Path) -> Result<Checkpoint, ExportError> {
    let ckpt = Checkpoint::load(path).map_err(LoadError::from)?;
    check_params(&ckpt)?;
    Ok(ckpt)
}

/// What merging an adapter did.
pub struct MergedAdapter {
    /// The weight groups merged.
    pub groups: usize,
    /// The trained confidence head shipped, if the adapter has one beside it.
    pub head: Option<PathBuf>,
}

/// Merges the adapter at `lora` into `ckpt` as `needle build` does, then puts the confidence head
/// `needle finetune --confidence` trained for it, if it kept one, where the base's was.
pub fn merge_adapter(ckpt: &mut Checkpoint, lora: &Path) -> Result<MergedAdapter, ExportError> {
    let adapter = merge_adapter_file(lora, MergeInto::Checkpoint(ckpt))?;
    // As 3.x's build: a probe head the adapter did not train would judge the tuned model's
    // answers with the base's judgement; the runtime then reports none.
    let dropped = Shipping::of(ckpt.config.generation).dropped_on_merge;
    ckpt.params.retain(|path, _| !dropped.iter().any(|head| path.starts_with(head)));
    let head = ship_trained_head(ckpt, lora)?;
    Ok(MergedAdapter { groups: adapter.lora.len(), head })
}

/// Replaces `ckpt`'s confidence head (or gives it one) with the head trained for the adapter at
/// `lora`, calibration folded in, when that head's file is there: the `.cact` then carries it as
/// any head (manifest code 2), where 3.2.8's build ships none. The file's path, if there was one.
fn ship_trained_head(ckpt: &mut Checkpoint, lora: &Path) -> Result<Option<PathBuf>, ExportError> {
    let path = companion_path(lora);
    if !path.is_file() {
        return Ok(None);
    }
    let trained = TrainedHead::load(&path)?;
    let mismatch = |problem: String| ExportError::HeadMismatch { head: path.clone(), problem };
    if let Some(problem) = trained.misfit(&ckpt.config) {
        return Err(mismatch(problem));
    }
    // A `.cact` records no reading: a head read from one reads the prompt and the answer, so a
    // head an earlier run fitted to the prompt alone would be read the wrong way.
    if trained.reads != Reading::PromptAndAnswer {
        return Err(mismatch(
            "it reads the prompt alone, while a head in a .cact is read on the prompt and the answer".into(),
        ));
    }
    let params = trained.shipped_params().map_err(|e| HeadFileError::Invalid {
        path: path.clone(),
        problem: format!("its values cannot be read ({e})"),
    })?;
    let prefix = format!("{KEY}/");
    ckpt.params.retain(|name, _| !name.starts_with(&prefix));
    ckpt.params.extend(params);
    Ok(Some(path))
}

/// Numbers the stages as they start.
struct Progress<F> {
    emit: F,
    index: usize,
    of: usize,
}

impl<F: FnMut(ExportEvent)> Progress<F> {
    fn stage(&mut self, label: &str) {
        self.index += 1;
        (self.emit)(ExportEvent::Stage { label: label.to_string(), index: self.index, of: self.of });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures");

    #[test]
    fn reports_every_stage_in_order_and_writes_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let options = ExportOptions {
            checkpoint: PathBuf::from(FIXTURES).join("models/tiny_f16.pkl"),
            lora: Some(PathBuf::from(FIXTURES).join("golden/tiny_f16/adapter.pkl")),
            tokenizer: PathBuf::from(FIXTURES).join("models/tokenizer.model"),
            bits: Some(Bits::Four),
            layers: None,
            out: dir.path().join("tuned.cact"),
        };
        let mut events = Vec::new();
        let done = export(&options, |event| events.push(event)).unwrap();
        let stages: Vec<(usize, usize)> = events
            .iter()
            .filter_map(|event| match event {
                ExportEvent::Stage { index, of, .. } => Some((*index, *of)),
                _ => None,
            })
            .collect();
        assert_eq!(stages, (1..=5).map(|i| (i, 5)).collect::<Vec<_>>());
        assert!(matches!(events[2], ExportEvent::Merged { groups, .. } if groups > 0));
        let ExportEvent::Built { path, bytes, tensors, scheme } = &done else { panic!("{done:?}") };
        assert_eq!(events.last(), Some(&done));
        assert_eq!(std::fs::metadata(path).unwrap().len(), *bytes);
        assert_eq!(scheme, "W4A8");
        assert_eq!(crate::cact::CactFile::open(path).unwrap().records.len(), *tensors);
    }

    #[test]
    fn params_that_disagree_with_the_config_stop_the_export_before_the_merge() {
        // `make_hostile.py`'s checkpoint whose embedding is half as wide as its config's d_model.
        let dir = tempfile::tempdir().unwrap();
        let checkpoint = PathBuf::from(FIXTURES).join("hostile/build-shape-mismatch.pkl");
        let options = ExportOptions {
            checkpoint: checkpoint.clone(),
            lora: Some(PathBuf::from(FIXTURES).join("golden/tiny_f16/adapter.pkl")),
            tokenizer: PathBuf::from(FIXTURES).join("models/tokenizer.model"),
            bits: Some(Bits::Four),
            layers: None,
            out: dir.path().join("never.cact"),
        };
        let mut events = Vec::new();
        let err = export(&options, |event| events.push(event)).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "{}: parameter `embedding/embedding` has shape [512, 32] but the export needs [512, 64]; the params \
                 do not match the config",
                checkpoint.display()
            )
        );
        assert_eq!(events.len(), 1, "only the loading stage started: {events:?}");
        assert!(!options.out.exists());
    }
}
