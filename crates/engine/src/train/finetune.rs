//! A whole fine-tuning run, as the reference's `finetune_local` does it: validate the inputs,
//! hold out a seeded validation split, train epoch by epoch on reshuffled batches, report the
//! validation loss per epoch, and save the adapter and the resumable state after every epoch.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;

use super::confidence::{fit_head, HeadFit, HeadRun};
use super::error::{Result, TrainError};
use super::events::Event;
use super::memory::{activation_budget, StepShape};
use super::schedule::Schedule;
use super::state::{load_state, save_state, state_path, RunKey, SavedState};
use super::timing::Workload;
use super::trainer::Trainer;

/// Held-out examples scored by exact calls at the end of a run: enough for a fair share, few
/// enough that decoding them on a CPU takes seconds, not the length of the run.
pub const SCORED_EXAMPLES: usize = 64;

/// Training steps the plan times on the first batch; a step longer than [`WARM_STEP_LIMIT_S`] is
/// not repeated (what its first run pays for its buffers is then a small part of it).
const TIMED_STEPS: usize = 3;
const WARM_STEP_LIMIT_S: f64 = 10.0;
/// Decoding steps the plan times, after a prompt's prefill.
const DECODE_STEPS_TIMED: usize = 8;
use crate::backend::{system_memory, BackendInfo};
use crate::calls::{self, CallScores, ModelScore, Precision, Weights};
use crate::checkpoint::Checkpoint;
use crate::confidence::file::{companion_path, HeadFileError};
use crate::confidence::reader::TurnHead;
use crate::config::Recipe;
use crate::dataset::{Dataset, Encoded, Example, Tokenized};
use crate::lora::{save_adapter, AdapterMeta, LoadError, Lora};
use crate::model::packing::Packing;
use crate::model::{evaluate, CpuNetwork, Device, Forward, Network, Params};
use crate::settings::TrainSettings;
use crate::tokenizer::{Tokenizer, BOS_ID};

/// Everything `needle finetune` is asked to do.
#[derive(Debug, Clone)]
pub struct FinetuneOptions {
    pub data: PathBuf,
    pub checkpoint: PathBuf,
    pub tokenizer: PathBuf,
    pub settings: TrainSettings,
    /// The adapter file (`.pkl` or `.safetensors`).
    pub out: PathBuf,
    /// Continue from the state saved next to `out`.
    pub resume: bool,
    /// Fit a confidence head after training (`--confidence`).
    pub confidence: bool,
}

/// What a run will do, known before it starts (`--dry-run` prints it).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Plan {
    pub examples: usize,
    pub validation: usize,
    pub seq_len: usize,
    pub steps_per_epoch: usize,
    pub steps: usize,
    pub warmup: usize,
    pub adapted_weights: usize,
    pub trainable_parameters: usize,
    /// Predicted peak resident memory of the run (see [`super::memory`]).
    pub memory_estimate_bytes: u64,
    /// Whether steps recompute activations layer by layer to stay within that memory.
    pub recompute: bool,
    /// Rows per forward and backward pass at the longest rows (a batch with more is split, its
    /// gradients summed).
    pub micro_batch: usize,
    /// Packed tokens per pass (shared prefixes counted once).
    #[serde(default)]
    pub tokens_per_pass: usize,
    /// Memory the machine has free now, where the platform says.
    pub memory_available_bytes: Option<u64>,
    /// Predicted seconds for the whole run, from a timed step ([`Session::time_run`]); absent
    /// until timed.
    pub seconds_estimate: Option<f64>,
}

impl Plan {
    /// Whether the estimate exceeds the free memory: the run would likely be killed.
    pub fn may_not_fit(&self) -> bool {
        self.memory_available_bytes.is_some_and(|free| self.memory_estimate_bytes > free)
    }
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub adapter: PathBuf,
    pub partial: bool,
    /// `(last batch loss, validation loss)` per epoch completed in this invocation.
    pub epochs: Vec<(f32, Option<f32>)>,
    /// The confidence head fitted after training.
    pub confidence: HeadFit,
}

