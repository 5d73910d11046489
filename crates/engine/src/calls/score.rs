//! Trying weights on examples: the weights loaded as asked (a checkpoint, with an adapter merged,
//! or a built `.cact` read back), each prompt answered by greedy decoding, its calls parsed, and
//! exact-call accuracy over the examples.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use candle_core::Device;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::breakdown::{Breakdown, Verdict};
use super::parse::{parse_calls, tool_names};
use super::reliability::{Reliability, Scored};
use crate::cact::synthetic::placeholder_tokenizer_blob;
use crate::cact::{
    build_cact, load_checked, merge_adapter, BitsChoice, BuildError, CactFile, ExportError, ReadError, WeightsError,
};
use crate::checkpoint::Checkpoint;
use crate::checks::confidence::decode_probability;
use crate::checks::{CheckedAnswer, Turn};
use crate::confidence::{HeadFileError, TurnHead};
use crate::dataset::{render, Example};
use crate::lora::{merge_adapter_file, LoadError, MergeInto};
use crate::model::packing::{shared_prefixes, MIN_SHARED};
use crate::model::{Batch, Completion, Forward, ModelError, Network, Params, Prefilled, Until};
use crate::tokenizer::{Tokenizer, TokenizerError, BOS_ID};
use crate::w4a8::{NetworkCodes, W4a8Error};

/// New tokens allowed beyond the expected answer's length when scoring: room for a near miss to
/// close its call, never enough to run on.
pub const ANSWER_SLACK: usize = 16;

/// Prompts decoded together when many are answered: enough rows that a step's products read each
/// weight once for many tokens, few enough that their caches stay small.
pub const ANSWER_BATCH: usize = 16;

/// How the weights are run: as stored, or with the deployment's quantization simulated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precision {
    /// As stored, in float.
    Float,
    /// The weights a `.cact` ships (every kernel, embedding and mHC projection through CQ at W4),
    /// activations in float: how Needle 3's package scores a run.
    QuantizedWeights,
    /// As a `.cact` runs: those weights, and activations, queries, keys and values fake-quantized
    /// to the config's widths (8 bits) by the quantization-aware training's forward.
    Simulated,
    /// As the Needle engine runs a `.cact`: [`Precision::Simulated`], but the attention
    /// projections and the output head multiply the file's own CQ codes with 8-bit activations on
    /// the integer kernels ([`crate::w4a8`]), on the CPU whatever device was asked. A checkpoint
    /// is built into a `.cact` in memory first, as `needle build` builds it.
    W4a8,
}

/// Which weights to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Weights {
    /// A checkpoint, with an adapter (`.pkl` or `.safetensors`) merged when given.
    Checkpoint { checkpoint: PathBuf, lora: Option<PathBuf> },
    /// A built `.cact`, dequantized: what ships.
    Cact(PathBuf),
}

