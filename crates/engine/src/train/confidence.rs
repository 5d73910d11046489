//! The end of a run: a confidence head fitted to the tuned model as it ships, and kept beside the
//! adapter ([`crate::confidence::file`]).
//!
//! Every training row is answered by greedy decoding through the W4 weights the `.cact` ships
//! (the adapter merged, then every kernel through CQ), and labelled by whether the answer's calls
//! are exactly the expected ones. The head reads the hidden cells of that same network, computed
//! once: LoRA is frozen and nothing flows back into the network. A base with a head starts from
//! it; one without gets a head initialised as the reference initialises one. The head reads the
//! prompt and the answer the model gave ([`Reading::PromptAndAnswer`]: it told right from wrong
//! answers better than the prompt alone, docs/confidence.md), and is cross-fitted on the training
//! rows. The held-out split is never read.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use serde_json::Value;

use super::error::Result;
use crate::calls::{answer_each, prompt_ids, Precision, Verdict, Weights, ANSWER_SLACK};
use crate::checkpoint::Checkpoint;
use crate::confidence::cells::row_cells;
use crate::confidence::file::{companion_path, Reading, TrainedHead};
use crate::confidence::fit::cross_fit;
use crate::confidence::head::ConfidenceHead;
use crate::dataset::{render, Example};
use crate::lora::LoadError;
use crate::model::packing::common_prefix;
use crate::model::{Device, Forward, Params};
use crate::tokenizer::Tokenizer;

/// What the head reads of a turn: the prompt and the answer the model gave.
const READS: Reading = Reading::PromptAndAnswer;

/// What fitting the head found, for the run's summary.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct HeadSummary {
    /// The companion file written beside the adapter.
    pub path: PathBuf,
    /// Training rows the head was fitted on, and how many of them the shipped model answered
    /// exactly.
    pub rows: usize,
    pub right: usize,
    /// The area under the ROC curve of the cross-fitted logits (`None` when every label is alike).
    pub auroc: Option<f64>,
    /// Whether the fit started from the base's own head.
    pub from_base: bool,
    /// Seconds in all: answering the training rows, collecting their cells, fitting.
    pub seconds: f64,
}

/// How fitting the head ended.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum HeadFit {
    /// Not asked for (no `--confidence`), or the run stopped before its end.
    NotAsked,
    Fitted(HeadSummary),
    /// The shipped model answered every training row right (or every one wrong): nothing tells
    /// them apart, no head is written, and the turn's confidence stays the decode probability.
    AllAlike {
        rows: usize,
        right: usize,
    },
    Cancelled,
    /// It failed (the adapter is saved all the same).
    Failed {
        message: String,
    },
}

impl HeadFit {
    /// Why no head was written, for the run's log: `None` when one was, or none was asked for.
    pub fn missing(&self) -> Option<String> {
        match self {
            Self::NotAsked | Self::Fitted(_) => None,
            Self::AllAlike { rows, right } => {
                Some(format!("the shipped model answered {right} of {rows} training rows right, nothing to tell apart"))
            }
            Self::Cancelled => Some("cancelled".into()),
            Self::Failed { message } => Some(message.clone()),
        }
    }
}

/// The run a head is fitted for: its base, tokenizer and saved adapter, and its seed.
#[derive(Debug, Clone, Copy)]
pub struct HeadRun<'a> {
    pub checkpoint: &'a Path,
    pub tokenizer: &'a Path,
    pub adapter: &'a Path,
    pub seed: u64,
}