/// A validated run, ready to train.
pub struct Session {
    options: FinetuneOptions,
    /// The base weights as loaded (the network's kernels are views of them): what a resumed
    /// adapter is checked against.
    params: Params,
    network: Network,
    lora: Lora,
    /// The examples as tokens; each batch's rows are cut from them when it trains, so a large
    /// dataset is held once, as token ids, and never as padded rows.
    train: Vec<Tokenized>,
    /// The training examples themselves, to fit the confidence head to the tuned model's answers.
    train_examples: Vec<Example>,
    val: Vec<Tokenized>,
    /// The held-out examples themselves, to score the calls of the base and tuned models.
    val_examples: Vec<Example>,
    pub plan: Plan,
    /// Seconds preparing took, and loading the checkpoint within it: a run spends them again
    /// (the tuned model's load at the end too).
    prepare_seconds: f64,
    load_seconds: f64,
}

impl Session {
    /// Checks every input and builds the plan; nothing is trained and nothing is written.
    pub fn prepare(options: FinetuneOptions, device: &Device) -> Result<Self> {
        let started = Instant::now();
        let s = options.settings;
        check_ranges(&s)?;
        check_writable(&options.out)?;
        let checkpoint = Checkpoint::load(&options.checkpoint).map_err(LoadError::from)?;
        let params = Params::from_checkpoint(&checkpoint, device)?.for_training(&checkpoint.config, s.qat)?;
        let cfg = checkpoint.config.clone();
        drop(checkpoint);
        let load_seconds = started.elapsed().as_secs_f64();
        let tokenizer = Tokenizer::load(&options.tokenizer)?;
        // Built once per run; building it checks the weights against the config before any training.
        let network = Network::load(&cfg, &params)?;
        network.check_tokenizer_vocab(tokenizer.vocab_size(), &options.tokenizer)?;
        let dataset = Dataset::load(&options.data, cfg.generation)?;
        // Positions past the model's own length were never trained, and rows that long would only
        // make attention's memory grow with the square of a cap nobody meant.
        let prepared = dataset.prepare(&tokenizer, s.max_len.min(cfg.max_seq_len))?;
        let seq_len = prepared.seq_len;
        let pairs: Vec<(Tokenized, Example)> = prepared.tokenized.into_iter().zip(dataset.examples).collect();
        let (train, validation) = split(pairs, s.val_split, s.seed);
        let (train, train_examples): (Vec<Tokenized>, Vec<Example>) = train.into_iter().unzip();
        let (val, val_examples): (Vec<Tokenized>, Vec<Example>) = validation.into_iter().unzip();
        // Rows whose answer begins past the sequence length teach nothing; when that is every row,
        // a run would "finish" having trained on nothing.
        if !train.is_empty() && train.iter().all(|t| t.scored_positions(seq_len) == 0) {
            return Err(TrainError::AnswersPastLength {
                data: options.data.clone(),
                seq_len,
                cap: s.max_len,
                max_seq_len: cfg.max_seq_len,
                shortest_prompt: train.iter().map(|t| 1 + t.prompt_ids.len()).min().unwrap_or(0),
            });
        }
        let lora = Lora::init(&params, s.rank, s.alpha, s.seed)?;
        if lora.factors.is_empty() {
            return Err(TrainError::NoTargets { checkpoint: options.checkpoint.clone() });
        }
        let steps_per_epoch = train.len().div_ceil(s.batch_size);
        let steps = steps_per_epoch * s.epochs;
        let most_scored = train.iter().chain(&val).map(|t| t.scored_positions(seq_len)).max();
        let memory = StepShape {
            config: &cfg,
            parameters: params.parameter_count(),
            trainable: lora.parameter_count(),
            batch: s.batch_size.min(train.len().max(val.len())),
            seq_len,
            scored: s.batch_size * most_scored.unwrap_or(0),
            rank: s.rank,
            hand_written: CpuNetwork::supports(&network),
            activation_budget: activation_budget(params.device()),
        }
        .plan();
        let plan = Plan {
            examples: train.len(),
            validation: val.len(),
            seq_len,
            steps_per_epoch,
            steps,
            warmup: Schedule::reference(s.lr, steps).warmup,
            adapted_weights: lora.factors.len(),
            trainable_parameters: lora.parameter_count(),
            memory_estimate_bytes: memory.peak_bytes,
            recompute: memory.recompute,
            micro_batch: memory.micro_batch,
            tokens_per_pass: memory.tokens_per_pass,
            memory_available_bytes: system_memory().map(|(_, available)| available),
            seconds_estimate: None,
        };
        let prepare_seconds = started.elapsed().as_secs_f64();
        Ok(Self {
            options,
            params,
            network,
            lora,
            train,
            train_examples,
            val,
            val_examples,
            plan,
            prepare_seconds,
            load_seconds,
        })
    }

