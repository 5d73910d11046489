//! The depth ladder, measured (`needle eval --ladder`): a model whose every depth is a trained
//! model ([`Shipping::depth_ladder`](crate::cact::export::Shipping)) scored rung by rung, so a user
//! can pick the smallest that still makes the calls.
//!
//! Each rung is built as `needle build --layers N` builds it, in memory (its size is then the
//! file's, byte for byte, with no second account of the `.cact` layout to keep in step), read back
//! and run as the Needle engine runs the `.cact` ([`Precision::W4a8`]: every CQ-W4 weight from the
//! file's codes with 8-bit activations on the integer kernels, the FP16 tensors as stored), and
//! asked the same held-out examples, each answer read
//! by the confidence head the rung's file carries (its rows for the kept depths), as it ships.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use candle_core::Device;
use serde::{Deserialize, Serialize};

use super::score::in_memory_cact;
use super::{accuracy, cact_network, Accuracy, Precision, WeightsLoadError};
use crate::cact::export::Shipping;
use crate::cact::ladder::rung;
use crate::cact::{load_checked, merge_adapter, ExportError};
use crate::checkpoint::Checkpoint;
use crate::confidence::TurnHead;
use crate::dataset::Example;
use crate::generation::Generation;
use crate::model::{ModelError, Network};
use crate::tokenizer::Tokenizer;

/// The shallowest rung: a ladder starts at two blocks, its two ends.
pub const SHALLOWEST: usize = 2;

/// One rung scored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Rung {
    /// Its depth: the blocks it keeps.
    pub layers: usize,
    /// The size of its `.cact`.
    pub cact_bytes: u64,
    /// Its calls on the held-out examples, run as the `.cact` runs: exact calls, why the others
    /// are wrong, and its decoding speed here ([`Accuracy::decode_tokens_per_s`]).
    pub calls: Accuracy,
}

/// Every rung asked for, shallowest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Ladder {
    /// The full depth of the model the rungs are cut from.
    pub num_layers: usize,
    /// The held-out examples each rung answered.
    pub examples: usize,
    pub rungs: Vec<Rung>,
}

/// One thing that happened during a sweep, in order: `started`; for each rung `rung`, then an
/// `answered` per example, then `scored`; last `finished` — or `cancelled` (no table: a partial
/// ladder would rank rungs it never tried) or `failed` at any point.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
// `finished` carries every rung's scores and is sent once a sweep.
#[allow(clippy::large_enum_variant)]
pub enum LadderEvent {
    Started {
        /// The depths to score, in the order they will be.
        rungs: Vec<usize>,
        examples: usize,
    },
    /// Rung `index` (1-based) of `of` is being built.
    Rung {
        layers: usize,
        index: usize,
        of: usize,
    },
    Answered {
        layers: usize,
        done: usize,
        total: usize,
    },
    Scored {
        rung: Rung,
    },
    Finished {
        ladder: Ladder,
    },
    Cancelled {
        /// The rungs scored before the cancel.
        scored: usize,
    },
    Failed {
        message: String,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum LadderScoreError {
    #[error(
        "{}: a {generation} model has no depth ladder; the ladder is {}'s (every depth of it a trained model). \
         Score it whole with `needle eval --accuracy`",
        checkpoint.display(),
        laddered_generations()
    )]
    NoLadder { checkpoint: PathBuf, generation: Generation },
    #[error("{}: rung {layers} is not a depth of this {num_layers}-layer model; rungs are {SHALLOWEST} to {num_layers}", checkpoint.display())]
    Depth { checkpoint: PathBuf, layers: usize, num_layers: usize },
    /// Loading, merging, cutting or building a rung, as `needle build` would fail.
    #[error(transparent)]
    Build(#[from] ExportError),
    /// Reading a built rung back.
    #[error(transparent)]
    Weights(Box<WeightsLoadError>),
    #[error("rung {layers}: {source}")]
    Answer { layers: usize, source: ModelError },
}

impl From<WeightsLoadError> for LadderScoreError {
    fn from(error: WeightsLoadError) -> Self {
        Self::Weights(Box::new(error))
    }
}

/// The generations trained with a depth ladder, for messages: "Needle 3".
pub fn laddered_generations() -> String {
    let names: Vec<&str> =
        Generation::ALL.into_iter().filter(|g| Shipping::of(*g).depth_ladder).map(Generation::name).collect();
    names.join(" and ")
}

/// A laddered model ready to be cut: its checkpoint as `needle build` reads it, the adapter merged.
pub struct LadderModel {
    checkpoint: Checkpoint,
    tokenizer: Tokenizer,
    /// The tokenizer as every rung's `.cact` carries it.
    tokenizer_blob: Vec<u8>,
}

impl LadderModel {
    /// The checkpoint at `path` with `lora` merged, refused at once when its generation has no
    /// depth ladder.
    pub fn load(path: &Path, lora: Option<&Path>, tokenizer: Tokenizer) -> Result<Self, LadderScoreError> {
        let mut checkpoint = load_checked(path)?;
        let generation = checkpoint.config.generation;
        if !Shipping::of(generation).depth_ladder {
            return Err(LadderScoreError::NoLadder { checkpoint: path.to_path_buf(), generation });
        }
        if let Some(lora) = lora {
            merge_adapter(&mut checkpoint, lora)?;
        }
        let tokenizer_blob = tokenizer.to_cact_blob(generation);
        Ok(Self { checkpoint, tokenizer, tokenizer_blob })
    }

