//! Progress of a training run as typed events: the CLI renders them as a progress bar or as JSON
//! lines (`--events jsonl`), and the desktop app consumes the same stream.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::calls::CallScores;

/// One thing that happened during `needle finetune`, in order: `started`, then `step`s with an
/// `epoch` and a `saved` after each epoch, `head_fitted` or `no_head` when a confidence head was
/// asked for, then `finished` — or `failed` at any point.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
// `finished` carries two models' scores and is sent once a run; boxing them would only make the
// app unpack them.
#[allow(clippy::large_enum_variant)]
pub enum Event {
    Started {
        backend: String,
        device: String,
        /// Training examples (after the validation split).
        examples: usize,
        /// Held-out validation examples.
        validation: usize,
        seq_len: usize,
        /// Optimizer updates in the whole run.
        steps: usize,
        warmup: usize,
        memory_estimate_bytes: u64,
        /// The update the run starts from (non-zero when resumed).
        first_step: usize,
    },
    Step {
        step: usize,
        total: usize,
        #[serde(deserialize_with = "number::f32")]
        loss: f32,
        #[serde(deserialize_with = "number::f32")]
        lr: f32,
        #[serde(deserialize_with = "number::f64")]
        tokens_per_s: f64,
        #[serde(deserialize_with = "number::f64")]
        eta_s: f64,
    },
    Epoch {
        epoch: usize,
        /// The loss of the epoch's last batch (the reference prints the same).
        #[serde(deserialize_with = "number::f32")]
        loss: f32,
        /// Mean validation loss over validation batches; `None` without a validation split.
        #[serde(deserialize_with = "number::optional_f32")]
        val: Option<f32>,
    },
    Saved {
        path: PathBuf,
    },
    /// The held-out examples are being answered, to score the calls of the base and tuned models.
    Scoring {
        examples: usize,
    },
    /// The held-out examples could not be scored (the adapter is saved all the same).
    Unscored {
        message: String,
    },
    /// The confidence head was fitted to the tuned model and saved beside the adapter (after the
    /// last `saved`, before `scoring`).
    HeadFitted {
        path: PathBuf,
        /// Training rows labelled by the shipped model's answers, and how many it answered right.
        rows: usize,
        right: usize,
        /// The area under the ROC curve of the cross-fitted logits (`None` when every label is alike).
        #[serde(deserialize_with = "number::optional_f64")]
        auroc: Option<f64>,
        /// Whether the fit started from the base's own head.
        from_base: bool,
        /// Seconds it took: answering the training rows, collecting their cells, fitting.
        #[serde(deserialize_with = "number::f64")]
        seconds: f64,
    },
    /// No confidence head was fitted, and why (the adapter is saved all the same).
    NoHead {
        message: String,
    },
    Finished {
        adapter: PathBuf,
        #[serde(deserialize_with = "number::f64")]
        seconds: f64,
        /// True when the run was cancelled before its last step.
        partial: bool,
        /// Exact-call accuracy of the base and tuned models on the held-out examples (the first
        /// [`SCORED_EXAMPLES`](super::finetune::SCORED_EXAMPLES)); `None` for a partial run or without a
        /// validation split.
        #[serde(default)]
        accuracy: Option<CallScores>,
    },
    Failed {
        message: String,
    },
}

/// Reading the floats of an [`Event`] back (the desktop app follows the CLI's JSON lines).
///
/// serde buffers an internally tagged enum's fields before it knows the variant, and with
/// serde_json's `arbitrary_precision` (which `pyjson` needs) a buffered float is serde_json's number
/// token, which `f32` and `f64` refuse. A `serde_json::Number` accepts that token, so the floats are
/// read as one and converted.
pub(crate) mod number {
    use serde::{Deserialize, Deserializer};
    use serde_json::Number;

    fn float(number: &Number) -> f64 {
        // Every number the CLI writes is finite and fits an f64.
        number.as_f64().unwrap_or(f64::NAN)
    }