    /// Times training steps on the first batch (with fresh factors, so nothing of the run changes;
    /// the first, which also pays for the buffers, left out) and a few decoding steps,
    /// then counts the whole run in the same units ([`super::timing`]): every batch of every epoch,
    /// the validation passes, and the end-of-run scoring of the held-out examples by the base and
    /// the tuned model, plus what preparing took (the run does it again). Fills
    /// [`Plan::seconds_estimate`].
    pub fn time_run(&mut self) -> Result<f64> {
        let s = self.options.settings;
        let cfg = self.network.config().clone();
        let seq_len = self.plan.seq_len;
        let lora = Lora::init(&self.params, s.rank, s.alpha, s.seed)?;
        let mut trainer = Trainer::new(self.network.clone(), lora, Schedule::reference(s.lr, 3))?;
        trainer.recompute = self.plan.recompute;
        trainer.tokens_per_pass = self.plan.tokens_per_pass;
        let first = rows(&self.train[..s.batch_size.min(self.train.len())], seq_len);
        let mut timed = Vec::new();
        for _ in 0..TIMED_STEPS {
            let started = Instant::now();
            trainer.step(&first)?;
            timed.push(started.elapsed().as_secs_f64());
            if timed[timed.len() - 1] > WARM_STEP_LIMIT_S {
                break;
            }
        }
        // The first step also pays for the buffers; the mean of the others, when there are some.
        let warm = if timed.len() > 1 { &timed[1..] } else { &timed[..] };
        let step_seconds = warm.iter().sum::<f64>() / warm.len() as f64;
        let work = |rows: &[Encoded]| -> Result<Workload> { Ok(Workload::of(&Packing::new(rows, true)?)) };
        let seconds_per_mac = step_seconds / work(&first)?.training(&cfg).max(1.0);

        let (mut training, mut validation) = (0.0, Workload::default());
        for epoch in 0..s.epochs {
            let order = epoch_order(self.train.len(), s.seed, epoch);
            for batch in order.chunks(s.batch_size) {
                let rows: Vec<Encoded> = batch.iter().map(|&i| self.train[i].row(seq_len)).collect();
                training += work(&rows)?.training(&cfg);
            }
            for batch in self.val.chunks(s.batch_size) {
                validation += work(&rows(batch, seq_len))?;
            }
        }
        let mut seconds = self.prepare_seconds + seconds_per_mac * (training + validation.forward(&cfg));

        // Scoring: each model's loss on the held-out rows and its answers (prompts that begin
        // alike prefilled once), for the base and the tuned model, which is loaded first.
        let scored = &self.val[..self.val.len().min(SCORED_EXAMPLES)];
        if let Some(example) = scored.first() {
            let mut forward = Forward::new(self.network.clone())?;
            let prompt: Vec<u32> = std::iter::once(BOS_ID).chain(example.prompt_ids.iter().copied()).collect();
            let generation = forward.generate_from(None, &prompt, DECODE_STEPS_TIMED + 1)?;
            let per_token = generation.decode_seconds / generation.ids.len().saturating_sub(1).max(1) as f64;
            let prompts: Vec<Encoded> = scored
                .iter()
                .map(|t| {
                    let ids: Vec<u32> = std::iter::once(BOS_ID).chain(t.prompt_ids.iter().copied()).collect();
                    Encoded { mask: vec![0.0; ids.len()], ids, truncated: false }
                })
                .collect();
            let prefills = work(&prompts)?.forward(&cfg);
            let losses: f64 =
                scored.chunks(s.batch_size).map(|b| Ok(work(&rows(b, seq_len))?.forward(&cfg))).sum::<Result<f64>>()?;
            let answers: usize = scored.iter().map(|t| t.target_ids.len() + calls::ANSWER_SLACK).sum();
            let per_model = seconds_per_mac * (prefills + losses) + per_token * answers as f64;
            seconds += 2.0 * per_model + self.load_seconds;
        }
        self.plan.seconds_estimate = Some(seconds);
        Ok(seconds)
    }