#[derive(Debug, thiserror::Error)]
pub enum WeightsLoadError {
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error(transparent)]
    Cact(#[from] ReadError),
    #[error("{}: {source}", path.display())]
    CactWeights { path: PathBuf, source: WeightsError },
    #[error("{}: {source}", path.display())]
    Tokenizer { path: PathBuf, source: TokenizerError },
    #[error("{}: {source}", path.display())]
    Model { path: PathBuf, source: ModelError },
    #[error("{}: {source}", path.display())]
    W4a8 { path: PathBuf, source: W4a8Error },
    /// Building a checkpoint into a `.cact` for [`Precision::W4a8`].
    #[error(transparent)]
    Build(#[from] BuildError),
    #[error(transparent)]
    Export(#[from] ExportError),
    /// The confidence head a `.cact` carries.
    #[error(transparent)]
    Head(#[from] HeadFileError),
}

/// A network ready to answer, with the tokenizer and the confidence head a `.cact` carries (a
/// checkpoint has no tokenizer, and an adapter keeps its trained head beside it:
/// [`TurnHead::beside`]).
pub struct Loaded {
    pub network: Network,
    pub tokenizer: Option<Tokenizer>,
    pub head: Option<TurnHead>,
}

impl Weights {
    /// The file the weights come from, for messages.
    pub fn path(&self) -> &Path {
        match self {
            Weights::Checkpoint { checkpoint, .. } => checkpoint,
            Weights::Cact(path) => path,
        }
    }

    pub fn load(&self, device: &Device) -> Result<Loaded, WeightsLoadError> {
        self.load_as(device, Precision::Float)
    }

    /// The weights run at `precision`; a `.cact`'s weights are already through CQ, so only
    /// [`Precision::Simulated`] changes how it runs.
    pub fn load_as(&self, device: &Device, precision: Precision) -> Result<Loaded, WeightsLoadError> {
        match self {
            Weights::Checkpoint { checkpoint, lora } if precision == Precision::W4a8 => {
                let cact = built_in_memory(checkpoint, lora.as_deref())?;
                let network = cact_network(&cact, checkpoint, device, precision)?;
                Ok(Loaded { network, tokenizer: None, head: None })
            }
            Weights::Checkpoint { checkpoint, lora } => {
                let loaded = Checkpoint::load(checkpoint).map_err(LoadError::from)?;
                let mut params = Params::from_checkpoint(&loaded, device).map_err(model(checkpoint))?;
                if let Some(lora) = lora {
                    merge_adapter_file(lora, MergeInto::Params(&mut params))?;
                }
                let params = match precision {
                    Precision::Float => params,
                    Precision::QuantizedWeights => params.through_cq().map_err(model(checkpoint))?,
                    Precision::Simulated | Precision::W4a8 => params
                        .through_cq()
                        .and_then(|params| params.fake_quantizing(&loaded.config))
                        .map_err(model(checkpoint))?,
                };
                let network = Network::load(&loaded.config, &params).map_err(model(checkpoint))?;
                Ok(Loaded { network, tokenizer: None, head: None })
            }
            Weights::Cact(path) => {
                let cact = CactFile::open(path)?;
                let network = cact_network(&cact, path, device, precision)?;
                let tokenizer = match cact.tokenizer_index().and_then(|i| cact.blob(i)) {
                    Some(blob) => Some(
                        Tokenizer::from_cact_blob(blob)
                            .map_err(|source| WeightsLoadError::Tokenizer { path: path.clone(), source })?,
                    ),
                    None => None,
                };
                // Whatever the precision, the head reads the cells of the network that answers.
                let head = TurnHead::in_cact(&cact, path)?;
                Ok(Loaded { network, tokenizer, head })
            }
        }
    }
}

/// The network a `.cact` holds, run at `precision` (its weights are already through CQ, so only
/// [`Precision::Simulated`] and [`Precision::W4a8`] change how it runs); errors name `path`, where
/// it was read from.
pub(crate) fn cact_network(
    cact: &CactFile,
    path: &Path,
    device: &Device,
    precision: Precision,
) -> Result<Network, WeightsLoadError> {
    // The integer kernels are the CPU's.
    let device = if precision == Precision::W4a8 { &Device::Cpu } else { device };
    let params =
        cact.params(device).map_err(|source| WeightsLoadError::CactWeights { path: path.to_path_buf(), source })?;
    let config = cact.model_config();
    let params = match precision {
        Precision::Float | Precision::QuantizedWeights => params,
        Precision::Simulated | Precision::W4a8 => params.fake_quantizing(&config).map_err(model(path))?,
    };
    let network = Network::load(&config, &params).map_err(model(path))?;
    if precision != Precision::W4a8 {
        return Ok(network);
    }
    let codes =
        NetworkCodes::from_cact(cact).map_err(|source| WeightsLoadError::W4a8 { path: path.to_path_buf(), source })?;
    network.with_codes(codes).map_err(model(path))
}

/// The `.cact` `needle build` would write from `checkpoint` (with `lora` merged), held in memory:
/// the codes a checkpoint runs from at [`Precision::W4a8`]. Its tokenizer is a placeholder.
fn built_in_memory(checkpoint: &Path, lora: Option<&Path>) -> Result<CactFile, WeightsLoadError> {
    let mut ckpt = load_checked(checkpoint)?;
    if let Some(lora) = lora {
        merge_adapter(&mut ckpt, lora)?;
    }
    Ok(in_memory_cact(&ckpt, &placeholder_tokenizer_blob(ckpt.config.vocab_size))?.0)
}

/// `ckpt` built into a `.cact` as `needle build` builds it (`tokenizer_blob` its tokenizer:
/// the network never reads it), held in memory, and the size of its file.
pub(crate) fn in_memory_cact(ckpt: &Checkpoint, tokenizer_blob: &[u8]) -> Result<(CactFile, u64), WeightsLoadError> {
    let bits = BitsChoice::resolve(None, &ckpt.config)
        .map_err(|source| ExportError::Bits { checkpoint: ckpt.source.clone(), source })?;
    let built = build_cact(ckpt, &bits, tokenizer_blob)?;
    let bytes = built.bytes.len() as u64;
    let cact =
        CactFile::parse(built.bytes).map_err(|problem| ReadError::Format { path: ckpt.source.clone(), problem })?;
    Ok((cact, bytes))
}

/// The network of `ckpt` at [`Precision::W4a8`], from the `.cact` it builds into in memory.
pub(crate) fn w4a8_network(ckpt: &Checkpoint) -> Result<Network, WeightsLoadError> {
    let (cact, _) = in_memory_cact(ckpt, &placeholder_tokenizer_blob(ckpt.config.vocab_size))?;
    cact_network(&cact, &ckpt.source, &Device::Cpu, Precision::W4a8)
}

/// A model error as a load error that names the file the weights came from.
fn model(path: &Path) -> impl FnOnce(ModelError) -> WeightsLoadError + '_ {
    move |source| WeightsLoadError::Model { path: path.to_path_buf(), source }
}

/// A model's answer to one prompt.
#[derive(Debug, Clone, Serialize)]
pub struct Answer {
    /// The decoded new tokens: reasoning, then the tool-call block.
    pub text: String,
    /// The calls in the answer's `<tool_call>` block; `None` when there is no block holding a JSON
    /// list.
    pub calls: Option<Vec<Value>>,
    /// How sure the model is of the turn, in [0, 1]: what a confidence gate compares with.
    pub confidence: f64,
    /// Its decode probability ([`decode_probability`]).
    pub decode: f64,
    /// What a trained confidence head says of the turn; `None` for a model without one.
    pub head: Option<f64>,
    #[serde(flatten)]
    pub completion: Completion,
}

/// Greedy answer to an already rendered prompt (BOS is added, as in training), read by `head`
/// when the model has a trained one.
pub fn answer(
    network: &Network,
    head: Option<&TurnHead>,
    tokenizer: &Tokenizer,
    prompt: &str,
    max_new_tokens: usize,
) -> crate::model::Result<Answer> {
    let mut forward = Forward::new(network.clone())?;
    let ids = prompt_ids(tokenizer, prompt);
    let completion = forward.generate_from(None, &ids, max_new_tokens)?;
    let answer = answer_of(tokenizer, completion);
    match head {
        Some(head) => answer.read_by(head, &mut forward, &ids),
        None => Ok(answer),
    }
}

/// BOS and the tokens of a rendered prompt.
pub fn prompt_ids(tokenizer: &Tokenizer, prompt: &str) -> Vec<u32> {
    std::iter::once(BOS_ID).chain(tokenizer.encode(prompt)).collect()
}

/// A completion read as an answer: its text, its calls and its decode probability.
fn answer_of(tokenizer: &Tokenizer, completion: Completion) -> Answer {
    let text = tokenizer.decode(&completion.ids);
    let calls = parse_calls(&text);
    let decode = decode_probability(tokenizer, &completion, calls.as_ref().is_some_and(|calls| !calls.is_empty()));
    Answer { calls, confidence: decode, decode, head: None, text, completion }
}

impl Answer {
    /// The answer as a trained head reads it (`forward` computing the cells of `prompt`, BOS
    /// first, and of the answer where the head reads it): `head` is the head's calibrated
    /// probability, and the turn's confidence the smaller of it and the decode probability.
    fn read_by(self, head: &TurnHead, forward: &mut Forward, prompt: &[u32]) -> crate::model::Result<Self> {
        let read = head.confidence(forward, prompt, &self.completion.ids)?;
        Ok(Self { confidence: read.min(self.decode), head: Some(read), ..self })
    }
}

/// The base and the tuned model on the same held-out examples.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CallScores {
    pub base: ModelScore,
    pub tuned: ModelScore,
}

/// The tuned model three ways on the same examples, so that a gap has a cause: as trained (float),
/// with the deployment's quantization simulated ([`Precision::Simulated`]: what quantizing costs),
/// and its built `.cact` read back and run the same way, 8-bit activations and all (what the file
/// adds to that).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QuantRows {
    pub float: ModelScore,
    pub simulated: ModelScore,
    pub cact: ModelScore,
}