    pub fn f64<'de, D: Deserializer<'de>>(deserializer: D) -> Result<f64, D::Error> {
        Number::deserialize(deserializer).map(|n| float(&n))
    }

    pub fn f32<'de, D: Deserializer<'de>>(deserializer: D) -> Result<f32, D::Error> {
        f64(deserializer).map(|value| value as f32)
    }

    pub fn optional_f32<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<f32>, D::Error> {
        Option::<Number>::deserialize(deserializer).map(|n| n.map(|n| float(&n) as f32))
    }

    pub fn optional_f64<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<f64>, D::Error> {
        Option::<Number>::deserialize(deserializer).map(|n| n.as_ref().map(float))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::calls::{Accuracy, Answered, Breakdown, ModelScore, Reliability, Scored, Verdict};

    #[test]
    fn every_event_reads_back_from_its_json_line() {
        // A wrong answer with a float in it: the enum buffers it as serde_json's number token.
        let expected = vec![serde_json::json!({"name": "lights", "arguments": {"level": 1}})];
        let given = vec![serde_json::json!({"name": "lights", "arguments": {"level": 0.5}})];
        let verdict = Verdict::of(Some(&expected), Some(&given));
        let mut breakdown = Breakdown::default();
        breakdown.add(&["lights".into()], Some(&expected), Some(&given), &verdict);
        let events = [
            Event::Started {
                backend: "cpu".into(),
                device: "test".into(),
                examples: 9,
                validation: 1,
                seq_len: 64,
                steps: 3,
                warmup: 1,
                memory_estimate_bytes: 1 << 20,
                first_step: 0,
            },
            Event::Step { step: 1, total: 3, loss: 2.5, lr: 1e-4, tokens_per_s: 123.5, eta_s: 0.25 },
            Event::Epoch { epoch: 1, loss: 2.25, val: Some(2.75) },
            Event::Epoch { epoch: 2, loss: 2.0, val: None },
            Event::Saved { path: "adapter.pkl".into() },
            Event::HeadFitted {
                path: "adapter.pkl.head.safetensors".into(),
                rows: 24,
                right: 17,
                auroc: Some(0.75),
                from_base: false,
                seconds: 3.5,
            },
            Event::HeadFitted { path: "h".into(), rows: 2, right: 1, auroc: None, from_base: true, seconds: 0.25 },
            Event::NoHead { message: "cancelled".into() },
            Event::Scoring { examples: 3 },
            Event::Unscored { message: "out of memory".into() },
            Event::Finished { adapter: "adapter.pkl".into(), seconds: 1.5, partial: true, accuracy: None },
            Event::Finished {
                adapter: "adapter.pkl".into(),
                seconds: 2.5,
                partial: false,
                accuracy: Some(CallScores {
                    base: ModelScore {
                        loss: 2.5,
                        calls: Accuracy {
                            examples: 2,
                            exact: 1,
                            exact_rate: 0.5,
                            tokens_per_s: 12.5,
                            breakdown,
                            confidence: Reliability::of(&[
                                Scored { exact: true, confidence: 0.75 },
                                Scored { exact: false, confidence: 0.25 },
                            ]),
                            ..Default::default()
                        },
                        wrong: vec![Answered {
                            line: 3,
                            query: "lights on".into(),
                            expected: Some(expected),
                            given: Some(given),
                            text: "<think></think>".into(),
                            exact: false,
                            verdict: Some(verdict),
                            confidence: Some(0.25),
                            decode: Some(0.25),
                            head: None,
                        }],
                    },
                    tuned: ModelScore {
                        loss: 1.25,
                        calls: Accuracy { examples: 2, exact: 2, exact_rate: 1.0, ..Default::default() },
                        wrong: vec![],
                    },
                }),
            },
            Event::Failed { message: "no".into() },
        ];
        for event in events {
            let line = serde_json::to_string(&event).unwrap();
            let back: Event = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line}: {e}"));
            assert_eq!(back, event, "{line}");
        }
    }
}
