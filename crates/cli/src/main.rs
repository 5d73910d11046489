//! `needle`: the command-line face of the Needle Studio engine, a drop-in for the reference's Python
//! commands. Every subcommand is a thin layer over `needle_engine`; the desktop app drives the same code.

mod backend;
mod tokenize;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "needle", version, about = "Fine-tune Needle 2 and build .cact files, without Python")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Show the compute backend (CUDA, Metal or CPU) that training would use, and why.
    Backend(backend::Args),
    /// Print the token ids of each input line as a JSON array.
    Tokenize(tokenize::Args),
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Backend(args) => backend::run(args),
        Command::Tokenize(args) => tokenize::run(args),
    }
}