/// One model on a set of examples: the answer loss (as `needle eval`) and the calls it makes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ModelScore {
    #[serde(deserialize_with = "crate::train::events::number::f64")]
    pub loss: f64,
    pub calls: Accuracy,
    /// The examples it answered wrong, what was expected beside what it gave (for the app's
    /// Evaluate step; runs recorded before it was kept have none).
    #[serde(default)]
    pub wrong: Vec<Answered>,
}

/// Exact-call accuracy over a set of examples: the calls acted on (those that pass the schema and
/// grounding checks, [`CheckedAnswer`]) against the expected ones.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Accuracy {
    pub examples: usize,
    /// Answers whose calls equal the expected ones, as JSON values in the order written.
    pub exact: usize,
    /// Answers with a parseable `<tool_call>` list.
    pub parsed: usize,
    #[serde(deserialize_with = "crate::train::events::number::f64")]
    pub exact_rate: f64,
    #[serde(deserialize_with = "crate::train::events::number::f64")]
    pub parse_rate: f64,
    /// Per expected tool name (`(no call)` for examples whose answer is no call): right / total.
    pub per_tool: BTreeMap<String, ToolScore>,
    /// New tokens per second over all the answers.
    #[serde(deserialize_with = "crate::train::events::number::f64")]
    pub tokens_per_s: f64,
    /// New tokens per second of decoding alone, each prompt's forward pass left out: the speed
    /// an answer streams at (scores recorded before it was kept have 0).
    #[serde(default, deserialize_with = "crate::train::events::number::f64")]
    pub decode_tokens_per_s: f64,
    /// Why the answers are wrong (scores recorded before it was kept have an empty one).
    #[serde(default)]
    pub breakdown: Breakdown,
    /// How far the answers' confidence tells right from wrong; `None` for no answers (and in
    /// scores recorded before it was kept).
    #[serde(default)]
    pub confidence: Option<Reliability>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolScore {
    pub right: usize,
    pub total: usize,
}