    /// Trains to the end or until `cancel` is set (checked between steps), emitting progress.
    pub fn run(self, backend: &BackendInfo, cancel: &AtomicBool, mut emit: impl FnMut(Event)) -> Result<Outcome> {
        let Session { options, params, network, lora, train, train_examples, val, val_examples, plan, .. } = self;
        let s = options.settings;
        let cfg_generation = network.config().generation;
        let schedule = Schedule::reference(s.lr, plan.steps);
        let key = RunKey {
            rank: s.rank,
            alpha: s.alpha,
            steps: plan.steps,
            seed: s.seed,
            base: options.checkpoint.display().to_string(),
        };
        let state = state_path(&options.out);
        let resumed = match options.resume {
            false => None,
            true if state.exists() => Some(load_state(&state, &params, &key)?),
            true => return Err(TrainError::NothingToResume { path: state }),
        };
        drop(params);
        let mut trainer = match resumed {
            None => Trainer::new(network, lora, schedule)?,
            Some(SavedState { lora, moments, count }) => {
                let mut trainer = Trainer::new(network, lora, schedule)?;
                trainer.optimizer.moments = moments;
                trainer.optimizer.count = count;
                trainer
            }
        };
        trainer.recompute = plan.recompute;
        trainer.tokens_per_pass = plan.tokens_per_pass;
        let first_step = trainer.optimizer.count;
        emit(Event::Started {
            backend: backend.backend.to_string(),
            device: backend.device.clone(),
            examples: plan.examples,
            validation: plan.validation,
            seq_len: plan.seq_len,
            steps: plan.steps,
            warmup: plan.warmup,
            memory_estimate_bytes: plan.memory_estimate_bytes,
            first_step,
        });
        let started = Instant::now();
        let mut positions = 0usize;
        let mut epochs = Vec::new();
        let save = |trainer: &Trainer, partial: bool, emit: &mut dyn FnMut(Event)| -> Result<()> {
            if let Some(factor) = trainer.lora.first_non_finite()? {
                return Err(TrainError::NonFiniteFactor { step: trainer.optimizer.count, factor });
            }
            let meta = AdapterMeta { base: key.base.clone(), partial, generation: cfg_generation, seed: s.seed };
            save_adapter(&options.out, &trainer.lora, &meta)?;
            remove_stale_head(&options.out)?;
            save_state(&state, &trainer.lora, &trainer.optimizer, &key)?;
            emit(Event::Saved { path: options.out.clone() });
            Ok(())
        };
        for epoch in first_step / plan.steps_per_epoch.max(1)..s.epochs {
            let order = epoch_order(train.len(), s.seed, epoch);
            let done_in_epoch = trainer.optimizer.count - epoch * plan.steps_per_epoch;
            let mut last = 0f32;
            for batch in order.chunks(s.batch_size).skip(done_in_epoch) {
                if cancel.load(Ordering::Relaxed) {
                    save(&trainer, true, &mut emit)?;
                    let seconds = started.elapsed().as_secs_f64();
                    emit(Event::Finished { adapter: options.out.clone(), seconds, partial: true, accuracy: None });
                    return Ok(Outcome { adapter: options.out, partial: true, epochs, confidence: HeadFit::NotAsked });
                }
                let rows: Vec<Encoded> = batch.iter().map(|&i| train[i].row(plan.seq_len)).collect();
                let outcome = trainer.step(&rows)?;
                let step = trainer.optimizer.count;
                finite_loss(step, "training", outcome.loss)?;
                positions += rows.iter().map(|r| r.ids.len()).sum::<usize>();
                last = outcome.loss;
                let elapsed = started.elapsed().as_secs_f64().max(f64::MIN_POSITIVE);
                let per_step = elapsed / (step - first_step) as f64;
                emit(Event::Step {
                    step,
                    total: plan.steps,
                    loss: outcome.loss,
                    lr: outcome.lr,
                    tokens_per_s: positions as f64 / elapsed,
                    eta_s: per_step * (plan.steps - step) as f64,
                });
            }
            let val = validation_loss(&mut trainer, &val, plan.seq_len, s.batch_size)?;
            if let Some(loss) = val {
                finite_loss(trainer.optimizer.count, "validation", loss)?;
            }
            emit(Event::Epoch { epoch: epoch + 1, loss: last, val });
            epochs.push((last, val));
            save(&trainer, false, &mut emit)?;
        }
        // Training's buffers are not needed any more; the base network is, to score it.
        let base = trainer.network().clone();
        drop(trainer);
        // The adapter is saved: a head that cannot be fitted leaves it as it is.
        let device = base.device().clone();
        let run = HeadRun {
            checkpoint: &options.checkpoint,
            tokenizer: &options.tokenizer,
            adapter: &options.out,
            seed: s.seed,
        };
        let confidence = match options.confidence {
            false => HeadFit::NotAsked,
            true => fit_head(run, &train_examples, &device, cancel)
                .unwrap_or_else(|error| HeadFit::Failed { message: error.to_string() }),
        };
        if let Some(event) = head_event(&confidence) {
            emit(event);
        }
        let seconds = started.elapsed().as_secs_f64();
        let scored = &val_examples[..val_examples.len().min(SCORED_EXAMPLES)];
        // The adapter is saved: scoring it is a bonus, never a reason to call the run failed.
        let accuracy = if scored.is_empty() {
            None
        } else {
            emit(Event::Scoring { examples: scored.len() });
            let held_out = &val[..scored.len()];
            let head_fitted = matches!(confidence, HeadFit::Fitted(_));
            match score_calls(&options, &base, head_fitted, scored, held_out, plan.seq_len, cancel) {
                Ok(scores) => scores,
                Err(error) => {
                    emit(Event::Unscored { message: error.to_string() });
                    None
                }
            }
        };
        emit(Event::Finished { adapter: options.out.clone(), seconds, partial: false, accuracy });
        Ok(Outcome { adapter: options.out, partial: false, epochs, confidence })
    }
}

