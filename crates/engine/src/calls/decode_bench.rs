//! `needle bench --decode`: how fast a model of a given shape answers, at each precision a model is
//! scored at, on a random-init model held in memory (no files). A turn is a prompt's pass and its
//! first token (`prefill_s`), then the rest of the asked tokens (`turn_s` for the whole call); rows
//! are timed as scoring answers them. Every run decodes exactly the asked number of tokens
//! ([`Until::Count`]): a random model's end tokens would make the figures a matter of chance.

use std::time::Instant;

use serde::Serialize;

use super::score::{cact_network, in_memory_cact, Precision, WeightsLoadError};
use crate::cact::synthetic::{placeholder_tokenizer_blob, random_checkpoint};
use crate::config::ModelConfig;
use crate::model::{Batch, Device, Forward, ModelError, Network, Params, Result, Until};
use crate::train::bench::peak_rss_bytes;

/// Rows a batched run decodes together, and the rows `rows_per_s` is timed over.
pub const BENCH_ROWS: usize = 16;

/// A precision the bench times, by the name `--precision` takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BenchPrecision {
    /// The weights as stored, in float, rows answered one at a time: scoring as it was before
    /// rows were decoded together.
    F32,
    /// The weights a `.cact` ships (W4 through CQ, dequantized to float) with 8-bit activations
    /// simulated ([`super::Precision::Simulated`]), rows decoded [`BENCH_ROWS`] at a time.
    Simulated,
    /// As the Needle engine runs a `.cact` ([`super::Precision::W4a8`]): the model built into a
    /// `.cact` in memory and run from the file's codes on the integer kernels, rows decoded
    /// [`BENCH_ROWS`] at a time. Its peak memory counts from the built `.cact` (see
    /// [`DecodeFigures::peak_rss_mb`]).
    W4a8,
}

impl BenchPrecision {
    pub const ALL: [BenchPrecision; 3] = [BenchPrecision::F32, BenchPrecision::Simulated, BenchPrecision::W4a8];

    /// The name `--precision` and the JSON give it.
    pub fn name(self) -> &'static str {
        match self {
            BenchPrecision::F32 => "f32",
            BenchPrecision::Simulated => "simulated",
            BenchPrecision::W4a8 => "w4a8",
        }
    }

    /// The precision called `name`.
    pub fn named(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.name() == name)
    }

    /// Rows decoded together when timing rows per second.
    pub fn batch(self) -> usize {
        match self {
            BenchPrecision::F32 => 1,
            BenchPrecision::Simulated | BenchPrecision::W4a8 => BENCH_ROWS,
        }
    }

    /// The network of `config` at this precision from random-init weights (W4A8's from a random
    /// checkpoint built into a `.cact` in memory, on the CPU whatever `device`), and for W4A8 the
    /// size of that `.cact`'s file in bytes.
    fn network(self, config: &ModelConfig, device: &Device) -> Result<(Network, Option<u64>)> {
        let params = match self {
            BenchPrecision::W4a8 => {
                let invalid = |e: WeightsLoadError| ModelError::InvalidConfig {
                    field: "bench",
                    reason: format!("the shape does not build into a .cact for W4A8: {e}"),
                };
                let checkpoint = random_checkpoint(config, false, 0)?;
                let tokenizer = placeholder_tokenizer_blob(config.vocab_size);
                let (cact, bytes) = in_memory_cact(&checkpoint, &tokenizer).map_err(invalid)?;
                let source = checkpoint.source.clone();
                // The checkpoint stands for the file a `.cact` is read from: what runs holds the
                // file's bytes, not the float weights they were built from.
                drop(checkpoint);
                return_freed_memory();
                restart_peak();
                let network = cact_network(&cact, &source, &Device::Cpu, Precision::W4a8).map_err(invalid)?;
                return Ok((network, Some(bytes)));
            }
            BenchPrecision::F32 | BenchPrecision::Simulated => Params::random_init(device),
        };
        // Building the network invents every weight; the precision's rounding then reads them.
        Network::load(config, &params)?;
        let params = match self {
            BenchPrecision::Simulated => params.through_cq()?.fake_quantizing(config)?,
            BenchPrecision::F32 | BenchPrecision::W4a8 => params,
        };
        Ok((Network::load(config, &params)?, None))
    }
}

/// One precision's figures (`needle bench --decode --json`'s `precisions`).
#[derive(Debug, Clone, Serialize)]
pub struct DecodeFigures {
    pub precision: BenchPrecision,
    /// One turn's prompt pass and first token.
    pub prefill_s: f64,
    /// The whole turn: the prompt and every asked token.
    pub turn_s: f64,
    /// New tokens per second of one stream after its first (one cached step each).
    pub decode_tokens_per_s: f64,
    /// [`BENCH_ROWS`] rows (prompts of the same length, each its own), each prefilled and decoded,
    /// per second of the whole run.
    pub rows_per_s: f64,
    /// Rows decoded together for `rows_per_s`.
    pub batch: usize,
    /// W4A8's: the size of the `.cact` it runs from, which its peak memory compares with.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cact_mb: Option<f64>,
    /// The process's peak resident memory once this precision has run (every precision run
    /// before it included: `--precision` runs one alone). W4A8's counts (where the system can
    /// restart the count: Linux) from the moment its built `.cact` is held in memory, as a file
    /// read in would be, without the random float checkpoint it was built from.
    pub peak_rss_mb: f64,
}

/// The shape of a decoding bench.
#[derive(Debug, Clone)]
pub struct DecodeBench {
    pub config: ModelConfig,
    pub prompt_tokens: usize,
    pub new_tokens: usize,
}