/// Answers every example and scores the calls (each answer read by `head` when the model has a
/// trained one); `progress(done, total)` after each. Stops early when `cancel` is set: the score
/// then covers the examples answered so far. Examples whose prompts begin alike (an app's tools
/// prompt) are answered together, that prefix run once for them.
pub fn accuracy(
    network: &Network,
    head: Option<&TurnHead>,
    tokenizer: &Tokenizer,
    examples: &[Example],
    cancel: &AtomicBool,
    mut progress: impl FnMut(usize, usize),
    mut answered: impl FnMut(Answered),
) -> crate::model::Result<Accuracy> {
    let mut score = Accuracy::default();
    let (mut tokens, mut seconds) = (0usize, 0f64);
    // The steps after each prompt's pass: one per new token but the first.
    let (mut steps, mut step_seconds) = (0usize, 0f64);
    let prompts: Vec<(Vec<u32>, usize)> = examples
        .iter()
        .map(|example| {
            let (prompt, target) = render(example);
            (prompt_ids(tokenizer, &prompt), tokenizer.encode(&target).len() + ANSWER_SLACK)
        })
        .collect();
    let mut scored = Vec::with_capacity(examples.len());
    let mut done = 0;
    let shared_seconds = answer_each(network, head, tokenizer, &prompts, cancel, |index, answer| {
        let example = &examples[index];
        score.examples += 1;
        tokens += answer.completion.ids.len();
        seconds += answer.completion.prefill_seconds + answer.completion.decode_seconds;
        steps += answer.completion.ids.len().saturating_sub(1);
        step_seconds += answer.completion.decode_seconds;
        let expected: Option<Vec<Value>> = serde_json::from_str(&example.answers).ok();
        // Tools that do not read as a list offer nothing: the doctor names such rows.
        let tools: Vec<Value> = serde_json::from_str(&example.tools).unwrap_or_default();
        let turn = Turn { tools: &tools, query: &example.query, system: &example.system };
        let checked = CheckedAnswer::check(answer.calls.as_deref(), answer.confidence, turn, 0.0);
        let verdict = Verdict::of_checked(expected.as_deref(), answer.calls.as_deref(), &checked);
        let right = verdict == Verdict::Exact;
        score.parsed += usize::from(answer.calls.is_some());
        score.exact += usize::from(right);
        scored.push(Scored { exact: right, confidence: answer.confidence });
        let tools = tool_names(expected.as_deref());
        for tool in &tools {
            let entry = score.per_tool.entry(tool.clone()).or_default();
            entry.total += 1;
            entry.right += usize::from(right);
        }
        score.breakdown.add(&tools, expected.as_deref(), answer.calls.as_deref(), &verdict);
        answered(Answered {
            line: example.line,
            query: example.query.clone(),
            expected,
            given: answer.calls,
            text: answer.text,
            exact: right,
            verdict: Some(verdict),
            confidence: Some(answer.confidence),
            decode: Some(answer.decode),
            head: answer.head,
        });
        done += 1;
        progress(done, examples.len());
    })?;
    seconds += shared_seconds;
    let share = |n: usize| if score.examples == 0 { 0.0 } else { n as f64 / score.examples as f64 };
    score.exact_rate = share(score.exact);
    score.parse_rate = share(score.parsed);
    score.tokens_per_s = tokens as f64 / seconds.max(1e-9);
    score.decode_tokens_per_s = steps as f64 / step_seconds.max(1e-9);
    score.confidence = Reliability::of(&scored);
    Ok(score)
}

