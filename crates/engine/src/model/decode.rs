//! Greedy decoding with a key/value cache, as the reference's `generate_cached`: the prompt is
//! prefilled in one pass, then each new token is one step over the cached keys. What a step needs
//! besides the cache — the engram n-gram history and the convolution's taps — is recomputed from
//! the last [`EngramGeometry::window`](super::san::engram::EngramGeometry::window) tokens. Steps run on
//! the path a [`Forward`] holds: the hand-written CPU one, or candle's (every device).

use std::time::Instant;

use serde::Serialize;

use super::forward::{Decoding, Forward};
use super::{Network, Result};
use crate::tokenizer::{EOS_ID, IM_END_ID};

/// A prompt prefix already run through the network: prompts that begin with it continue from its
/// cached keys instead of running it again (an app's tools prompt, answered for many queries).
#[derive(Debug, Clone)]
pub struct Prefilled {
    state: Decoding,
}

/// Why decoding stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Stop {
    /// The model produced EOS (not part of the output).
    Eos,
    /// The model closed its turn with `<|im_end|>` (the last token of the output).
    EndOfTurn,
    /// The output reached the requested number of new tokens.
    MaxNewTokens,
    /// The sequence reached the model's `max_seq_len`.
    MaxLength,
}

/// A decoded continuation and how long it took.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Completion {
    /// The new tokens (the prompt not included).
    pub ids: Vec<u32>,
    /// Each new token's probability under the softmax of the step that picked it: what an
    /// answer's decode probability is made of (see `checks::confidence`).
    #[serde(skip)]
    pub probabilities: Vec<f32>,
    pub stop: Stop,
    /// Prompt tokens decoding started from (after the cut to `max_seq_len − 1`).
    pub prompt_tokens: usize,
    /// The prompt's single forward pass.
    pub prefill_seconds: f64,
    /// The steps after it, one per new token but the first.
    pub decode_seconds: f64,
}

impl Completion {
    /// New tokens per second of the whole run, prefill included.
    pub fn tokens_per_s(&self) -> f64 {
        self.ids.len() as f64 / (self.prefill_seconds + self.decode_seconds).max(1e-9)
    }
}

impl Network {
    /// Greedy continuation of `prompt` (token ids, BOS first): at most `max_new_tokens` tokens,
    /// stopping after `<|im_end|>`, before EOS, or at the model's `max_seq_len`.
    pub fn generate(&self, prompt: &[u32], max_new_tokens: usize) -> Result<Completion> {
        Forward::new(self.clone())?.generate_from(None, prompt, max_new_tokens)
    }
}

impl Forward {
    /// Runs `prefix` through the network once, for [`Forward::generate_from`].
    pub fn prefill(&mut self, prefix: &[u32]) -> Result<Prefilled> {
        let mut state = self.decode_state()?;
        let max_prefix = self.network().config().max_seq_len.max(2) - 1;
        self.decode_step(&prefix[..prefix.len().min(max_prefix)], &mut state)?;
        Ok(Prefilled { state })
    }

    /// [`Network::generate`], continuing from `prefilled` when the prompt begins with its tokens
    /// (and has more of its own).
    pub fn generate_from(
        &mut self,
        prefilled: Option<&Prefilled>,
        prompt: &[u32],
        max_new_tokens: usize,
    ) -> Result<Completion> {
        let mut batch = Batch::new(1);
        if let Some((_, completion)) = batch.start(self, 0, prompt, prefilled, max_new_tokens, Until::End)? {
            return Ok(completion);
        }
        loop {
            if let Some((_, completion)) = batch.step(self)?.pop() {
                return Ok(completion);
            }
        }
    }
}

/// Where a row's decoding may stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Until {
    /// Before EOS, after `<|im_end|>`, at the asked number of new tokens or at the model's
    /// `max_seq_len`: an answer.
    End,
    /// At the asked number of new tokens or the model's `max_seq_len` only: a benchmark's run,
    /// which must decode exactly what it was asked to time.
    Count,
}