    pub fn generation(&self) -> Generation {
        self.checkpoint.config.generation
    }

    /// Every rung, shallowest first.
    pub fn depths(&self) -> Vec<usize> {
        (SHALLOWEST..=self.checkpoint.config.num_layers).collect()
    }

    /// Scores the rungs of depth `rungs` (shallowest first whatever their order) on `examples`,
    /// each network on `device`. Stops at the next example when `cancel` is set and returns `None`:
    /// a cancelled sweep has no table.
    pub fn climb(
        &self,
        rungs: &[usize],
        examples: &[Example],
        device: &Device,
        cancel: &AtomicBool,
        mut emit: impl FnMut(LadderEvent),
    ) -> Result<Option<Ladder>, LadderScoreError> {
        let num_layers = self.checkpoint.config.num_layers;
        let mut rungs = rungs.to_vec();
        rungs.sort_unstable();
        rungs.dedup();
        if let Some(&layers) = rungs.iter().find(|&&layers| !(SHALLOWEST..=num_layers).contains(&layers)) {
            let checkpoint = self.checkpoint.source.clone();
            return Err(LadderScoreError::Depth { checkpoint, layers, num_layers });
        }
        emit(LadderEvent::Started { rungs: rungs.clone(), examples: examples.len() });
        let mut ladder = Ladder { num_layers, examples: examples.len(), rungs: Vec::new() };
        for (index, &layers) in rungs.iter().enumerate() {
            emit(LadderEvent::Rung { layers, index: index + 1, of: rungs.len() });
            let (network, head, cact_bytes) = self.built(layers, device)?;
            let progress = |done, total| emit(LadderEvent::Answered { layers, done, total });
            let calls = accuracy(&network, head.as_ref(), &self.tokenizer, examples, cancel, progress, |_| {})
                .map_err(|source| LadderScoreError::Answer { layers, source })?;
            if cancel.load(Ordering::Relaxed) {
                emit(LadderEvent::Cancelled { scored: ladder.rungs.len() });
                return Ok(None);
            }
            let rung = Rung { layers, cact_bytes, calls };
            emit(LadderEvent::Scored { rung: rung.clone() });
            ladder.rungs.push(rung);
        }
        emit(LadderEvent::Finished { ladder: ladder.clone() });
        Ok(Some(ladder))
    }