/// Answers every prompt (BOS and its tokens, with the most new tokens it may have), handing each
/// answer, read by `head` when the model has a trained one, to `each` with the prompt's index;
/// stops early when `cancel` is set. Up to
/// [`ANSWER_BATCH`] prompts are decoded together ([`Batch`]), each answer the one it gets alone,
/// handed on in the order they were started (a short answer waits for the longer ones started
/// before it). Prompts that begin alike (an app's tools prompt) are started one after another,
/// that prefix run once for them; the seconds those shared runs took are returned.
pub fn answer_each(
    network: &Network,
    head: Option<&TurnHead>,
    tokenizer: &Tokenizer,
    prompts: &[(Vec<u32>, usize)],
    cancel: &AtomicBool,
    mut each: impl FnMut(usize, Answer),
) -> crate::model::Result<f64> {
    let ids: Vec<&[u32]> = prompts.iter().map(|(ids, _)| ids.as_slice()).collect();
    let shares = shared_prefixes(&ids, MIN_SHARED);
    let mut order: Vec<(usize, Option<usize>)> =
        shares.iter().enumerate().flat_map(|(s, share)| share.rows.iter().map(move |&i| (i, Some(s)))).collect();
    let mut shared = vec![false; prompts.len()];
    order.iter().for_each(|&(i, _)| shared[i] = true);
    order.extend((0..prompts.len()).filter(|&i| !shared[i]).map(|i| (i, None)));
    let mut forward = Forward::new(network.clone())?;
    let mut batch = Batch::new(ANSWER_BATCH);
    let mut rank = vec![0; prompts.len()];
    order.iter().enumerate().for_each(|(r, &(i, _))| rank[i] = r);
    // Finished answers by their rank in `order`, until those started before them are handed on.
    let (mut waiting, mut next_rank) = (BTreeMap::new(), 0);
    // The head reads each answer with a network of its own: the batch's holds the rows' caches.
    let mut reader = head.map(|head| Forward::new(network.clone()).map(|forward| (head, forward))).transpose()?;
    let mut answered = |(index, completion): (usize, Completion)| -> crate::model::Result<()> {
        let mut answer = answer_of(tokenizer, completion);
        if let Some((head, forward)) = reader.as_mut() {
            answer = answer.read_by(head, forward, &prompts[index].0)?;
        }
        waiting.insert(rank[index], (index, answer));
        while let Some((index, answer)) = waiting.remove(&next_rank) {
            each(index, answer);
            next_rank += 1;
        }
        Ok(())
    };
    // A prefix is needed only while its rows start: each row takes a copy of its keys.
    let mut current: Option<(usize, Prefilled)> = None;
    let mut seconds = 0.0;
    for (index, share) in order {
        if cancel.load(Ordering::Relaxed) {
            return Ok(seconds);
        }
        let prefilled = match share {
            Some(s) => {
                if current.as_ref().is_none_or(|(at, _)| *at != s) {
                    let started = std::time::Instant::now();
                    current = Some((s, forward.prefill(&ids[index][..shares[s].len])?));
                    seconds += started.elapsed().as_secs_f64();
                }
                current.as_ref().map(|(_, prefilled)| prefilled)
            }
            None => None,
        };
        let (prompt, budget) = &prompts[index];
        if let Some(done) = batch.start(&mut forward, index, prompt, prefilled, *budget, Until::End)? {
            answered(done)?;
        }
        while !batch.has_room() && !cancel.load(Ordering::Relaxed) {
            batch.step(&mut forward)?.into_iter().try_for_each(&mut answered)?;
        }
    }
    while !batch.is_empty() && !cancel.load(Ordering::Relaxed) {
        batch.step(&mut forward)?.into_iter().try_for_each(&mut answered)?;
    }
    Ok(seconds)
}

