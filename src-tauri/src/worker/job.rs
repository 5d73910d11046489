//! The work the app gives its worker, one [`Job`] per kind, and the one function that writes a job as
//! the worker's command line ([`argv`]): the CLI's own argument types ([`needle_cli::args`]) hold the
//! values, and the CLI's own definition ([`Cli`]) spells every flag, so no flag is written here and
//! none can drift from what the CLI reads.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use clap::CommandFactory;
use needle_cli::args::{self, EventFormat, LadderArgs, Llm, ModelInputs, Settings, WeightsInputs};
use needle_cli::{Cli, Command};
use needle_engine::cact::Bits;
use needle_engine::generate::{DEFAULT_SUITE_CASES, DEFAULT_TIMEOUT_S, DEFAULT_WORKERS, FINETUNE_WORKERS};
use needle_engine::generation::Generation;
use needle_engine::settings::TrainSettings;
use serde_json::{Map, Value};

/// A training's inputs, as the worker takes them.
#[derive(Debug, Clone, PartialEq)]
pub struct Finetune {
    pub dataset: PathBuf,
    pub checkpoint: PathBuf,
    pub tokenizer: PathBuf,
    pub device: String,
    pub settings: TrainSettings,
    /// Where the adapter goes (and beside it the state Resume continues from).
    pub adapter: PathBuf,
}

/// Where `needle generate-data --suite` writes its suite, and how many cases it holds.
#[derive(Debug, Clone, PartialEq)]
pub struct SuiteOut {
    pub path: PathBuf,
    pub cases: usize,
}

/// One piece of work for the worker.
#[derive(Debug, Clone, PartialEq)]
pub enum Job {
    /// `needle finetune`, its progress as JSON lines; with `plan_only`, the plan it would follow.
    Train { finetune: Finetune, plan_only: bool },
    /// The training continued from the state saved beside its adapter.
    Resume(Finetune),
    /// `needle build`: the adapter merged into its base, written as a `bits`-bit `.cact`; with
    /// `layers`, that rung of a Needle 3 model's depth ladder.
    Build { checkpoint: PathBuf, adapter: PathBuf, tokenizer: PathBuf, bits: Bits, layers: Option<usize>, out: PathBuf },
    /// `needle eval --ladder --events jsonl`: every rung of the tuned model's depth ladder scored on the
    /// first `examples` that a training with `settings` held out; `cancel` on stdin stops it.
    Ladder {
        checkpoint: PathBuf,
        adapter: PathBuf,
        tokenizer: PathBuf,
        dataset: PathBuf,
        settings: TrainSettings,
        examples: usize,
    },
    /// `needle eval --accuracy --quant-rows`: the tuned model (`checkpoint` with `adapter` merged)
    /// three ways (float, its quantization simulated, and `cact`, built from it) on the first
    /// `examples` that a training with `settings` held out.
    Evaluate {
        checkpoint: PathBuf,
        adapter: PathBuf,
        cact: PathBuf,
        tokenizer: PathBuf,
        dataset: PathBuf,
        settings: TrainSettings,
        examples: usize,
    },
    /// `needle generate-data --augment`: `count` more rows of a dataset, in requests of `batch_size`,
    /// written after its own to `output`; with `suite`, an acceptance suite for the same tools too
    /// (`count` 0: the suite alone).
    Generate {
        dataset: PathBuf,
        count: usize,
        batch_size: usize,
        /// The share of rows that must get no call, where the user set one.
        negative_share: Option<f64>,
        model: String,
        endpoint: Option<String>,
        output: PathBuf,
        suite: Option<SuiteOut>,
    },
    /// `needle data`: the dataset's report, its lines read as `generation` reads them.
    Report { dataset: PathBuf, tokenizer: PathBuf, max_len: usize, generation: Generation },
    /// `needle run`: one question to a base model, with an adapter or without.
    Try {
        checkpoint: PathBuf,
        tokenizer: PathBuf,
        lora: Option<PathBuf>,
        tools: PathBuf,
        query: String,
        system: String,
        max_new: usize,
    },
    /// `needle suite --json`: an acceptance suite answered by `checkpoint` (with `lora` merged, or not)
    /// or, when given, by the built `cact` instead; the gate at `min_confidence`. It exits 1 when the
    /// contract does not hold.
    Suite {
        checkpoint: PathBuf,
        lora: Option<PathBuf>,
        cact: Option<PathBuf>,
        tokenizer: PathBuf,
        suite: PathBuf,
        min_confidence: f64,
    },
    /// `needle backend`: the hardware a GPU build of the worker finds.
    Hardware,
}

