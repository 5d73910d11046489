//! The summary `needle data --json` prints and the app shows before a run.

use super::encode::FIRST_BUCKET;
use super::{render, Dataset, Issue, Problem, Tokenized};
use serde::Serialize;

/// How many rendered examples the report shows.
const SAMPLE_COUNT: usize = 3;

#[derive(Debug, Clone, Serialize)]
pub struct DatasetReport {
    pub path: String,
    pub usable_examples: usize,
    /// Lines left out of training (each has a problem saying why).
    pub skipped_lines: usize,
    /// Every problem, reading and truncation, in line order.
    pub problems: Vec<Problem>,
    /// Row lengths (BOS + prompt + target + EOS) before truncation.
    pub token_lengths: LengthStats,
    pub histogram: Vec<HistogramBin>,
    /// The `--max-len` the sequence length was fitted under.
    pub cap: usize,
    pub seq_len: usize,
    pub truncated: usize,
    /// The first few examples as the model will see them.
    pub samples: Vec<Sample>,
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
    pub prompt: String,
    pub target: String,
    pub tokens: usize,
    /// The example's tools and query as they were written, to try a model with.
    pub tools: String,
    pub query: String,
}

impl DatasetReport {
    /// `tokenized` holds `dataset.examples` in order, tokenized; `seq_len` was fitted under `cap`.
    pub(super) fn new(dataset: &Dataset, tokenized: &[Tokenized], cap: usize, seq_len: usize) -> Self {
        let mut problems = dataset.problems.clone();
        problems.extend(truncation_problems(tokenized, seq_len));
        // Stable: a line's reading problems stay ahead of its truncation.
        problems.sort_by_key(|problem| problem.line);
        let lengths: Vec<usize> = tokenized.iter().map(Tokenized::sequence_len).collect();
        let samples = dataset
            .examples
            .iter()
            .zip(&lengths)
            .take(SAMPLE_COUNT)
            .map(|(example, &tokens)| {
                let (prompt, target) = render(example);
                let (tools, query) = (example.tools.clone(), example.query.clone());
                Sample { line: example.line, prompt, target, tokens, tools, query }
            })
            .collect();
        DatasetReport {
            path: dataset.path.display().to_string(),
            usable_examples: dataset.examples.len(),
            skipped_lines: dataset.problems.iter().filter(|p| p.issue.skips_example()).count(),
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

fn truncation_problems(tokenized: &[Tokenized], seq_len: usize) -> impl Iterator<Item = Problem> + '_ {
    tokenized.iter().filter(move |t| t.sequence_len() > seq_len).map(move |t| Problem {
        line: t.line,
        issue: Issue::Truncated {
            tokens: t.sequence_len(),
            seq_len,
            target_tokens: t.target_ids.len(),
            target_tokens_kept: t.target_tokens_kept(seq_len),
        },
    })
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