/// What a run says of its confidence head: fitted, or why not (nothing when none was asked for).
fn head_event(fit: &HeadFit) -> Option<Event> {
    match fit {
        HeadFit::Fitted(head) => Some(Event::HeadFitted {
            path: head.path.clone(),
            rows: head.rows,
            right: head.right,
            auroc: head.auroc,
            from_base: head.from_base,
            seconds: head.seconds,
        }),
        other => other.missing().map(|message| Event::NoHead { message }),
    }
}

/// A loss that is a number: a NaN or an infinity means the weights diverged, and every step after
/// would train on nothing but NaNs.
fn finite_loss(step: usize, which: &'static str, loss: f32) -> Result<()> {
    match loss.is_finite() {
        true => Ok(()),
        false => Err(TrainError::NonFiniteLoss { step, which, loss }),
    }
}

/// The reference's per-epoch validation number: the mean of per-batch mean losses.
fn validation_loss(trainer: &mut Trainer, val: &[Tokenized], seq_len: usize, batch_size: usize) -> Result<Option<f32>> {
    if val.is_empty() {
        return Ok(None);
    }
    let mut losses = Vec::new();
    for batch in val.chunks(batch_size) {
        losses.push(trainer.loss(&rows(batch, seq_len))?);
    }
    Ok(Some(losses.iter().sum::<f32>() / losses.len() as f32))
}