/// Greedy decoding of many prompts together: up to `size` rows at a time, each step one new token
/// of every row in one pass (on the CPU path, so that every weight is read once per step for all
/// of them, not once per row); a row that stops leaves the batch, and a new prompt can take its
/// place. Each row decodes exactly the tokens [`Forward::generate_from`] gives it alone: the rows
/// share the pass, never their keys. A row's `decode_seconds` is its share of the steps it was in.
#[derive(Debug)]
pub struct Batch {
    size: usize,
    rows: Vec<Row>,
}

/// One row of a [`Batch`]: its decoding state, what it has decoded, and the token to run next.
#[derive(Debug)]
struct Row {
    index: usize,
    state: Decoding,
    prompt_tokens: usize,
    /// The row's length at which it must stop (the prompt, the new tokens asked, `max_seq_len`).
    max_len: usize,
    max_new_tokens: usize,
    until: Until,
    ids: Vec<u32>,
    probabilities: Vec<f32>,
    prefill_seconds: f64,
    decode_seconds: f64,
}

impl Row {
    /// Takes the token a step picked: `Some(why)` when the row stops here, else the token is the
    /// row's and the next step runs it. Each limit is checked before the next step, so no step is
    /// computed for nothing.
    fn take(&mut self, next: u32, probability: f32) -> Option<Stop> {
        let ends = self.until == Until::End;
        if ends && next == EOS_ID {
            return Some(Stop::Eos);
        }
        if self.prompt_tokens + self.ids.len() >= self.max_len {
            return Some(Stop::MaxLength);
        }
        self.ids.push(next);
        self.probabilities.push(probability);
        if ends && next == IM_END_ID {
            return Some(Stop::EndOfTurn);
        }
        if self.ids.len() == self.max_new_tokens {
            return Some(Stop::MaxNewTokens);
        }
        if self.prompt_tokens + self.ids.len() >= self.max_len {
            return Some(Stop::MaxLength);
        }
        None
    }

    fn finish(self, stop: Stop) -> (usize, Completion) {
        let completion = Completion {
            ids: self.ids,
            probabilities: self.probabilities,
            stop,
            prompt_tokens: self.prompt_tokens,
            prefill_seconds: self.prefill_seconds,
            decode_seconds: self.decode_seconds,
        };
        (self.index, completion)
    }
}

impl Batch {
    /// A batch of at most `size` rows (at least one).
    pub fn new(size: usize) -> Self {
        Self { size: size.max(1), rows: Vec::new() }
    }

