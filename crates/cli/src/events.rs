//! `--events jsonl`: progress as one JSON object per line on stdout, the stream the desktop app reads
//! from its worker process.

use std::io::{BufRead, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use serde::Serialize;

#[derive(Debug, Clone, Copy, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum EventFormat {
    Jsonl,
}

/// Prints one event as a JSON line. A closed stdout (the app that read it has gone, or `| head`)
/// is an error to act on, never a panic.
pub fn print_json(event: &impl Serialize) -> std::io::Result<()> {
    // Serialising plain enums of numbers, strings and paths cannot fail.
    let line = serde_json::to_string(event).map_err(std::io::Error::other)?;
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{line}")?;
    stdout.flush()
}

/// The line a parent process writes to a worker's stdin to ask it to stop at the next step. Signals
/// would do on Unix, but Windows has no way to send Ctrl-C to one child, and stdin works everywhere.
pub const CANCEL_LINE: &str = "cancel";

/// Sets `cancel` when [`CANCEL_LINE`] arrives on stdin. End of input is not a request: a worker run
/// with stdin closed or at `/dev/null` trains to the end.
pub fn cancel_on_stdin(cancel: &Arc<AtomicBool>) {
    let flag = Arc::clone(cancel);
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            match line {
                Ok(line) if line.trim() == CANCEL_LINE => flag.store(true, Ordering::Relaxed),
                Ok(_) => {}
                Err(_) => return,
            }
        }
    });
}
