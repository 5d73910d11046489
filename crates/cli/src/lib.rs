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
mod inputs;
mod inspect;
mod run;
mod tokenize;

pub use events::CANCEL_LINE;

use std::ffi::OsString;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "needle", version, about = "Fine-tune Needle (3, or 2) and build .cact files, without Python")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Show the compute backend (CUDA, Metal or CPU) that training would use, and why.
    Backend(backend::Args),
    /// Time LoRA training steps and peak memory on a random-init model of a given shape.
    Bench(bench::Args),
    /// Merge an optional LoRA adapter into a checkpoint and write a quantized `.cact`.
    Build(build::Args),
    /// Report on a dataset: usable examples, problems by line, token lengths, sequence length.
    Data(data::Args),
    /// Fetch a base model's checkpoint and tokenizer (Needle 2 or 3, or a named file) from the Hugging Face hub.
    Download(download::Args),
    /// Masked answer loss of a checkpoint (and optional LoRA adapter) over a dataset.
    Eval(eval::Args),
    /// Fine-tune LoRA adapters on a dataset with the reference's recipe.
    Finetune(finetune::Args),
    /// Write training data with an LLM (OpenRouter or any OpenAI-compatible endpoint), each row checked by the doctor.
    GenerateData(generate::Args),
    /// Describe a `.cact` file: geometry, tensors, sizes; `--verify` dequantizes every tensor.
    Inspect(inspect::Args),
    /// Ask a model (base, tuned or a built .cact) one question and print the calls it makes.
    Run(run::Args),
    /// Print the token ids of each input line as a JSON array.
    Tokenize(tokenize::Args),
}

/// Runs `needle` with these arguments (the first is the program name), as the binary does.
pub fn main_with(args: impl IntoIterator<Item = impl Into<OsString> + Clone>) -> ExitCode {
    let process_start = std::time::Instant::now();
    needle_engine::backend::keep_elementwise_ops_on_the_calling_thread();
    let result = match Cli::parse_from(args).command {
        Command::Backend(args) => backend::run(args),
        Command::Bench(args) => bench::run(args, process_start),
        Command::Build(args) => build::run(args),
        Command::Data(args) => data::run(args),
        Command::Download(args) => download::run(args),
        Command::Eval(args) => eval::run(args),
        Command::Finetune(args) => finetune::run(args),
        Command::GenerateData(args) => generate::run(args),
        Command::Inspect(args) => inspect::run(args),
        Command::Run(args) => run::run(args),
        Command::Tokenize(args) => tokenize::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            // `{:#}` prints the whole cause chain on one line; the engine's messages already name the
            // file, the place and the fix, so a backtrace would only bury them.
            noteln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}
