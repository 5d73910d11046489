//! `needle`: the command-line face of the Needle Studio engine, a drop-in for the reference's Python
//! commands. Every subcommand is a thin layer over `needle_engine`. It is a library too, so the desktop
//! app can re-run its own binary as a `needle` worker process (`needle-studio worker finetune …`).

/// `println!` that returns the error of a closed stdout (`needle … | head -1`, an app that went
/// away) for the command to fail with, where `println!` would panic.
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout().lock(), $($arg)*)
    }};
}

/// `eprint!` for progress on the side: a closed stderr loses it, never panics the command.
macro_rules! note {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = write!(std::io::stderr().lock(), $($arg)*);
    }};
}

/// `eprintln!` for notes on the side: a closed stderr loses the note, never panics the command.
macro_rules! noteln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr().lock(), $($arg)*);
    }};
}

mod backend;
mod bench;
mod build;
mod data;
mod download;
mod eval;
mod events;
mod finetune;
mod generate;
mod gradients;
mod inputs;
mod inspect;
mod ladder;
mod progress;
mod run;
mod suite;
mod tokenize;

pub use events::CANCEL_LINE;

/// The argument types of the subcommands a program that drives `needle` writes (the desktop app's
/// worker jobs): filled in as values, they are written as a command line by the CLI's own definition
/// ([`Cli`]), never by hand, and [`Cli`] reads them back.
pub mod args {
    pub use crate::backend::Args as Backend;
    pub use crate::build::Args as Build;
    pub use crate::data::Args as Data;
    pub use crate::eval::{Args as Eval, DEFAULT_BATCH_SIZE as EVAL_BATCH_SIZE};
    pub use crate::events::EventFormat;
    pub use crate::finetune::{Args as Finetune, Settings, CHECKPOINT_DIR};
    pub use crate::generate::{Args as GenerateData, Llm};
    pub use crate::inputs::{ModelInputs, WeightsInputs};
    pub use crate::ladder::LadderArgs;
    pub use crate::run::Args as Run;
    pub use crate::suite::Args as Suite;
}

use std::ffi::OsString;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// The `needle` command line.
#[derive(Parser)]
#[command(name = "needle", version, about = "Fine-tune Needle (3, or 2) and build .cact files, without Python")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

/// A subcommand with its arguments. Serialised (the subcommands a program writes, see [`args`]), it
/// is `{"<subcommand>": {<argument id>: <value as the command line reads it>, …}}`.
#[derive(Subcommand, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Command {
    /// Show the compute backend (CUDA, Metal or CPU) that training would use, and why.
    Backend(backend::Args),
    /// Time LoRA training steps and peak memory on a random-init model of a given shape.
    #[serde(skip)]
    Bench(bench::Args),
    /// Merge an optional LoRA adapter into a checkpoint and write a quantized `.cact`.
    Build(build::Args),
    /// Report on a dataset: usable examples, problems by line, token lengths, sequence length.
    Data(data::Args),
    /// Fetch a base model's checkpoint and tokenizer (Needle 2 or 3, or a named file) from the Hugging Face hub.
    #[serde(skip)]
    Download(download::Args),
    /// Masked answer loss of a checkpoint (and optional LoRA adapter) over a dataset.
    Eval(eval::Args),
    /// Fine-tune LoRA adapters on a dataset with the reference's recipe.
    Finetune(finetune::Args),
    /// Write training data with an LLM (OpenRouter or any OpenAI-compatible endpoint), each row checked by the doctor.
    GenerateData(generate::Args),
    /// One reverse pass's loss and LoRA gradients on a batch, written out to compare devices (bench/gpu_check.sh).
    /// A developer's check, so left out of `needle --help`.
    #[serde(skip)]
    #[command(hide = true)]
    Gradients(gradients::Args),
    /// Describe a `.cact` file: geometry, tensors, sizes; `--verify` dequantizes every tensor.
    #[serde(skip)]
    Inspect(inspect::Args),
    /// Ask a model (base, tuned or a built .cact) one question and print the calls it makes.
    Run(run::Args),
    /// Score a model on an acceptance suite and check the production contract (exit 0 held, 1 not, 2 error).
    Suite(suite::Args),
    /// Print the token ids of each input line as a JSON array.
    #[serde(skip)]
    Tokenize(tokenize::Args),
}

/// Runs `needle` with these arguments (the first is the program name), as the binary does.
pub fn main_with(args: impl IntoIterator<Item = impl Into<OsString> + Clone>) -> ExitCode {
    let process_start = std::time::Instant::now();
    needle_engine::backend::keep_elementwise_ops_on_the_calling_thread();
    needle_engine::backend::keep_freed_memory_for_reuse();
    let result = match Cli::parse_from(args).command {
        Command::Backend(args) => backend::run(args),
        Command::Bench(args) => bench::run(args, process_start),
        Command::Build(args) => build::run(args),
        Command::Data(args) => data::run(args),
        Command::Download(args) => download::run(args),
        Command::Eval(args) => eval::run(args),
        Command::Finetune(args) => finetune::run(args),
        Command::GenerateData(args) => generate::run(args),
        Command::Gradients(args) => gradients::run(args),
        Command::Inspect(args) => inspect::run(args),
        Command::Run(args) => run::run(args),
        // The contract's outcome is the exit status: 0 it holds, 1 it does not, 2 an error.
        Command::Suite(args) => {
            return match suite::run(args) {
                Ok(contract) => ExitCode::from(u8::from(!contract)),
                Err(error) => {
                    report(&error);
                    ExitCode::from(2)
                }
            }
        }
        Command::Tokenize(args) => tokenize::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            report(&error);
            ExitCode::FAILURE
        }
    }
}

/// The error on one line: the engine's messages already name the file, the place and the fix, so
/// a backtrace would only bury them.
fn report(error: &anyhow::Error) {
    noteln!("error: {}", one_line(error));
}

/// The error and its causes on one line, each cause once: a message that already quotes its
/// cause (`cannot read x: permission denied`, whose source is `permission denied`) is not followed
/// by it again, as `{:#}` would.
fn one_line(error: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in error.chain() {
        let text = cause.to_string();
        if !line.contains(&text) {
            if !line.is_empty() {
                line.push_str(": ");
            }
            line.push_str(&text);
        }
    }
    line
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use super::{one_line, Cli};

    #[test]
    fn the_developers_gradients_command_runs_but_is_not_listed() {
        let help = Cli::command().render_help().to_string();
        assert!(help.contains("finetune") && !help.contains("gradients"), "{help}");
        assert!(
            Cli::try_parse_from(["needle", "gradients", "--help"]).is_err_and(|e| e.to_string().contains("--batch"))
        );
    }

    /// An error whose message quotes its source, as the engine's errors do.
    #[derive(Debug)]
    struct Quoting {
        source: std::io::Error,
    }

    impl std::fmt::Display for Quoting {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "cannot read adapter a.safetensors: {}; check the path", self.source)
        }
    }

    impl std::error::Error for Quoting {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.source)
        }
    }

    #[test]
    fn each_cause_is_printed_once() {
        let io = std::io::Error::new(std::io::ErrorKind::PermissionDenied, "permission denied");
        let error = anyhow::Error::new(Quoting { source: io }).context("loading the model");
        assert_eq!(
            one_line(&error),
            "loading the model: cannot read adapter a.safetensors: permission denied; check the path"
        );
        let plain = anyhow::anyhow!("disk full").context("writing out.cact");
        assert_eq!(one_line(&plain), "writing out.cact: disk full");
    }
}