impl DecodeBench {
    /// Times one turn and a batch of rows at `precision`.
    pub fn run(&self, precision: BenchPrecision, device: &Device) -> Result<DecodeFigures> {
        let (prompt_tokens, new_tokens) = (self.prompt_tokens, self.new_tokens);
        let longest = self.config.max_seq_len.saturating_sub(1);
        if prompt_tokens == 0 || new_tokens == 0 || prompt_tokens + new_tokens > longest + 1 {
            return Err(ModelError::InvalidConfig {
                field: "bench",
                reason: format!(
                    "prompt {prompt_tokens}, new tokens {new_tokens}: use at least one of each, {} at most together \
                     (the shape's max_seq_len)",
                    self.config.max_seq_len
                ),
            });
        }
        let (network, cact_bytes) = precision.network(&self.config, device)?;
        let mut forward = Forward::new(network)?;
        let turn_start = Instant::now();
        let turn = decode(&mut forward, &[self.prompt(0)], new_tokens, 1)?.remove(0);
        let turn_s = turn_start.elapsed().as_secs_f64();
        let prompts: Vec<Vec<u32>> = (1..=BENCH_ROWS).map(|row| self.prompt(row)).collect();
        let rows_start = Instant::now();
        decode(&mut forward, &prompts, new_tokens, precision.batch())?;
        let rows_s = rows_start.elapsed().as_secs_f64();
        Ok(DecodeFigures {
            precision,
            prefill_s: turn.prefill_seconds,
            turn_s,
            decode_tokens_per_s: turn.ids.len().saturating_sub(1) as f64 / turn.decode_seconds.max(1e-9),
            rows_per_s: BENCH_ROWS as f64 / rows_s.max(1e-9),
            batch: precision.batch(),
            cact_mb: cact_bytes.map(|b| b as f64 / 1e6),
            peak_rss_mb: peak_bytes() as f64 / 1e6,
        })
    }

    /// Row `row`'s prompt: pseudo-random tokens past the control ids (the cost does not depend on
    /// their values), a different one per row.
    fn prompt(&self, row: usize) -> Vec<u32> {
        let vocab = self.config.vocab_size.max(21) - 20;
        (0..self.prompt_tokens).map(|i| 20 + ((i + 131 * row) * 7919 % vocab) as u32).collect()
    }
}

/// Hands the heap's free pages back to the system where the allocator keeps them (glibc keeps
/// freed blocks below its mmap threshold, so the dropped checkpoint would still count as resident).
fn return_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `malloc_trim` only releases memory the allocator holds free; it reads no pointer.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Restarts the count of the process's peak resident memory from what it holds now, where the
/// system can (Linux: `clear_refs`); elsewhere the peak stays the process's.
fn restart_peak() {
    #[cfg(target_os = "linux")]
    // Best effort: where it cannot be written, the peak is the process's, which only overstates.
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// The process's peak resident memory since [`restart_peak`] (Linux's `VmHWM`), else since it
/// started.
fn peak_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let high_water = status.lines().find_map(|line| line.strip_prefix("VmHWM:"));
    let kilobytes = high_water.and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok());
    kilobytes.map_or_else(peak_rss_bytes, |kb| kb * 1024)
}

/// Exactly `new_tokens` after each prompt, `size` rows at a time; completions in prompt order.
fn decode(
    forward: &mut Forward,
    prompts: &[Vec<u32>],
    new_tokens: usize,
    size: usize,
) -> Result<Vec<crate::model::Completion>> {
    let mut batch = Batch::new(size);
    let mut done = Vec::with_capacity(prompts.len());
    for (index, prompt) in prompts.iter().enumerate() {
        done.extend(batch.start(forward, index, prompt, None, new_tokens, Until::Count)?);
        while !batch.has_room() {
            done.extend(batch.step(forward)?);
        }
    }
    while !batch.is_empty() {
        done.extend(batch.step(forward)?);
    }
    done.sort_by_key(|(index, _)| *index);
    Ok(done.into_iter().map(|(_, completion)| completion).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::bench::preset;

    #[test]
    fn every_precision_decodes_exactly_the_asked_tokens_and_reports_its_figures() {
        let bench = DecodeBench { config: preset("tiny").unwrap(), prompt_tokens: 24, new_tokens: 6 };
        let mut forward =
            Forward::new(BenchPrecision::Simulated.network(&bench.config, &Device::Cpu).unwrap().0).unwrap();
        let prompts: Vec<Vec<u32>> = (0..5).map(|row| bench.prompt(row)).collect();
        assert_ne!(prompts[0], prompts[1], "each row its own prompt");
        for completion in decode(&mut forward, &prompts, bench.new_tokens, 3).unwrap() {
            assert_eq!(completion.ids.len(), 6, "{completion:?}");
        }
        for precision in BenchPrecision::ALL {
            let figures = bench.run(precision, &Device::Cpu).unwrap();
            assert_eq!((figures.precision, figures.batch), (precision, precision.batch()));
            assert_eq!(figures.cact_mb.is_some_and(|mb| mb > 0.0), precision == BenchPrecision::W4a8, "{figures:?}");
            for (what, value) in [
                ("prefill_s", figures.prefill_s),
                ("turn_s", figures.turn_s),
                ("decode_tokens_per_s", figures.decode_tokens_per_s),
                ("rows_per_s", figures.rows_per_s),
            ] {
                assert!(value.is_finite() && value > 0.0, "{precision:?} {what}: {value}");
            }
            assert!(figures.turn_s >= figures.prefill_s, "{figures:?}");
        }
        let too_long = DecodeBench { prompt_tokens: bench.config.max_seq_len, ..bench };
        assert!(matches!(too_long.run(BenchPrecision::F32, &Device::Cpu), Err(ModelError::InvalidConfig { .. })));
    }
}
