//! `needle finetune`: LoRA fine-tuning with the reference's recipe, flags and defaults.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::events::{cancel_on_stdin, print_json, EventFormat};
use crate::generate::{Job, Llm};
use crate::inputs::ModelInputs;
use crate::progress;
use anyhow::{Context, Result};
use indicatif::ProgressBar;
use needle_engine::backend::{self, DeviceRequest};
use needle_engine::hub::BaseModel;
use needle_engine::settings::{preset, presets, Field, FieldKind, TrainSettings};
use needle_engine::train::state::state_path;
use needle_engine::train::{Event, FinetuneOptions, Plan, Session};

/// `--checkpoint-dir` when none is given.
pub const CHECKPOINT_DIR: &str = "checkpoints";

/// Fine-tune LoRA adapters on a JSONL dataset (the reference's `finetune_local`).
#[derive(Debug, clap::Args, serde::Serialize)]
pub struct Args {
    #[command(flatten)]
    pub inputs: ModelInputs,
    #[command(flatten)]
    pub settings: Settings,
    /// Directory of the default adapter path
    #[arg(long, default_value = CHECKPOINT_DIR)]
    pub checkpoint_dir: PathBuf,
    /// Adapter file; `.pkl` (reference format) or `.safetensors` [default: CHECKPOINT_DIR/needle_lora.pkl,
    /// or needle_lora-N.pkl when that holds an earlier run's adapter]
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// auto, cpu, cuda or metal [default: NEEDLE_DEVICE, else auto]
    #[arg(long)]
    pub device: Option<String>,
    /// Print progress as one JSON event per line on stdout instead of a progress bar; a line
    /// `cancel` on stdin then stops the run like Ctrl-C
    #[arg(long, value_enum)]
    pub events: Option<EventFormat>,
    /// Continue from the state saved next to the adapter (without --out: the newest default one)
    #[arg(long)]
    pub resume: bool,
    /// Print the plan (examples, seq_len, steps, estimated peak memory) and exit
    #[arg(long)]
    pub dry_run: bool,
    /// Fit a confidence head to the tuned model after training, kept beside the adapter
    /// (ADAPTER.head.safetensors), which eval, run, suite and build then read. Off by default: it
    /// costs more than the 15% of a run it is allowed (docs/confidence.md)
    #[arg(long)]
    pub confidence: bool,
    /// First write this many more rows with an LLM, as `needle generate-data --augment DATA` does, and train on
    /// DATA.augmented.jsonl (0: off)
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub generate: usize,
    /// Requests in flight at once while generating
    #[arg(long, default_value_t = needle_engine::generate::FINETUNE_WORKERS)]
    pub workers: usize,
    #[command(flatten)]
    pub llm: Llm,
}

pub fn run(mut args: Args) -> Result<()> {
    let cancel = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&cancel);
    ctrlc::set_handler(move || flag.store(true, Ordering::Relaxed)).context("installing the Ctrl-C handler")?;
    if args.events.is_some() {
        cancel_on_stdin(&cancel);
    }
    if args.generate > 0 {
        let job = Job {
            num_samples: args.generate,
            batch_size: needle_engine::generate::DEFAULT_BATCH_SIZE,
            workers: args.workers,
            llm: &args.llm,
            events: args.events,
            cancel: &cancel,
            mix: needle_engine::generate::Mix::default(),
        };
        let (augmented, cancelled) = crate::generate::augment(&job, &args.inputs.data, None)?;
        if cancelled {
            noteln!(
                "  {:<9} cancelled while generating: nothing trained; the rows that arrived are in {}",
                "stopped",
                augmented.display()
            );
            return Ok(());
        }
        args.inputs.data = augmented;
    }
    let selected = backend::select(DeviceRequest::resolve(args.device.as_deref())?)?;
    let options = options(&args, args.inputs.base_model()?, adapter_path(&args));
    let mut session = Session::prepare(options.clone(), &selected.device)
        .with_context(|| format!("preparing to fine-tune {}", options.checkpoint.display()))?;
    if args.dry_run {
        session.time_run().context("timing a training step for the plan")?;
        print_plan(&session.plan, &options, args.events.is_some())?;
        return Ok(());
    }
    if session.plan.may_not_fit() {
        noteln!("  {:<9} {}", "warning", memory_warning(&session.plan));
    }
    let result = match args.events {
        Some(EventFormat::Jsonl) => {
            // When the reader of the events is gone (the app closed), stop at the next step and
            // save what was learned, as a cancel would.
            session.run(&selected.info, &cancel, |event| {
                if print_json(&event).is_err() {
                    cancel.store(true, Ordering::Relaxed);
                }
            })
        }
        None => {
            let mut view = TextView::new(session.plan.steps);
            session.run(&selected.info, &cancel, |event| {
                if view.show(&event).is_err() {
                    cancel.store(true, Ordering::Relaxed);
                }
            })
        }
    };
    match result {
        Ok(outcome) => {
            if args.events.is_none() {
                outln!("  {:<9} {}", "adapter", outcome.adapter.display())?;
                let build =
                    format!("needle build {} --lora {}", options.checkpoint.display(), outcome.adapter.display());
                outln!("  {:<9} {build}", "next")?;
            }
            Ok(())
        }
        Err(error) => {
            if args.events.is_some() {
                let _ = print_json(&Event::Failed { message: error.to_string() });
            }
            Err(error.into())
        }
    }
}