impl Job {
    /// The job as the CLI's own arguments; what the app leaves to the CLI keeps the CLI's default.
    pub fn command(&self) -> Command {
        match self {
            Job::Train { finetune, plan_only } => Command::Finetune(finetune.args(*plan_only, false)),
            Job::Resume(finetune) => Command::Finetune(finetune.args(false, true)),
            Job::Build { checkpoint, adapter, tokenizer, bits, layers, out } => Command::Build(args::Build {
                checkpoint: Some(checkpoint.clone()),
                lora: Some(adapter.clone()),
                out: Some(out.clone()),
                bits: Some(*bits),
                layers: *layers,
                tokenizer: Some(tokenizer.clone()),
                generation: Generation::default(),
                upload: false,
                events: Some(EventFormat::Jsonl),
            }),
            Job::Evaluate { checkpoint, adapter, cact, tokenizer, dataset, settings, examples } => {
                Command::Eval(args::Eval {
                    accuracy: true,
                    quant_rows: Some(cact.clone()),
                    json: true,
                    ..held_out(checkpoint, adapter, tokenizer, dataset, settings, *examples)
                })
            }
            Job::Ladder { checkpoint, adapter, tokenizer, dataset, settings, examples } => Command::Eval(args::Eval {
                ladder: LadderArgs { ladder: true, rungs: Vec::new(), events: Some(EventFormat::Jsonl) },
                ..held_out(checkpoint, adapter, tokenizer, dataset, settings, *examples)
            }),
            Job::Generate { dataset, count, batch_size, negative_share, model, endpoint, output, suite } => {
                Command::GenerateData(args::GenerateData {
                    tools: None,
                    augment: Some(dataset.clone()),
                    num_samples: *count,
                    negative_share: *negative_share,
                    parallel_share: None,
                    suite: suite.as_ref().map(|suite| suite.path.clone()),
                    // The CLI takes a count only with a suite.
                    suite_cases: suite.as_ref().map_or(DEFAULT_SUITE_CASES, |suite| suite.cases),
                    batch_size: *batch_size,
                    workers: DEFAULT_WORKERS,
                    llm: Llm { model: model.clone(), endpoint: endpoint.clone(), timeout: DEFAULT_TIMEOUT_S },
                    output: Some(output.clone()),
                    events: Some(EventFormat::Jsonl),
                })
            }
            Job::Report { dataset, tokenizer, max_len, generation } => Command::Data(args::Data {
                data: dataset.clone(),
                tokenizer: Some(tokenizer.clone()),
                max_len: *max_len,
                json: true,
                generation: *generation,
                fix: None,
            }),
            Job::Try { checkpoint, tokenizer, lora, tools, query, system, max_new } => Command::Run(args::Run {
                weights: WeightsInputs {
                    checkpoint: Some(checkpoint.clone()),
                    lora: lora.clone(),
                    weights: None,
                    tokenizer: Some(tokenizer.clone()),
                    generation: Generation::default(),
                },
                tools: tools.clone(),
                query: query.clone(),
                system: system.clone(),
                max_new: *max_new,
                device: None,
                json: true,
            }),
            Job::Suite { checkpoint, lora, cact, tokenizer, suite, min_confidence } => {
                let weights = match cact {
                    Some(cact) => WeightsInputs {
                        checkpoint: None,
                        lora: None,
                        weights: Some(cact.clone()),
                        tokenizer: None,
                        generation: Generation::default(),
                    },
                    None => WeightsInputs {
                        checkpoint: Some(checkpoint.clone()),
                        lora: lora.clone(),
                        weights: None,
                        tokenizer: Some(tokenizer.clone()),
                        generation: Generation::default(),
                    },
                };
                Command::Suite(args::Suite {
                    suite: suite.clone(),
                    weights,
                    min_confidence: *min_confidence,
                    max_new: needle_engine::suite::DEFAULT_MAX_NEW_TOKENS,
                    device: None,
                    json: true,
                })
            }
            Job::Hardware => Command::Backend(args::Backend { device: None, json: true }),
        }
    }

