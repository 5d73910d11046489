//! The `needle` binary: see the library for the commands.

fn main() -> std::process::ExitCode {
    needle_cli::main_with(std::env::args_os())
}