/// A head beside the adapter just saved was fitted to other weights: it goes, so that nothing reads
/// it as this adapter's (the run's own head is fitted after its last save).
fn remove_stale_head(adapter: &Path) -> Result<()> {
    let path = companion_path(adapter);
    match std::fs::remove_file(&path) {
        Err(source) if source.kind() != std::io::ErrorKind::NotFound => Err(HeadFileError::Io { path, source }.into()),
        _ => Ok(()),
    }
}

/// Answer loss and exact-call accuracy of the base (`base`, the run's frozen network) and of the
/// tuned model (the saved adapter merged into the checkpoint, its answers read by the confidence
/// head when the run fitted one: `head_fitted`) on held-out examples and their rows; `None` when
/// `cancel` is set before both are scored.
fn score_calls(
    options: &FinetuneOptions,
    base: &Network,
    head_fitted: bool,
    examples: &[Example],
    tokenized: &[Tokenized],
    seq_len: usize,
    cancel: &AtomicBool,
) -> Result<Option<CallScores>> {
    let tokenizer = Tokenizer::load(&options.tokenizer)?;
    let weights = Weights::Checkpoint { checkpoint: options.checkpoint.clone(), lora: Some(options.out.clone()) };
    // 3.x's package scores the weights a `.cact` ships (W4), as the archive will run them.
    let (base, tuned) = if Recipe::of(base.config().generation).scores_shipped_weights {
        let base_weights = Weights::Checkpoint { checkpoint: options.checkpoint.clone(), lora: None };
        let shipped = |weights: &Weights| weights.load_as(base.device(), Precision::QuantizedWeights);
        (shipped(&base_weights)?.network, shipped(&weights)?.network)
    } else {
        (base.clone(), weights.load(base.device())?.network)
    };
    let head = match head_fitted {
        true => TurnHead::beside(&options.out, tuned.config())?,
        false => None,
    };
    let score = |network: &Network, head: Option<&TurnHead>| -> Result<ModelScore> {
        let rows = tokenized.iter().map(|t| t.row(seq_len));
        let loss = evaluate(network, rows, seq_len, options.settings.batch_size, |_, _| {})?.loss;
        let mut wrong = Vec::new();
        let calls = calls::accuracy(
            network,
            head,
            &tokenizer,
            examples,
            cancel,
            |_, _| {},
            |answered| {
                if !answered.exact {
                    wrong.push(answered)
                }
            },
        )?;
        Ok(ModelScore { loss, calls, wrong })
    };
    let scores = CallScores { base: score(&base, None)?, tuned: score(&tuned, head.as_ref())? };
    Ok((!cancel.load(Ordering::Relaxed)).then_some(scores))
}

/// The training rows of `examples` in a run of sequence length `seq_len`.
fn rows(examples: &[Tokenized], seq_len: usize) -> Vec<Encoded> {
    examples.iter().map(|t| t.row(seq_len)).collect()
}

/// `(train, validation)`: `min(int(n·split), n − 1)` items held out after a seeded shuffle.
pub fn split<T>(rows: Vec<T>, val_split: f64, seed: u64) -> (Vec<T>, Vec<T>) {
    let n = rows.len();
    let n_val = ((n as f64 * val_split) as usize).min(n.saturating_sub(1));
    if n_val == 0 {
        return (rows, Vec::new());
    }
    let mut order: Vec<usize> = (0..n).collect();
    order.shuffle(&mut StdRng::seed_from_u64(seed));
    let mut slots: Vec<Option<T>> = rows.into_iter().map(Some).collect();
    let mut take = |i: &usize| slots[*i].take();
    let val = order[..n_val].iter().filter_map(&mut take).collect();
    let train = order[n_val..].iter().filter_map(&mut take).collect();
    (train, val)
}