/// One example as the model answered it, beside what was expected (`needle eval --answers`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Answered {
    /// The example's line in its file.
    pub line: usize,
    pub query: String,
    /// The expected calls; `None` when the file's answer is not a JSON list.
    pub expected: Option<Vec<Value>>,
    /// The calls the model wrote, withheld ones too; `None` when its answer holds no call list
    /// that parses.
    pub given: Option<Vec<Value>>,
    /// The model's whole answer, reasoning included.
    pub text: String,
    /// Whether the verdict is [`Verdict::Exact`] (what answers recorded before verdicts say;
    /// `right` in those recorded before it was named so).
    #[serde(alias = "right")]
    pub exact: bool,
    /// What kind of answer it is, and what differs; `None` in answers recorded before it was kept.
    #[serde(default)]
    pub verdict: Option<Verdict>,
    /// The turn's confidence ([`Answer::confidence`]); `None` in answers recorded before it was kept.
    #[serde(default, deserialize_with = "crate::train::events::number::optional_f64")]
    pub confidence: Option<f64>,
    /// Its decode probability; `None` in answers recorded before it was kept.
    #[serde(default, deserialize_with = "crate::train::events::number::optional_f64")]
    pub decode: Option<f64>,
    /// What the model's confidence head said; `None` for a model without a trained one.
    #[serde(default, deserialize_with = "crate::train::events::number::optional_f64")]
    pub head: Option<f64>,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::calls::parse::{NO_CALL, UNREADABLE};

    #[test]
    fn calls_are_the_json_list_inside_the_tool_call_block() {
        let text = "<think>x</think>\n<tool_call>[{\"name\":\"a\",\"arguments\":{\"n\":1}}]</tool_call><|im_end|>";
        assert_eq!(parse_calls(text), Some(vec![json!({"name": "a", "arguments": {"n": 1}})]));
        assert_eq!(parse_calls("<think></think>\n<tool_call>[]</tool_call>"), Some(vec![]));
        assert_eq!(parse_calls("<think></think>\n<tool_call>[{\"name\":"), None, "cut off");
        assert_eq!(parse_calls("<tool_call>{\"name\":\"a\"}</tool_call>"), None, "not a list");
        assert_eq!(parse_calls("no block at all"), None);
    }

    #[test]
    fn an_adapter_is_checked_against_the_checkpoint_before_anything_is_multiplied() {
        use std::collections::HashMap;

        use crate::lora::{FitProblem, MergeError};

        let checkpoint = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/models/tiny_f32.pkl"));
        let q_proj = "stack/layers/block/self_attn/q_proj/kernel";
        let dir = tempfile::tempdir().unwrap();
        // 800 KB whose product would be 40 GB, then a plain wrong shape ([3, 96, 96] needs B [3, 4, 96]).
        for (rank, a, b, wrong) in
            [(1, vec![100_000, 1], vec![1, 100_000], "A"), (4, vec![3, 96, 4], vec![3, 4, 64], "B")]
        {
            let lora = dir.path().join(format!("rank{rank}.safetensors"));
            let zeros = |shape: &Vec<usize>| vec![0u8; 4 * shape.iter().product::<usize>()];
            let buffers =
                [(format!("{q_proj}/A"), a.clone(), zeros(&a)), (format!("{q_proj}/B"), b.clone(), zeros(&b))];
            let metadata = HashMap::from(
                [("scale", "2"), ("rank", &rank.to_string()), ("base", "models/tiny_f32.pkl")]
                    .map(|(k, v)| (k.to_string(), v.to_string())),
            );
            let bytes = crate::lora::file::serialize_f32(&lora, &buffers, metadata).unwrap();
            std::fs::write(&lora, bytes).unwrap();
            let weights = Weights::Checkpoint { checkpoint: checkpoint.into(), lora: Some(lora.clone()) };
            match weights.load(&Device::Cpu) {
                Err(WeightsLoadError::Load(LoadError::Merge(MergeError::Fit(fit)))) => {
                    assert_eq!((&fit.adapter, &fit.tensor), (&lora, &format!("{q_proj}/{wrong}")));
                    assert!(matches!(fit.problem, FitProblem::Shape { .. }), "{fit}");
                }
                Err(other) => panic!("expected a fit error, got {other}"),
                Ok(_) => panic!("rank {rank}: a misfit adapter was merged"),
            }
        }
    }

    #[test]
    fn a_bfloat16_checkpoint_with_an_adapter_scores_as_the_reference_scores_it() {
        // 3.x's finetune widens the checkpoint to float32 and merges there, unlike its build; the
        // same merge serves both (see lora/merge.rs), given float32 weights here.
        use crate::fixtures::fixture;
        use crate::model::masked_loss;

        let golden =
            candle_core::safetensors::load(fixture("golden/needle3_bf16/eval.safetensors"), &Device::Cpu).unwrap();
        let ids = golden["ids"].to_dtype(candle_core::DType::U32).unwrap();
        let (checkpoint, adapter) =
            (fixture("models/needle3_bf16.safetensors"), fixture("golden/needle3_bf16/adapter.safetensors"));
        // Through CQ a last-bit difference now and then turns into a whole level: a looser bound.
        for (lora, shipped, key, tolerance) in [
            (None, false, "loss", 1e-5),
            (Some(&adapter), false, "loss_lora", 1e-5),
            (Some(&adapter), true, "loss_lora_w4", 1e-4),
        ] {
            let weights = Weights::Checkpoint { checkpoint: checkpoint.clone(), lora: lora.cloned() };
            let precision = if shipped { Precision::QuantizedWeights } else { Precision::Float };
            let loaded = weights.load_as(&Device::Cpu, precision);
            let logits = loaded.unwrap().network.forward(&ids).unwrap();
            let loss: f32 = masked_loss(&logits, &ids, &golden["mask"]).unwrap().to_scalar().unwrap();
            let want = golden[key].to_vec1::<f32>().unwrap()[0];
            assert!(((loss - want) / want).abs() <= tolerance, "{key}: {loss} vs the reference's {want}");
        }
    }

    #[test]
    fn a_simulated_needle2_model_computes_alike_on_both_paths() {
        // Needle 2 under the QAT forward, as `needle eval --quant-rows` runs it: the hand-written
        // path fake-quantizes where candle's does (seen: 1e-7 apart, where quantizing moves the
        // loss by 4e-3; a last-bit difference may turn into a whole 8-bit level, hence 1e-4).
        use crate::dataset::Encoded;
        use crate::fixtures::fixture;
        use crate::model::packing::Packing;

        let golden =
            candle_core::safetensors::load(fixture("golden/pretrained/forward.safetensors"), &Device::Cpu).unwrap();
        let (ids, mask) = (golden["ids"].to_vec2::<i32>().unwrap(), golden["mask"].to_vec2::<f32>().unwrap());
        let rows: Vec<Encoded> = (ids.iter().zip(mask))
            .map(|(ids, mask)| Encoded { ids: ids.iter().map(|&id| id as u32).collect(), mask, truncated: false })
            .collect();
        let packing = Packing::new(&rows, false).unwrap();
        let weights = Weights::Checkpoint { checkpoint: fixture("models/pretrained.pkl"), lora: None };
        let loss = |precision, autograd| {
            let network = weights.load_as(&Device::Cpu, precision).unwrap().network;
            let mut forward = Forward::with_autograd(network, autograd).unwrap();
            assert_eq!(forward.hand_written(), !autograd);
            let (sum, count) = forward.masked_ce_sum(std::slice::from_ref(&packing), None).unwrap();
            sum / count
        };
        let (cpu, candle, float) =
            (loss(Precision::Simulated, false), loss(Precision::Simulated, true), loss(Precision::Float, false));
        assert!(((cpu - candle) / candle).abs() <= 1e-4, "simulated: {cpu} on the CPU path, {candle} on candle's");
        assert!(((float - cpu) / cpu).abs() >= 1e-3, "quantizing moved the loss only from {float} to {cpu}");
    }

    #[test]
    fn every_expected_tool_counts_once_and_no_call_has_its_own_row() {
        let calls = [json!({"name": "b"}), json!({"name": "a"}), json!({"name": "b"})];
        assert_eq!(tool_names(Some(&calls)), ["a", "b"]);
        assert_eq!(tool_names(Some(&[])), [NO_CALL]);
        assert_eq!(tool_names(None), [UNREADABLE]);
    }
}