/// Fits, calibrates and saves the confidence head of `run`'s adapter on the training `examples`.
pub fn fit_head(run: HeadRun, examples: &[Example], device: &Device, cancel: &AtomicBool) -> Result<HeadFit> {
    let started = Instant::now();
    let tokenizer = Tokenizer::load(run.tokenizer)?;
    let weights = Weights::Checkpoint { checkpoint: run.checkpoint.into(), lora: Some(run.adapter.into()) };
    let network = weights.load_as(device, Precision::QuantizedWeights)?.network;
    let prompts: Vec<(Vec<u32>, usize)> = examples
        .iter()
        .map(|example| {
            let (prompt, target) = render(example);
            (prompt_ids(&tokenizer, &prompt), tokenizer.encode(&target).len() + ANSWER_SLACK)
        })
        .collect();
    let mut answers: Vec<Option<(Vec<u32>, bool)>> = vec![None; examples.len()];
    answer_each(&network, None, &tokenizer, &prompts, cancel, |index, answer| {
        let expected: Option<Vec<Value>> = serde_json::from_str(&examples[index].answers).ok();
        let right = Verdict::of(expected.as_deref(), answer.calls.as_deref()) == Verdict::Exact;
        answers[index] = Some((answer.completion.ids, right));
    })?;
    let Some(answers) = answers.into_iter().collect::<Option<Vec<_>>>() else {
        return Ok(HeadFit::Cancelled);
    };
    let labels: Vec<bool> = answers.iter().map(|(_, right)| *right).collect();
    let right = labels.iter().filter(|&&right| right).count();
    if right == 0 || right == labels.len() {
        return Ok(HeadFit::AllAlike { rows: labels.len(), right });
    }

    let checkpoint = Checkpoint::load(run.checkpoint).map_err(LoadError::from)?;
    let base = ConfidenceHead::load(&checkpoint.config, &Params::from_checkpoint(&checkpoint, device)?)?;
    let from_base = base.is_some();
    let initial = match base {
        Some(head) => head,
        None => ConfidenceHead::initial(&checkpoint.config, device, run.seed)?,
    };
    if cancel.load(Ordering::Relaxed) {
        return Ok(HeadFit::Cancelled);
    }
    let rows: Vec<Vec<u32>> =
        prompts.iter().zip(&answers).map(|((prompt, _), (answer, _))| READS.tokens(prompt, answer)).collect();
    let cells = row_cells(&mut Forward::new(network)?, &rows, None)?;
    let fitted = cross_fit(&initial, &cells, shared_prefix(&rows), &labels, run.seed, |head| head.through_cq())?;
    let path = companion_path(run.adapter);
    TrainedHead { head: fitted.head, calibration: fitted.calibration, reads: READS }.save(&path)?;
    Ok(HeadFit::Fitted(HeadSummary {
        path,
        rows: labels.len(),
        right,
        auroc: fitted.auroc,
        from_base,
        seconds: started.elapsed().as_secs_f64(),
    }))
}

/// How many tokens every row begins with alike (an app's system and tools prompt).
fn shared_prefix(rows: &[Vec<u32>]) -> usize {
    let Some((first, rest)) = rows.split_first() else { return 0 };
    rest.iter().fold(first.len(), |shared, row| common_prefix(&first[..shared], row))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataset::Dataset;
    use crate::fixtures::fixture;
    use crate::generation::Generation;
    use crate::lora::{save_adapter, AdapterMeta, Lora};

    /// The tiny fixture's answers through its W4 weights are all wrong on the example dataset:
    /// fitting a head ends with nothing to tell apart, and writes no file (the demo's run is what
    /// fits one: docs/confidence.md).
    #[test]
    fn answers_all_alike_write_no_head() {
        let dir = tempfile::tempdir().unwrap();
        let checkpoint = fixture("models/tiny_f32.pkl");
        let out = dir.path().join("adapter.pkl");
        let params = Params::from_checkpoint(&Checkpoint::load(&checkpoint).unwrap(), &Device::Cpu).unwrap();
        let lora = Lora::init(&params, 2, 4.0, 0).unwrap();
        let meta = AdapterMeta {
            base: checkpoint.display().to_string(),
            partial: false,
            generation: Generation::Needle2,
            seed: 0,
        };
        save_adapter(&out, &lora, &meta).unwrap();
        let run =
            HeadRun { checkpoint: &checkpoint, tokenizer: &fixture("models/tokenizer.model"), adapter: &out, seed: 0 };
        let examples = Dataset::load(&fixture("data/tool_calls.jsonl"), Generation::Needle2).unwrap().examples;
        let fit = fit_head(run, &examples[..24], &Device::Cpu, &AtomicBool::new(false)).unwrap();
        assert_eq!(fit, HeadFit::AllAlike { rows: 24, right: 0 });
        assert!(!companion_path(&out).exists(), "no head is written when nothing tells the answers apart");
    }
}