/// The run's hyper-parameters as flags, one per entry of the engine's
/// [`TRAIN_FIELDS`](needle_engine::settings::TRAIN_FIELDS) (so names,
/// defaults and help are the ones the app shows), and `--preset`, the app's presets by name: it
/// fills every setting that no flag beside it gives. A value that is not a number, or not a whole
/// one where a count is asked for, is refused here, and ranges by the engine when the run is prepared.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Settings(pub TrainSettings);

const PRESET: &str = "preset";

impl clap::Args for Settings {
    fn augment_args(command: clap::Command) -> clap::Command {
        let names = presets().map(|preset| preset.name);
        let command = command.arg(
            clap::Arg::new(PRESET)
                .long(PRESET)
                .help("Start from the app's preset of that name; flags given beside it still apply")
                .value_parser(clap::builder::PossibleValuesParser::new(names)),
        );
        TrainSettings::default().written().fold(command, |command, (field, default)| {
            let arg = clap::Arg::new(field.name).long(field.flag).help(field.help);
            command.arg(match field.kind {
                FieldKind::Switch => arg.action(clap::ArgAction::SetTrue),
                FieldKind::Number { .. } => arg
                    .value_name(field.flag.to_uppercase().replace('-', "_"))
                    .default_value(default)
                    .value_parser(|text: &str| field.parse(text)),
            })
        })
    }

    fn augment_args_for_update(command: clap::Command) -> clap::Command {
        Self::augment_args(command)
    }
}

impl clap::FromArgMatches for Settings {
    fn from_arg_matches(matches: &clap::ArgMatches) -> Result<Self, clap::Error> {
        let start = match matches.get_one::<String>(PRESET).and_then(|name| preset(name)) {
            Some(preset) => preset.settings,
            None => TrainSettings::default(),
        };
        let typed = |field: &Field| matches.value_source(field.name) == Some(clap::parser::ValueSource::CommandLine);
        let values = start
            .written()
            .filter_map(|(field, start)| {
                let value = match (typed(field), field.kind) {
                    (true, FieldKind::Switch) => serde_json::Value::Bool(matches.get_flag(field.name)),
                    (true, FieldKind::Number { .. }) => matches.get_one::<serde_json::Value>(field.name)?.clone(),
                    (false, _) => field.parse(&start).ok()?,
                };
                Some((field.name.to_string(), value))
            })
            .collect();
        serde_json::from_value(serde_json::Value::Object(values))
            .map(Self)
            .map_err(|e| clap::Error::raw(clap::error::ErrorKind::ValueValidation, e))
    }

    fn update_from_arg_matches(&mut self, matches: &clap::ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(matches)?;
        Ok(())
    }
}

/// The adapter to write. `--out` when given; else the default name, but never over an earlier run's
/// adapter: a run cancelled in its first seconds saves what it has, and that must not replace the
/// last finished one. `--resume` without `--out` continues the newest default adapter.
fn adapter_path(args: &Args) -> PathBuf {
    if let Some(out) = &args.out {
        return out.clone();
    }
    let numbered = |n: usize| match n {
        1 => args.checkpoint_dir.join("needle_lora.pkl"),
        n => args.checkpoint_dir.join(format!("needle_lora-{n}.pkl")),
    };
    let free = (1..).map(numbered).find(|path| !path.exists() && !state_path(path).exists());
    // `(1..)` never runs out; the fallback only satisfies the types.
    let free = free.unwrap_or_else(|| numbered(1));
    if !args.resume {
        return free;
    }
    let newest = (1..).map(numbered).take_while(|path| *path != free).filter(|path| state_path(path).exists());
    newest.max_by_key(|path| std::fs::metadata(state_path(path)).and_then(|m| m.modified()).ok()).unwrap_or(free)
}

fn options(args: &Args, base: BaseModel, out: PathBuf) -> FinetuneOptions {
    FinetuneOptions {
        data: args.inputs.data.clone(),
        checkpoint: base.checkpoint,
        tokenizer: base.tokenizer,
        settings: args.settings.0,
        out,
        resume: args.resume,
        confidence: args.confidence,
    }
}