/// The batch order of `epoch`: a fresh shuffle per epoch, derived from the seed so that a resumed
/// run replays the same order.
fn epoch_order(count: usize, seed: u64, epoch: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..count).collect();
    let epoch_seed = seed.wrapping_add(1).wrapping_mul(0x9e37_79b9_7f4a_7c15).wrapping_add(epoch as u64);
    order.shuffle(&mut StdRng::seed_from_u64(epoch_seed));
    order
}

fn check_ranges(settings: &TrainSettings) -> Result<()> {
    match settings.out_of_range().into_iter().next() {
        Some(problem) => Err(problem.into()),
        None => Ok(()),
    }
}

/// Creates the adapter's directory and proves it writable with a throwaway file.
fn check_writable(out: &Path) -> Result<()> {
    let dir = match out.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let error = |source| TrainError::OutputDir { dir: dir.clone(), source };
    std::fs::create_dir_all(&dir).map_err(error)?;
    tempfile::NamedTempFile::new_in(&dir).map_err(error)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(n: usize) -> Vec<Encoded> {
        (0..n).map(|i| Encoded { ids: vec![i as u32], mask: vec![1.0], truncated: false }).collect()
    }

    #[test]
    fn the_split_holds_out_a_seeded_fraction_but_never_everything() {
        let (train, val) = split(rows(10), 0.25, 0);
        assert_eq!((train.len(), val.len()), (8, 2));
        let (again, _) = split(rows(10), 0.25, 0);
        assert_eq!(train, again);
        let (_, other) = split(rows(10), 0.25, 1);
        assert_ne!(val, other);
        assert_eq!(split(rows(1), 0.9, 0).1.len(), 0);
        assert_eq!(split(rows(3), 0.99, 0).0.len(), 1);
    }

    use crate::fixtures::fixture;

    fn options(out: &Path, resume: bool) -> FinetuneOptions {
        FinetuneOptions {
            data: fixture("data/tool_calls.jsonl"),
            checkpoint: fixture("models/tiny_f32.pkl"),
            tokenizer: fixture("models/tokenizer.model"),
            settings: TrainSettings {
                epochs: 1,
                batch_size: 32,
                lr: 1e-3,
                rank: 4,
                alpha: 8.0,
                max_len: 128,
                val_split: 0.1,
                seed: 0,
                qat: false,
            },
            out: out.into(),
            resume,
            confidence: false,
        }
    }

    #[test]
    fn a_cancelled_run_saves_a_partial_adapter_and_resume_finishes_it() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("adapter.safetensors");
        let device = Device::Cpu;
        let backend =
            crate::backend::select(crate::backend::DeviceRequest::Only(crate::backend::Backend::Cpu)).unwrap().info;
        let cancel = AtomicBool::new(false);
        let first = Session::prepare(options(&out, false), &device).unwrap();
        // Cancel as soon as the first step is reported: the run must stop at the next boundary.
        let outcome = first
            .run(&backend, &cancel, |event| {
                if matches!(event, Event::Step { .. }) {
                    cancel.store(true, Ordering::Relaxed);
                }
            })
            .unwrap();
        assert!(outcome.partial && outcome.epochs.is_empty());
        let saved = crate::lora::load_adapter(&out).unwrap();
        assert_eq!(saved.lora.len(), 5, "q, k, v, gate and out projections");

        let resumed = Session::prepare(options(&out, true), &device).unwrap();
        let mut first_step = None;
        let mut steps = Vec::new();
        let outcome = resumed
            .run(&backend, &AtomicBool::new(false), |event| match event {
                Event::Started { first_step: f, .. } => first_step = Some(f),
                Event::Step { step, .. } => steps.push(step),
                _ => {}
            })
            .unwrap();
        assert_eq!(first_step, Some(1));
        assert_eq!(steps, [2, 3]);
        assert!(!outcome.partial && outcome.epochs.len() == 1);
    }

    #[test]
    fn a_needle3_run_trains_quantization_aware_scores_at_w4_and_saves_its_packages_adapter() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("adapter.safetensors");
        let options =
            FinetuneOptions { checkpoint: fixture("models/needle3_tiny.safetensors"), ..options(&out, false) };
        let backend =
            crate::backend::select(crate::backend::DeviceRequest::Only(crate::backend::Backend::Cpu)).unwrap().info;
        let session = Session::prepare(options, &Device::Cpu).unwrap();
        let mut scores = None;
        let outcome = session
            .run(&backend, &AtomicBool::new(false), |event| {
                if let Event::Finished { accuracy, .. } = event {
                    scores = accuracy;
                }
            })
            .unwrap();
        assert!(!outcome.partial && outcome.epochs.len() == 1);
        let (loss, val) = outcome.epochs[0];
        assert!(loss.is_finite() && val.is_some_and(f32::is_finite));
        assert!(scores.is_some(), "the held-out calls are scored");
        // The file is laid out as 3.x's `write_adapter` lays it out, and reads back.
        let bytes = crate::lora::file::read_file(&out).unwrap();
        let (tensors, metadata) = crate::lora::file::parse_safetensors(&out, &bytes).unwrap();
        let names = tensors.names().into_iter().cloned().collect::<Vec<_>>();
        assert!(names.iter().all(|n| n.starts_with("lora/stack/layers/block/self_attn/")), "{names:?}");
        assert_eq!(
            (metadata["scale"].as_str(), metadata["rank"].as_str(), metadata["seed"].as_str()),
            ("2.0", "4", "0")
        );
        let saved = crate::lora::load_adapter(&out).unwrap();
        assert_eq!(saved.lora.len(), 5);
        assert!(saved.base.ends_with("needle3_tiny.safetensors"), "{}", saved.base);
    }

    #[test]
    fn a_run_whose_loss_is_not_a_number_stops_at_that_step_and_saves_nothing() {
        // needle3_tiny with its final norm's scale at f32::MAX: finite weights whose hidden state and
        // logits overflow (1e38 is not enough: the CPU path's logits stay finite, if huge, and it is the
        // updates that overflow, two steps later).
        let dir = tempfile::tempdir().unwrap();
        let bytes = std::fs::read(fixture("models/needle3_tiny.safetensors")).unwrap();
        let (tensors, metadata) = crate::checkpoint::safetensors_file::parse(&bytes).unwrap();
        let huge: Vec<u8> = std::iter::repeat_n(f32::MAX.to_le_bytes(), 48).flatten().collect();
        let views = tensors.tensors().into_iter().map(|(name, view)| {
            let data = if name == "stack/final_norm/scale" { huge.as_slice() } else { view.data() };
            (name, safetensors::tensor::TensorView::new(view.dtype(), view.shape().to_vec(), data).unwrap())
        });
        let checkpoint = dir.path().join("overflowing.safetensors");
        safetensors::serialize_to_file(views, &Some(metadata), &checkpoint).unwrap();
        let out = dir.path().join("adapter.safetensors");
        let backend =
            crate::backend::select(crate::backend::DeviceRequest::Only(crate::backend::Backend::Cpu)).unwrap().info;
        let session = Session::prepare(FinetuneOptions { checkpoint, ..options(&out, false) }, &Device::Cpu).unwrap();
        let mut finished = false;
        let error = session
            .run(&backend, &AtomicBool::new(false), |event| finished |= matches!(event, Event::Finished { .. }))
            .unwrap_err();
        assert!(matches!(error, TrainError::NonFiniteLoss { step: 1, which: "training", .. }), "{error}");
        assert!(error.to_string().starts_with("step 1: the training loss is "), "{error}");
        assert!(error.to_string().ends_with("the checkpoint is damaged: use another"), "{error}");
        assert!(!finished && !out.exists(), "no adapter, and no `finished`");
    }

    #[test]
    fn each_epoch_has_its_own_reproducible_order() {
        assert_eq!(epoch_order(20, 3, 1), epoch_order(20, 3, 1));
        assert_ne!(epoch_order(20, 3, 1), epoch_order(20, 3, 2));
    }
}