    /// Whether a row can join.
    pub fn has_room(&self) -> bool {
        self.rows.len() < self.size
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Prefills `prompt` (token ids, BOS first; continuing from `prefilled` when it begins with
    /// its tokens and has more of its own) as row `index`, which joins the batch; `Some` with its
    /// completion when it stops at its first token. As the reference: the prompt keeps at most
    /// `max_seq_len − 1` tokens, leaving room for one.
    pub fn start(
        &mut self,
        forward: &mut Forward,
        index: usize,
        prompt: &[u32],
        prefilled: Option<&Prefilled>,
        max_new_tokens: usize,
        until: Until,
    ) -> Result<Option<(usize, Completion)>> {
        let max_seq_len = forward.network().config().max_seq_len.max(2);
        let prompt = &prompt[..prompt.len().min(max_seq_len - 1)];
        let continues = |p: &&Prefilled| {
            let seen = p.state.history();
            seen.len() < prompt.len() && prompt.starts_with(seen)
        };
        let mut state = match prefilled.filter(continues) {
            Some(prefilled) => prefilled.state.clone(),
            None => forward.decode_state()?,
        };
        let start = Instant::now();
        let new = &prompt[state.history().len()..];
        let (next, probability) = forward.decode_step(new, &mut state)?;
        let mut row = Row {
            index,
            state,
            prompt_tokens: prompt.len(),
            max_len: max_seq_len.min(prompt.len() + max_new_tokens),
            max_new_tokens,
            until,
            ids: Vec::new(),
            probabilities: Vec::new(),
            prefill_seconds: start.elapsed().as_secs_f64(),
            decode_seconds: 0.0,
        };
        Ok(match row.take(next, probability) {
            Some(stop) => Some(row.finish(stop)),
            None => {
                self.rows.push(row);
                None
            }
        })
    }

    /// One new token of every row, in one pass; the rows that stop with it leave the batch and are
    /// returned with their completions.
    pub fn step(&mut self, forward: &mut Forward) -> Result<Vec<(usize, Completion)>> {
        if self.rows.is_empty() {
            return Ok(Vec::new());
        }
        let start = Instant::now();
        let last: Vec<[u32; 1]> = self.rows.iter().map(|row| [*row.ids.last().expect("a row holds a token")]).collect();
        let new: Vec<&[u32]> = last.iter().map(|t| t.as_slice()).collect();
        let mut states: Vec<&mut Decoding> = self.rows.iter_mut().map(|row| &mut row.state).collect();
        let picked = forward.decode_steps(&new, &mut states)?;
        let share = start.elapsed().as_secs_f64() / self.rows.len() as f64;
        let mut finished = Vec::new();
        let mut kept = Vec::with_capacity(self.rows.len());
        for (mut row, (next, probability)) in self.rows.drain(..).zip(picked) {
            row.decode_seconds += share;
            match row.take(next, probability) {
                Some(stop) => finished.push(row.finish(stop)),
                None => kept.push(row),
            }
        }
        self.rows = kept;
        Ok(finished)
    }
}

#[cfg(test)]
mod tests {

    use candle_core::{Device, Tensor};

    use super::*;
    use crate::checkpoint::Checkpoint;
    use crate::model::kernels::RopeTables;
    use crate::model::san::decode::pick;
    use crate::model::Params;
    use crate::tokenizer::{Tokenizer, BOS_ID};

    use crate::fixtures::{checkpoint_path, fixture};

    fn network(stem: &str) -> Network {
        let checkpoint = Checkpoint::load(&checkpoint_path(stem)).unwrap();
        Network::from_checkpoint(&checkpoint, &Device::Cpu).unwrap()
    }

    /// The same greedy tokens from a full forward pass over the whole sequence at every step.
    fn recomputed(network: &Network, prompt: &[u32], steps: usize) -> Vec<u32> {
        let mut ids = prompt.to_vec();
        let mut out = Vec::new();
        for _ in 0..steps {
            let logits = network.forward(&Tensor::new(ids.as_slice(), &Device::Cpu).unwrap().unsqueeze(0).unwrap());
            let last = logits.unwrap().squeeze(0).unwrap().get(ids.len() - 1).unwrap();
            let next = pick(&last.to_vec1::<f32>().unwrap()).0;
            out.push(next);
            ids.push(next);
        }
        out
    }

    #[test]
    fn cached_steps_match_a_full_recompute_token_for_token() {
        // tiny_f32 has engram sites, several lanes and grouped-query heads; pretrained is the model
        // the goldens decode with; the Needle 3 ones have Q/K/V taps and windows shorter than the row.
        for stem in ["tiny_f32", "pretrained", "needle3_tiny", "needle3_tiny_out"] {
            let network = network(stem);
            let prompt = [BOS_ID, 40, 41, 7, 300, 12, 99, 5, 8, 77, 31, 200];
            let steps = 24;
            let want = recomputed(&network, &prompt, steps);
            // No stop tokens in the way: compare up to where either stops.
            let got = network.generate(&prompt, steps).unwrap();
            let n = got.ids.len();
            assert!(n > 0, "{stem}: nothing decoded");
            assert_eq!(got.ids, want[..n], "{stem}");
            if got.stop == Stop::Eos {
                assert_eq!(want[n], EOS_ID, "{stem}");
            }
        }
    }

    #[test]
    fn greedy_tokens_match_the_reference_generate_cached() {
        let golden: serde_json::Value =
            serde_json::from_slice(&std::fs::read(fixture("golden/pretrained/generate_cached.json")).unwrap()).unwrap();
        let tokenizer = Tokenizer::load(&fixture("models/tokenizer.model")).unwrap();
        let network = network("pretrained");
        let max_new = golden["max_new_tokens"].as_u64().unwrap() as usize;
        let ids = |v: &serde_json::Value| -> Vec<u32> { serde_json::from_value(v.clone()).unwrap() };
        let cases = golden["cases"].as_array().unwrap();
        assert!(cases.len() >= 4);
        for case in cases {
            let prompt = ids(&case["prompt_ids"]);
            let encoded: Vec<u32> =
                std::iter::once(BOS_ID).chain(tokenizer.encode(case["prompt"].as_str().unwrap())).collect();
            assert_eq!(encoded, prompt, "the prompt tokenizes as the reference's");
            let want = ids(&case["ids"]);
            let got = network.generate(&prompt, max_new).unwrap();
            // The reference stops at EOS only; ours also after <|im_end|>.
            let n = got.ids.len();
            assert_eq!(got.ids, want[..n.min(want.len())], "{}", case["text"]);
            match got.stop {
                Stop::EndOfTurn => assert_eq!(got.ids.last(), Some(&IM_END_ID)),
                _ => assert_eq!(n, want.len(), "{}", case["text"]),
            }
        }
    }

    #[test]
    fn needle3_greedy_tokens_match_the_reference_generate_as_stored_and_at_w4() {
        for stem in ["needle3_tiny", "needle3_tiny_out"] {
            let golden: serde_json::Value =
                serde_json::from_slice(&std::fs::read(fixture(&format!("golden/{stem}/decode.json"))).unwrap())
                    .unwrap();
            let checkpoint = Checkpoint::load(&checkpoint_path(stem)).unwrap();
            let load = |params: Params| Network::load(&checkpoint.config, &params).unwrap();
            let stored = load(Params::from_checkpoint(&checkpoint, &Device::Cpu).unwrap());
            let w4 = load(Params::from_checkpoint(&checkpoint, &Device::Cpu).unwrap().through_cq().unwrap());
            let max_new = golden["max_new_tokens"].as_u64().unwrap() as usize;
            let ids = |v: &serde_json::Value| -> Vec<u32> { serde_json::from_value(v.clone()).unwrap() };
            for case in golden["cases"].as_array().unwrap() {
                let prompt = ids(&case["prompt_ids"]);
                for (network, key) in [(&stored, "ids"), (&w4, "ids_w4")] {
                    let want = ids(&case[key]);
                    let got = network.generate(&prompt, max_new).unwrap();
                    // The reference stops at EOS only; ours also after <|im_end|>.
                    let n = got.ids.len();
                    assert_eq!(got.ids, want[..n.min(want.len())], "{stem} {key}, prompt of {}", prompt.len());
                    if got.stop != Stop::EndOfTurn {
                        assert_eq!(n, want.len(), "{stem} {key}");
                    }
                }
            }
        }
    }

    #[test]
    fn both_paths_decode_the_same_tokens_and_a_prefilled_prefix_changes_none() {
        let network = network("tiny_f32");
        let mut paths = [Forward::new(network.clone()).unwrap(), Forward::Candle(network.clone())];
        assert!(paths[0].hand_written());
        let prefix: Vec<u32> = std::iter::once(BOS_ID).chain((0..30).map(|i| 20 + i % 40)).collect();
        let tails = [vec![7u32, 300, 12], vec![99, 5, 8, 77, 31, 200, 6]];
        let want: Vec<Completion> = tails
            .iter()
            .map(|tail| paths[1].generate_from(None, &[prefix.as_slice(), tail].concat(), 12).unwrap())
            .collect();
        for forward in &mut paths {
            let prefilled = forward.prefill(&prefix).unwrap();
            for (tail, want) in tails.iter().zip(&want) {
                let prompt = [prefix.as_slice(), tail].concat();
                for from in [None, Some(&prefilled)] {
                    let got = forward.generate_from(from, &prompt, 12).unwrap();
                    assert_eq!((&got.ids, got.stop), (&want.ids, want.stop));
                }
            }
            // A prompt that does not begin with the prefix, or is no longer than it, starts afresh.
            for prompt in [vec![BOS_ID, 40, 41, 7], prefix.clone()] {
                let fresh = forward.generate_from(None, &prompt, 5).unwrap().ids;
                assert_eq!(forward.generate_from(Some(&prefilled), &prompt, 5).unwrap().ids, fresh);
            }
        }
    }

    /// Every prompt through one batch of `size`, starting each from `prefilled`; completions by index.
    fn batched(
        forward: &mut Forward,
        prompts: &[(Vec<u32>, usize)],
        prefilled: Option<&Prefilled>,
        size: usize,
        until: Until,
    ) -> Vec<Completion> {
        let mut batch = Batch::new(size);
        let mut got: Vec<Option<Completion>> = vec![None; prompts.len()];
        let mut keep = |done: Vec<(usize, Completion)>| done.into_iter().for_each(|(i, c)| got[i] = Some(c));
        for (index, (prompt, budget)) in prompts.iter().enumerate() {
            keep(batch.start(forward, index, prompt, prefilled, *budget, until).unwrap().into_iter().collect());
            while !batch.has_room() {
                keep(batch.step(forward).unwrap());
            }
        }
        while !batch.is_empty() {
            keep(batch.step(forward).unwrap());
        }
        got.into_iter().map(|c| c.expect("every row finishes")).collect()
    }

    #[test]
    fn a_batch_decodes_every_row_as_it_decodes_alone() {
        // Rows of different lengths and budgets, more than the batch holds: rows leave as they stop
        // and the next take their place; some continue a shared prefix, one is shorter than it.
        for stem in ["tiny_f32", "pretrained", "needle3_tiny", "needle3_tiny_out"] {
            let mut forward = Forward::new(network(stem)).unwrap();
            assert!(forward.hand_written(), "{stem}");
            let prefix: Vec<u32> = std::iter::once(BOS_ID).chain((0..30).map(|i| 20 + i % 40)).collect();
            let prompts: Vec<(Vec<u32>, usize)> = (0..7u32)
                .map(|r| {
                    let tail = (0..3 + 2 * r).map(|i| 40 + (i * 7 + r * 13) % 260);
                    let prompt = match r {
                        5 => vec![BOS_ID, 41, 300 + r],
                        _ => prefix.iter().copied().chain(tail).collect(),
                    };
                    (prompt, [12, 3, 20, 1, 16, 9, 24][r as usize])
                })
                .collect();
            let alone: Vec<Completion> =
                prompts.iter().map(|(prompt, budget)| forward.generate_from(None, prompt, *budget).unwrap()).collect();
            let prefilled = forward.prefill(&prefix).unwrap();
            for (size, from) in [(3, None), (4, Some(&prefilled)), (16, Some(&prefilled))] {
                let got = batched(&mut forward, &prompts, from, size, Until::End);
                for (row, (got, want)) in got.iter().zip(&alone).enumerate() {
                    let at = format!("{stem}, batch of {size}, row {row}");
                    assert_eq!(
                        (&got.ids, got.stop, got.prompt_tokens),
                        (&want.ids, want.stop, want.prompt_tokens),
                        "{at}"
                    );
                    for (p, q) in got.probabilities.iter().zip(&want.probabilities) {
                        assert!((p - q).abs() <= 1e-5, "{at}: probability {p} batched, {q} alone");
                    }
                }
            }
        }
    }

    #[test]
    fn a_counted_run_decodes_exactly_the_asked_tokens_past_an_end() {
        // pretrained closes its turn after a few dozen tokens on the goldens' prompts: counted, it
        // goes on.
        let golden: serde_json::Value =
            serde_json::from_slice(&std::fs::read(fixture("golden/pretrained/generate_cached.json")).unwrap()).unwrap();
        let prompt: Vec<u32> = serde_json::from_value(golden["cases"][0]["prompt_ids"].clone()).unwrap();
        let mut forward = Forward::new(network("pretrained")).unwrap();
        let ended = forward.generate_from(None, &prompt, 64).unwrap();
        let counted = batched(&mut forward, &[(prompt.clone(), 64), (prompt, 5)], None, 2, Until::Count);
        assert_eq!((counted[0].ids.len(), counted[0].stop), (64, Stop::MaxNewTokens));
        assert_eq!((counted[1].ids.len(), counted[1].stop), (5, Stop::MaxNewTokens));
        let n = ended.ids.len();
        assert!(n < 64 && matches!(ended.stop, Stop::Eos | Stop::EndOfTurn), "{ended:?}");
        assert_eq!(counted[0].ids[..n], ended.ids[..], "the same tokens up to where the answer ends");
    }

    #[test]
    fn rotary_tables_grow_with_what_is_decoded_not_with_max_seq_len() {
        // 2^24 positions of tables would take 1.6 GB for tiny_f32's heads before the first token.
        for stem in ["tiny_f32", "needle3_tiny"] {
            let mut checkpoint = Checkpoint::load(&checkpoint_path(stem)).unwrap();
            checkpoint.config.max_seq_len = 1 << 24;
            let network = Network::from_checkpoint(&checkpoint, &Device::Cpu).unwrap();
            // Past the first tables' 512 positions, so the prefill grows them.
            let prompt: Vec<u32> = std::iter::once(BOS_ID).chain((0..700).map(|i| 20 + i % 50)).collect();
            let want = recomputed(&network, &prompt, 3);
            for mut forward in [Forward::new(network.clone()).unwrap(), Forward::Candle(network.clone())] {
                let prefilled = forward.prefill(&prompt).unwrap();
                let positions = match &prefilled.state {
                    Decoding::Cpu(state) => state.rope_positions(),
                    Decoding::Candle(state) => state.rope_positions,
                };
                assert_eq!(positions, 1024, "{stem}: doubled from 512 to hold 701 positions");
                let got = forward.generate_from(None, &prompt, 3).unwrap();
                assert_eq!(got.ids, want[..got.ids.len()], "{stem}");
            }
        }
        assert_eq!(RopeTables::decode_capacity(0, 1, 100), 100, "never past max_seq_len unless asked");
        assert_eq!(RopeTables::decode_capacity(512, 513, 1 << 24), 1024);
        assert_eq!(RopeTables::decode_capacity(1024, 700, 1 << 24), 1024);
    }

    #[test]
    fn a_picked_token_comes_with_its_softmax_probability() {
        assert_eq!(pick(&[0.0, 2.0, 2.0, -1.0]), (1, (1.0 / (2.0 + (-2f64).exp() + (-3f64).exp())) as f32));
        assert_eq!(pick(&[5.0]), (0, 1.0));
        let network = network("tiny_f32");
        let got = network.generate(&[BOS_ID, 40, 41, 7, 300], 6).unwrap();
        assert_eq!(got.probabilities.len(), got.ids.len());
        assert!(got.probabilities.iter().all(|p| (0.0..=1.0).contains(p) && *p > 0.0), "{:?}", got.probabilities);
    }

    #[test]
    fn decoding_stops_at_the_model_length_and_the_requested_count() {
        let network = network("tiny_f32");
        let max_seq_len = network.config().max_seq_len;
        let long: Vec<u32> = std::iter::once(BOS_ID).chain((0..max_seq_len as u32 + 10).map(|i| 20 + i % 50)).collect();
        let got = network.generate(&long, 8).unwrap();
        assert_eq!(got.prompt_tokens, max_seq_len - 1, "the prompt is cut to leave room for one token");
        assert!(got.ids.len() <= 1 && matches!(got.stop, Stop::MaxLength | Stop::Eos | Stop::EndOfTurn), "{got:?}");
        let short = network.generate(&[BOS_ID, 40, 41], 3).unwrap();
        assert!(short.ids.len() <= 3);
        assert!(short.tokens_per_s() > 0.0 || short.ids.is_empty());
    }
}