    /// The rung of depth `layers` as `needle build --layers` writes it, read back and run as the
    /// `.cact` runs, with the confidence head it carries and the size of its file.
    fn built(&self, layers: usize, device: &Device) -> Result<(Network, Option<TurnHead>, u64), LadderScoreError> {
        let source = &self.checkpoint.source;
        let mut checkpoint = self.checkpoint.clone();
        rung(&mut checkpoint, Some(layers))
            .map_err(|source| ExportError::Ladder { checkpoint: checkpoint.source.clone(), source })?;
        let (cact, cact_bytes) = in_memory_cact(&checkpoint, &self.tokenizer_blob)?;
        let head = TurnHead::in_cact(&cact, source).map_err(WeightsLoadError::from)?;
        Ok((cact_network(&cact, source, device, Precision::W4a8)?, head, cact_bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataset::Dataset;
    use crate::fixtures::fixture;

    fn tokenizer() -> Tokenizer {
        Tokenizer::load(&fixture("models/tokenizer.model")).unwrap()
    }

    /// The first `n` examples of the fixture dataset, as `generation` reads them.
    fn examples(generation: Generation, n: usize) -> Vec<Example> {
        let mut examples = Dataset::load(&fixture("data/tool_calls.jsonl"), generation).unwrap().examples;
        examples.truncate(n);
        examples
    }

    #[test]
    fn every_rung_is_scored_shallowest_first_its_size_the_references_build() {
        let model = LadderModel::load(&fixture("models/needle3_heads.safetensors"), None, tokenizer()).unwrap();
        assert_eq!(model.depths(), [2, 3, 4]);
        let examples = examples(model.generation(), 3);
        let mut events = Vec::new();
        let ladder = model
            .climb(&[4, 2, 3], &examples, &Device::Cpu, &AtomicBool::new(false), |event| events.push(event))
            .unwrap()
            .expect("not cancelled");
        let depths: Vec<usize> = ladder.rungs.iter().map(|rung| rung.layers).collect();
        assert_eq!((ladder.num_layers, ladder.examples, depths), (4, 3, vec![2, 3, 4]));
        let sizes: Vec<u64> = ladder.rungs.iter().map(|rung| rung.cact_bytes).collect();
        assert!(sizes.windows(2).all(|pair| pair[0] < pair[1]), "{sizes:?}");
        // 3.2.8's own builds of the whole model and of its rung of three.
        let size = |golden: &str| std::fs::metadata(fixture(golden)).unwrap().len();
        assert_eq!(sizes[1..], [size("golden/needle3_heads/layers3.cact"), size("golden/needle3_heads/base.cact")]);
        for rung in &ladder.rungs {
            let calls = &rung.calls;
            assert_eq!(calls.breakdown.kinds.values().sum::<usize>(), 3, "rung {}: {calls:?}", rung.layers);
            assert_eq!(calls.breakdown.kinds.get(&super::super::AnswerKind::Exact).copied().unwrap_or(0), calls.exact);
            assert!(calls.decode_tokens_per_s > 0.0, "rung {}: {calls:?}", rung.layers);
        }
        let started = LadderEvent::Started { rungs: vec![2, 3, 4], examples: 3 };
        assert_eq!((events.first(), events.last()), (Some(&started), Some(&LadderEvent::Finished { ladder })));
        let answered = events.iter().filter(|event| matches!(event, LadderEvent::Answered { .. })).count();
        assert_eq!(answered, 3 * 3);
    }

    #[test]
    fn each_rung_answers_with_the_confidence_head_its_file_carries() {
        // The build fixture's base has a confidence head, which every rung keeps its rows of; an
        // adapter without a trained head beside it drops it, as 3.2.8's build does.
        let checkpoint = fixture("models/needle3_heads.safetensors");
        let adapter = fixture("golden/needle3_heads/adapter.safetensors");
        for (lora, carries) in [(None, true), (Some(adapter.as_path()), false)] {
            let model = LadderModel::load(&checkpoint, lora, tokenizer()).unwrap();
            for layers in model.depths() {
                let (network, head, _) = model.built(layers, &Device::Cpu).unwrap();
                assert_eq!(head.is_some(), carries, "rung {layers}, adapter {lora:?}");
                let Some(head) = head else { continue };
                let mut forward = crate::model::Forward::new(network).unwrap();
                // Its rows read the rung's own cells, one per kept depth.
                let read = head.confidence(&mut forward, &[2, 40, 41, 7], &[300, 12]).unwrap();
                assert!((0.0..=1.0).contains(&read), "rung {layers}: {read}");
            }
        }
    }

    #[test]
    fn a_cancelled_sweep_stops_at_the_next_example_and_has_no_table() {
        let model = LadderModel::load(&fixture("models/needle3_tiny.safetensors"), None, tokenizer()).unwrap();
        let examples = examples(model.generation(), 3);
        let (cancel, mut events) = (AtomicBool::new(false), Vec::new());
        let ladder = model
            .climb(&model.depths(), &examples, &Device::Cpu, &cancel, |event| {
                if matches!(event, LadderEvent::Answered { layers: 3, done: 1, .. }) {
                    cancel.store(true, Ordering::Relaxed);
                }
                events.push(event);
            })
            .unwrap();
        assert_eq!(ladder, None);
        assert_eq!(events.last(), Some(&LadderEvent::Cancelled { scored: 1 }));
        assert!(!events.iter().any(|event| matches!(event, LadderEvent::Finished { .. })), "{events:?}");
    }

    #[test]
    fn a_needle2_model_is_told_the_ladder_is_needle3s_and_a_rung_must_be_a_depth() {
        let checkpoint = fixture("models/pretrained.pkl");
        let Err(refused) = LadderModel::load(&checkpoint, None, tokenizer()) else { panic!("a Needle 2 ladder") };
        assert_eq!(
            refused.to_string(),
            format!(
                "{}: a Needle 2 model has no depth ladder; the ladder is Needle 3's (every depth of it a trained \
                 model). Score it whole with `needle eval --accuracy`",
                checkpoint.display()
            )
        );
        let model = LadderModel::load(&fixture("models/needle3_tiny.safetensors"), None, tokenizer()).unwrap();
        let mut events = Vec::new();
        let climbed = model.climb(&[2, 5], &[], &Device::Cpu, &AtomicBool::new(false), |event| events.push(event));
        let Err(error) = climbed else { panic!("rung 5 of a 4-layer model was scored") };
        assert!(
            error.to_string().ends_with("rung 5 is not a depth of this 4-layer model; rungs are 2 to 4"),
            "{error}"
        );
        assert!(events.is_empty(), "{events:?}");
    }
}
