//! The Try panel: one question to the base model and to a training's tuned model, side by side. Each
//! answer is `needle run --json` in the worker, so the weights never load into the window's process.

use std::path::Path;

use needle_engine::checks::Withheld;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::model::preferences::Remembered;
use crate::record::trainings::Records;
use crate::worker::job::Job;
use crate::worker::process::Worker;

/// What the window asks.
#[derive(Debug, Clone, Deserialize)]
pub struct Question {
    /// The training whose adapter answers beside the base; `None` asks the base model alone.
    pub training_id: Option<String>,
    /// The tool schemas, as JSON text (a list).
    pub tools: String,
    pub query: String,
    #[serde(default)]
    pub system: String,
}

/// One model's answer, as `needle run --json` prints it, its withheld calls worded.
#[derive(Debug, Clone, Serialize)]
pub struct TryAnswer {
    pub text: String,
    /// The calls acted on (those that pass the tools' schemas and the grounding check); `None` when
    /// the answer has no parseable `<tool_call>` list.
    pub calls: Option<Vec<Value>>,
    /// The calls the checks held back, each with why.
    pub withheld: Vec<WithheldCall>,
    /// How sure the model is of the turn, in [0, 1].
    pub confidence: f64,
    pub tokens_per_s: f64,
    /// Why decoding stopped (`end_of_turn`, `eos`, `max_new_tokens`, `max_length`).
    pub stop: String,
}

/// A call the checks held back, and why in words.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WithheldCall {
    pub call: Value,
    pub why: String,
}

impl From<Withheld> for WithheldCall {
    fn from(withheld: Withheld) -> Self {
        Self { why: withheld.reason.to_string(), call: withheld.call }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Answers {
    pub base: TryAnswer,
    pub tuned: Option<TryAnswer>,
}

/// Most new tokens an answer may take in the panel.
const MAX_NEW_TOKENS: usize = 256;

pub fn ask(worker: &Worker, records: &Records, base: &Remembered, question: &Question) -> Result<Answers, String> {
    needle_engine::calls::parse_tools(&question.tools).map_err(|problem| format!("Tools: {problem}"))?;
    if question.query.trim().is_empty() {
        return Err("Query: type what the user asks".into());
    }
    let (checkpoint, tokenizer, adapter) = match &question.training_id {
        Some(id) => {
            let entry = records.load(id)?.entry;
            let adapter = entry.adapter.ok_or("this training saved no adapter yet; wait for its first epoch")?;
            (entry.request.checkpoint, entry.request.tokenizer, Some(adapter))
        }
        None => {
            let settings = base.get();
            let checkpoint = settings.checkpoint.ok_or("choose or download a base model first")?;
            let tokenizer = settings.tokenizer.ok_or("choose the base model's tokenizer first")?;
            (checkpoint, tokenizer, None)
        }
    };
    let mut file =
        tempfile::Builder::new().prefix("needle-tools-").suffix(".json").tempfile().map_err(|e| e.to_string())?;
    std::io::Write::write_all(&mut file, question.tools.as_bytes()).map_err(|e| e.to_string())?;
    let ask = |lora: Option<&Path>| answer(worker, question, &checkpoint, &tokenizer, lora, file.path());
    Ok(Answers { base: ask(None)?, tuned: adapter.as_deref().map(|lora| ask(Some(lora))).transpose()? })
}

fn answer(
    worker: &Worker,
    question: &Question,
    checkpoint: &Path,
    tokenizer: &Path,
    lora: Option<&Path>,
    tools: &Path,
) -> Result<TryAnswer, String> {
    let job = Job::Try {
        checkpoint: checkpoint.into(),
        tokenizer: tokenizer.into(),
        lora: lora.map(Into::into),
        tools: tools.into(),
        query: question.query.clone(),
        system: question.system.clone(),
        max_new: MAX_NEW_TOKENS,
    };
    let out = worker.output(&job)?;
    let not_understood = |error: serde_json::Error| format!("the worker's answer was not understood ({error}): {out}");
    let printed: Printed = serde_json::from_str(out.trim()).map_err(not_understood)?;
    Ok(TryAnswer {
        text: printed.text,
        calls: printed.calls,
        withheld: printed.withheld.into_iter().map(WithheldCall::from).collect(),
        confidence: printed.confidence,
        tokens_per_s: printed.tokens_per_s,
        stop: printed.stop,
    })
}

/// What `needle run --json` prints (the fields the panel shows).
#[derive(Deserialize)]
struct Printed {
    text: String,
    calls: Option<Vec<Value>>,
    withheld: Vec<Withheld>,
    confidence: f64,
    tokens_per_s: f64,
    stop: String,
}