    /// The worker's command line for this job (see [`argv`]).
    pub fn argv(&self) -> Result<Vec<OsString>, String> {
        argv(&self.command())
    }
}

/// `needle eval` of the tuned model (`checkpoint` with `adapter` merged) on the first `examples` that a
/// training with `settings` held out, asked for nothing yet: what Evaluate and the ladder share.
fn held_out(
    checkpoint: &Path,
    adapter: &Path,
    tokenizer: &Path,
    dataset: &Path,
    settings: &TrainSettings,
    examples: usize,
) -> args::Eval {
    args::Eval {
        data: dataset.into(),
        weights: WeightsInputs {
            checkpoint: Some(checkpoint.into()),
            lora: Some(adapter.into()),
            weights: None,
            tokenizer: Some(tokenizer.into()),
            generation: Generation::default(),
        },
        max_len: settings.max_len,
        batch_size: args::EVAL_BATCH_SIZE,
        val_split: Some(settings.val_split),
        seed: settings.seed,
        max_examples: Some(examples),
        accuracy: false,
        answers: None,
        all_answers: false,
        quant_rows: None,
        ladder: LadderArgs::default(),
        device: None,
        json: false,
    }
}

impl Finetune {
    fn args(&self, dry_run: bool, resume: bool) -> args::Finetune {
        args::Finetune {
            inputs: ModelInputs {
                data: self.dataset.clone(),
                checkpoint: Some(self.checkpoint.clone()),
                tokenizer: Some(self.tokenizer.clone()),
                generation: Generation::default(),
            },
            settings: Settings(self.settings),
            checkpoint_dir: args::CHECKPOINT_DIR.into(),
            out: Some(self.adapter.clone()),
            device: Some(self.device.clone()),
            events: Some(EventFormat::Jsonl),
            resume,
            dry_run,
            // Off in the app as in the CLI until fitting the head keeps to its time budget.
            confidence: false,
            generate: 0,
            workers: FINETUNE_WORKERS,
            llm: Llm {
                model: needle_engine::generate::DEFAULT_MODEL.into(),
                endpoint: None,
                timeout: DEFAULT_TIMEOUT_S,
            },
        }
    }
}

/// `command` as the worker's command line, spelled by the CLI's own definition: the subcommand, then
/// each argument whose value is not the CLI's default, as `--flag=value` (so a value that starts with
/// a dash, a query such as "-5 degrees", stays a value), each flag that is set, and last, after
/// `--`, the positional arguments (file names, never read as flags).
pub fn argv(command: &Command) -> Result<Vec<OsString>, String> {
    let unwritable = |why: String| format!("the worker's job could not be written: {why}");
    let written = serde_json::to_value(command).map_err(|error| unwritable(error.to_string()))?;
    let Some((name, Value::Object(fields))) = written.as_object().and_then(|outer| outer.iter().next()) else {
        return Err(unwritable(format!("{written} is not a subcommand with arguments")));
    };
    let cli = Cli::command();
    let subcommand = cli.find_subcommand(name).ok_or_else(|| unwritable(format!("the CLI has no {name}")))?;
    // The values by argument id; a group the CLI flattens into its arguments is flattened here too.
    let mut values = Map::new();
    flatten(fields.clone(), &mut values);
    let mut argv: Vec<OsString> = vec![name.into()];
    let mut positional: Vec<OsString> = Vec::new();
    for arg in subcommand.get_arguments() {
        let Some(value) = values.remove(arg.get_id().as_str()) else { continue };
        let long = arg.get_long();
        let text = match value {
            Value::Null | Value::Bool(false) => continue,
            Value::Bool(true) if !arg.get_action().takes_values() => {
                let long = long.ok_or_else(|| unwritable(format!("{} is a flag without a name", arg.get_id())))?;
                argv.push(format!("--{long}").into());
                continue;
            }
            Value::String(text) => text,
            other => other.to_string(),
        };
        if matches!(arg.get_default_values(), [default] if default == text.as_str()) {
            continue;
        }
        match long {
            Some(long) => argv.push(format!("--{long}={text}").into()),
            None => positional.push(text.into()),
        }
    }
    if let Some(id) = values.keys().next() {
        return Err(unwritable(format!("the CLI's {name} has no argument {id}")));
    }
    if !positional.is_empty() {
        argv.push("--".into());
        argv.extend(positional);
    }
    Ok(argv)
}

