//! `needle tokenize`: ids of each input line, one JSON array per line, in order.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use needle_engine::generation::Generation;
use needle_engine::tokenizer::Tokenizer;

#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("input").required(true).args(["text", "file"])))]
pub struct Args {
    /// SentencePiece `tokenizer.model` [default: the --generation's, from the Hugging Face cache or the hub]
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// The published base model whose tokenizer is used without --tokenizer: 2 (Cactus-Compute/needle2, as
    /// cactus-needle 2.0.8) or 3 (Cactus-Compute/needle3, 3.x's default)
    #[arg(long, default_value = Generation::default().number().to_string())]
    generation: Generation,
    /// Text to tokenize; each line is one input.
    #[arg(long)]
    text: Option<String>,
    /// File to tokenize; each line is one input.
    #[arg(long)]
    file: Option<PathBuf>,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let tokenizer = Tokenizer::load(&crate::download::tokenizer(args.generation, args.tokenizer.as_deref())?)?;
    let text = match (&args.text, &args.file) {
        (Some(text), _) => text.clone(),
        (None, Some(path)) => {
            std::fs::read_to_string(path).with_context(|| format!("cannot read {} as UTF-8 text", path.display()))?
        }
        (None, None) => unreachable!("clap requires --text or --file"),
    };
    let mut out = std::io::stdout().lock();
    for line in input_lines(&text) {
        serde_json::to_writer(&mut out, &tokenizer.encode(line))?;
        writeln!(out)?;
    }
    Ok(())
}

/// Splits on `\n` only, so a `\r` before it stays part of the line and is tokenized like any other
/// character; a final newline ends the last line rather than starting an empty one.
/// An empty input has no lines at all.
fn input_lines(text: &str) -> impl Iterator<Item = &str> {
    let body = text.strip_suffix('\n').unwrap_or(text);
    body.split('\n').take(if text.is_empty() { 0 } else { usize::MAX })
}

#[cfg(test)]
mod tests {
    use super::input_lines;

    #[test]
    fn lines_keep_carriage_returns_and_empty_lines() {
        let lines: Vec<_> = input_lines("a\r\n\nb\n").collect();
        assert_eq!(lines, ["a\r", "", "b"]);
        assert_eq!(input_lines("").count(), 0);
        assert_eq!(input_lines("\n").collect::<Vec<_>>(), [""]);
    }
}