fn print_plan(plan: &Plan, options: &FinetuneOptions, json: bool) -> Result<()> {
    if json {
        outln!("{}", serde_json::to_string(plan)?)?;
        return Ok(());
    }
    outln!(
        "  {:<9} {} examples  {} held out  seq_len {}  cap {}",
        "data",
        plan.examples,
        plan.validation,
        plan.seq_len,
        options.settings.max_len
    )?;
    outln!(
        "  {:<9} rank {}  alpha {}  {} weight groups  {} parameters",
        "lora",
        options.settings.rank,
        options.settings.alpha,
        plan.adapted_weights,
        plan.trainable_parameters
    )?;
    outln!("  {:<9} {} steps  warmup {}  cosine decay  clip 1.0", "schedule", plan.steps, plan.warmup)?;
    let recompute = if plan.recompute { ", activations recomputed layer by layer" } else { "" };
    outln!("  {:<9} ~{:.0} MB peak (estimate{recompute})", "memory", plan.memory_estimate_bytes as f64 / 1e6)?;
    if plan.may_not_fit() {
        outln!("  {:<9} {}", "warning", memory_warning(plan))?;
    }
    if let Some(seconds) = plan.seconds_estimate {
        outln!("  {:<9} ~{:.0} s (training and decoding steps timed on this machine)", "time", seconds)?;
    }
    outln!("  {:<9} {}", "adapter", options.out.display())?;
    Ok(())
}

fn memory_warning(plan: &Plan) -> String {
    format!(
        "this run needs about {:.1} GB but {:.1} GB is free: it may be killed; lower --batch-size or --max-len",
        plan.memory_estimate_bytes as f64 / 1e9,
        plan.memory_available_bytes.unwrap_or(0) as f64 / 1e9
    )
}

/// The terminal view: a progress bar with ETA, and the reference's line per epoch.
struct TextView {
    bar: ProgressBar,
}

impl TextView {
    fn new(steps: usize) -> Self {
        Self { bar: progress::bar(steps as u64, "{pos}/{len} steps  eta {eta}  {msg}") }
    }

    /// Shows `event`; an error when stdout is closed.
    fn show(&mut self, event: &Event) -> std::io::Result<()> {
        match event {
            Event::Started { backend, device, examples, validation, seq_len, steps, warmup, first_step, .. } => {
                self.bar.println(format!("  {:<9} {backend} ({device})  float32", "backend"));
                self.bar
                    .println(format!("  {:<9} {examples} examples  {validation} held out  seq_len {seq_len}", "data"));
                self.bar.println(format!("  {:<9} {steps} steps  warmup {warmup}  cosine decay  clip 1.0", "schedule"));
                self.bar.set_position(*first_step as u64);
            }
            Event::Step { step, loss, lr, tokens_per_s, .. } => {
                self.bar.set_position(*step as u64);
                self.bar.set_message(format!("loss {loss:.4}  lr {lr:.2e}  {tokens_per_s:.0} tok/s"));
            }
            Event::Epoch { epoch, loss, val } => {
                let val = val.map(|v| format!("  val {v:.4}")).unwrap_or_default();
                self.bar.println(format!("  {:<9} {epoch}  loss {loss:.4}{val}", "epoch"));
            }
            Event::Saved { path } => self.bar.println(format!("  {:<9} {}", "saved", path.display())),
            Event::Unscored { message } => {
                self.bar.println(format!("  {:<9} the held-out examples were not scored: {message}", "warning"));
            }
            Event::HeadFitted { path, rows, right, auroc, from_base, seconds } => {
                let auroc = auroc.map_or("n/a".to_string(), |v| format!("{v:.3}"));
                let start = if *from_base { "; from the base's head" } else { "" };
                self.bar.println(format!(
                    "  {:<9} {} ({rows} training rows, {right} answered right as shipped; cross-fitted AUROC \
                     {auroc}{start}; {seconds:.1}s)",
                    "head",
                    path.display()
                ));
            }
            Event::NoHead { message } => self.bar.println(format!("  {:<9} none: {message}", "head")),
            Event::Scoring { examples } => {
                self.bar.println(format!("  {:<9} answering {examples} held-out examples, base and tuned", "calls"));
            }
            Event::Finished { seconds, partial, accuracy, .. } => {
                self.bar.finish_and_clear();
                let state = if *partial { "stopped early (partial adapter)" } else { "done" };
                outln!("  {:<9} {state} in {seconds:.1}s", "finished")?;
                if let Some(scores) = accuracy {
                    for (model, score) in [("base", &scores.base), ("tuned", &scores.tuned)] {
                        let calls = &score.calls;
                        let rate = 100.0 * calls.exact_rate;
                        outln!(
                            "  {:<9} {model:<6} loss {:.4}  {}/{} exact calls ({rate:.1}%)",
                            "held out",
                            score.loss,
                            calls.exact,
                            calls.examples
                        )?;
                    }
                }
            }
            Event::Failed { message } => self.bar.println(format!("  {:<9} {message}", "failed")),
        }
        Ok(())
    }
}
