//! The summary `needle data --json` prints and the app shows before a run.

use super::encode::FIRST_BUCKET;
use std::path::Path;

use super::example::Example;
use super::{render, Checkup, Issue, Problem, Problems, Tokenized};
use serde::Serialize;

/// How many rendered examples the report shows.
const SAMPLE_COUNT: usize = 3;

/// The longest text of a sample the report carries, in characters: enough to read an example and
/// to try it, while an exported chat log with one 50 MB line still makes a small report.
const SAMPLE_CHARS: usize = 16_384;

#[derive(Debug, Clone, Serialize)]
pub struct DatasetReport {
    pub path: String,
    pub usable_examples: usize,
    /// Lines left out of training (each has a problem saying why).
    pub skipped_lines: usize,
    /// Problems of reading and truncation: the first ones in line order, and counts of all.
    #[serde(flatten)]
    pub problems: Problems,
    /// Row lengths (BOS + prompt + target + EOS) before truncation.
    pub token_lengths: LengthStats,
    pub histogram: Vec<HistogramBin>,
    /// The `--max-len` the sequence length was fitted under.
    pub cap: usize,
    pub seq_len: usize,
    pub truncated: usize,
    /// The first few examples as the model will see them.
    pub samples: Vec<Sample>,
    /// The dataset doctor's findings: answers against their schemas, grounding, repeats, balance.
    pub doctor: Checkup,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LengthStats {
    pub min: usize,
    pub median: f64,
    pub max: usize,
}

/// Rows longer than the previous bin's `up_to` and at most this one's; the bounds are the
/// sequence lengths `fit_max_len` can pick (128, 256, 512, ...).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HistogramBin {
    pub up_to: usize,
    pub count: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Sample {
    pub line: usize,
    /// The texts below are cut at `SAMPLE_CHARS` characters, each marked where it was cut.
    pub prompt: String,
    pub target: String,
    pub tokens: usize,
    /// The example's tools and query as they were written, to try a model with.
    pub tools: String,
    pub query: String,
}

impl DatasetReport {
    /// The report on the dataset at `path`: `tokenized` holds its `examples` in order, tokenized;
    /// `seq_len` was fitted under `cap`.
    pub(super) fn new(
        path: &Path,
        examples: &[Example],
        file_problems: &Problems,
        tokenized: &[Tokenized],
        cap: usize,
        seq_len: usize,
    ) -> Self {
        let problems = file_problems.merged(&truncation_problems(tokenized, seq_len));
        let lengths: Vec<usize> = tokenized.iter().map(Tokenized::sequence_len).collect();
        let samples = examples
            .iter()
            .zip(&lengths)
            .take(SAMPLE_COUNT)
            .map(|(example, &tokens)| {
                let (prompt, target) = render(example);
                let (prompt, target) = (clipped(&prompt), clipped(&target));
                let (tools, query) = (clipped(&example.tools), clipped(&example.query));
                Sample { line: example.line, prompt, target, tokens, tools, query }
            })
            .collect();
        let too_long: Vec<usize> = tokenized.iter().filter(|t| t.sequence_len() > seq_len).map(|t| t.line).collect();
        let doctor = Checkup::new(examples, &too_long, file_problems.skipping);
        DatasetReport {
            doctor,
            path: path.display().to_string(),
            usable_examples: examples.len(),
            skipped_lines: file_problems.skipping,
            truncated: lengths.iter().filter(|&&len| len > seq_len).count(),
            token_lengths: length_stats(&lengths),
            histogram: histogram(&lengths),
            problems,
            cap,
            seq_len,
            samples,
        }
    }
}

fn truncation_problems(tokenized: &[Tokenized], seq_len: usize) -> Problems {
    let mut problems = Problems::default();
    for t in tokenized.iter().filter(|t| t.sequence_len() > seq_len) {
        let issue = Issue::Truncated {
            tokens: t.sequence_len(),
            seq_len,
            target_tokens: t.target_ids.len(),
            target_tokens_kept: t.target_tokens_kept(seq_len),
        };
        problems.push(Problem { line: t.line, issue });
    }
    problems
}

/// `text`, or its first [`SAMPLE_CHARS`] characters and how many more there were.
fn clipped(text: &str) -> String {
    match text.char_indices().nth(SAMPLE_CHARS) {
        None => text.to_owned(),
        Some((end, _)) => {
            let more = text[end..].chars().count();
            format!("{}… ({more} more characters)", &text[..end])
        }
    }
}

/// Min, median (mean of the middle two for an even count) and max; all zero for no rows.
fn length_stats(lengths: &[usize]) -> LengthStats {
    let mut sorted = lengths.to_vec();
    sorted.sort_unstable();
    let middle = sorted.len() / 2;
    let median = match (sorted.len() % 2, sorted.get(middle)) {
        (_, None) => 0.0,
        (1, Some(&m)) => m as f64,
        (_, Some(&upper)) => (sorted[middle - 1] + upper) as f64 / 2.0,
    };
    LengthStats { min: sorted.first().copied().unwrap_or(0), median, max: sorted.last().copied().unwrap_or(0) }
}

/// Counts per power-of-two bin, from 128 up to the first bound holding the longest row.
fn histogram(lengths: &[usize]) -> Vec<HistogramBin> {
    let longest = lengths.iter().copied().max().unwrap_or(0);
    let mut bins = Vec::new();
    let mut lower = 0;
    let mut up_to = FIRST_BUCKET;
    loop {
        let count = lengths.iter().filter(|&&len| len > lower && len <= up_to).count();
        bins.push(HistogramBin { up_to, count });
        if up_to >= longest {
            return bins;
        }
        lower = up_to;
        up_to = up_to.saturating_mul(2);
    }
}