/// `fields` into `values`, the fields of each nested group among them.
fn flatten(fields: Map<String, Value>, values: &mut Map<String, Value>) {
    for (id, value) in fields {
        match value {
            Value::Object(group) => flatten(group, values),
            value => {
                values.insert(id, value);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use needle_engine::settings::presets;

    fn finetune() -> Finetune {
        Finetune {
            dataset: "/data/-smart home.jsonl".into(),
            checkpoint: "/m/base.pkl".into(),
            tokenizer: "/m/tokenizer.model".into(),
            device: "cpu".into(),
            settings: presets()[0].settings,
            adapter: "/trainings/t-1/adapter.pkl".into(),
        }
    }

    /// One job of each kind, with values the CLI must not take for flags or defaults.
    fn every_job() -> Vec<Job> {
        vec![
            Job::Train { finetune: finetune(), plan_only: false },
            Job::Train { finetune: Finetune { device: "auto".into(), ..finetune() }, plan_only: true },
            Job::Resume(finetune()),
            Job::Build {
                checkpoint: "/m/base.safetensors".into(),
                adapter: "/t/adapter.safetensors".into(),
                tokenizer: "/m/tokenizer.model".into(),
                bits: Bits::Two,
                layers: None,
                out: "/out/tuned.cact".into(),
            },
            Job::Build {
                checkpoint: "/m/needle3.safetensors".into(),
                adapter: "/t/adapter.safetensors".into(),
                tokenizer: "/m/tokenizer.model".into(),
                bits: Bits::Four,
                layers: Some(2),
                out: "/out/tuned-2-layers.cact".into(),
            },
            Job::Ladder {
                checkpoint: "/m/needle3.safetensors".into(),
                adapter: "/t/adapter.safetensors".into(),
                tokenizer: "/m/tokenizer.model".into(),
                dataset: "/data/-smart home.jsonl".into(),
                settings: presets()[1].settings,
                examples: 24,
            },
            Job::Evaluate {
                checkpoint: "/m/base.pkl".into(),
                adapter: "/t/adapter.pkl".into(),
                cact: "/out/tuned.cact".into(),
                tokenizer: "/m/tokenizer.model".into(),
                dataset: "/data/smart_home.jsonl".into(),
                settings: presets()[1].settings,
                examples: 24,
            },
            Job::Generate {
                dataset: "/data/smart_home.jsonl".into(),
                count: 6,
                batch_size: 6,
                negative_share: Some(0.3),
                model: "stub/model".into(),
                endpoint: Some("http://127.0.0.1:9/v1/chat/completions".into()),
                output: "/data/more.jsonl".into(),
                suite: None,
            },
            Job::Generate {
                dataset: "/data/smart_home.jsonl".into(),
                count: 0,
                batch_size: 1,
                negative_share: None,
                model: "stub/model".into(),
                endpoint: None,
                output: "/data/smart_home.augmented.jsonl".into(),
                suite: Some(SuiteOut { path: "/data/-smart home.suite.json".into(), cases: 8 }),
            },
            Job::Report {
                dataset: "/data/smart_home.jsonl".into(),
                tokenizer: "/m/tokenizer.model".into(),
                max_len: 512,
                generation: Generation::Needle2,
            },
            Job::Try {
                checkpoint: "/m/base.pkl".into(),
                tokenizer: "/m/tokenizer.model".into(),
                lora: Some("/t/adapter.pkl".into()),
                tools: "/tmp/tools.json".into(),
                query: "-5 degrees in the kitchen --now".into(),
                system: "--be brief".into(),
                max_new: 256,
            },
            Job::Suite {
                checkpoint: "/m/needle3.safetensors".into(),
                lora: Some("/t/adapter.safetensors".into()),
                cact: None,
                tokenizer: "/m/tokenizer.model".into(),
                suite: "/s/-smart home.suite.json".into(),
                min_confidence: 0.4,
            },
            Job::Suite {
                checkpoint: "/m/needle3.safetensors".into(),
                lora: None,
                cact: Some("/out/tuned.cact".into()),
                tokenizer: "/m/tokenizer.model".into(),
                suite: "/s/smart_home.suite.json".into(),
                min_confidence: 0.0,
            },
            Job::Hardware,
        ]
    }

    #[test]
    fn every_job_reads_back_through_the_clis_own_parser() {
        for job in every_job() {
            let argv = job.argv().unwrap_or_else(|error| panic!("{job:?}: {error}"));
            let parsed = Cli::try_parse_from(std::iter::once(OsString::from("needle")).chain(argv.clone()))
                .unwrap_or_else(|error| panic!("{argv:?} does not parse: {error}"));
            let (sent, read) = (serde_json::to_value(job.command()), serde_json::to_value(parsed.command));
            assert_eq!(sent.unwrap(), read.unwrap(), "{argv:?}");
        }
    }

    #[test]
    fn what_the_cli_defaults_to_is_left_out_and_files_come_last() {
        let argv = Job::Train { finetune: finetune(), plan_only: true }.argv().unwrap();
        let argv: Vec<String> = argv.iter().map(|arg| arg.to_string_lossy().into_owned()).collect();
        // Neither the generation, the LLM of `--generate` (off) nor the default seed is written; the
        // other settings are.
        let defaults = ["--generation", "--model", "--workers", "--checkpoint-dir", "--seed"];
        assert!(!argv.iter().any(|arg| defaults.iter().any(|flag| arg.starts_with(flag))), "{argv:?}");
        assert!(argv.contains(&"--dry-run".into()) && argv.contains(&"--lr=0.002".into()), "{argv:?}");
        assert_eq!(argv[0], "finetune");
        assert_eq!(argv[argv.len() - 2..], ["--", "/data/-smart home.jsonl"]);
    }

    #[test]
    fn a_generation_asks_for_a_suite_only_when_it_has_one() {
        let generate = |count, suite| Job::Generate {
            dataset: "/data/smart_home.jsonl".into(),
            count,
            batch_size: 6,
            negative_share: None,
            model: "stub/model".into(),
            endpoint: None,
            output: "/data/more.jsonl".into(),
            suite,
        };
        let written = |job: Job| -> Vec<String> {
            job.argv().unwrap().iter().map(|arg| arg.to_string_lossy().into_owned()).collect()
        };
        let rows = written(generate(6, None));
        assert!(rows.contains(&"--num-samples=6".into()), "{rows:?}");
        assert!(!rows.iter().any(|arg| arg.starts_with("--suite")), "no suite was asked for: {rows:?}");
        let suite = SuiteOut { path: "/data/more.suite.json".into(), cases: 8 };
        let both = written(generate(0, Some(suite)));
        for expected in ["--num-samples=0", "--suite=/data/more.suite.json", "--suite-cases=8", "--events=jsonl"] {
            assert!(both.contains(&expected.into()), "{expected} missing from {both:?}");
        }
        // Upstream's size is the CLI's default, so it is left to the CLI.
        let upstream = SuiteOut { path: "/data/more.suite.json".into(), cases: DEFAULT_SUITE_CASES };
        let upstream = written(generate(6, Some(upstream)));
        assert!(upstream.contains(&"--suite=/data/more.suite.json".into()), "{upstream:?}");
        assert!(!upstream.iter().any(|arg| arg.starts_with("--suite-cases")), "{upstream:?}");
    }
}
