//! Token ids and loss masks, as the reference's `_encode` and `fit_max_len` compute them.

use super::{render, Example};
use crate::tokenizer::{Tokenizer, BOS_ID, EOS_ID, PAD_ID};

/// The smallest sequence length `fit_max_len` picks; it doubles from here.
pub(super) const FIRST_BUCKET: usize = 128;

/// An example's prompt and target, each tokenized once.
#[derive(Debug, Clone, PartialEq)]
pub struct Tokenized {
    /// 1-based line of the example in its file.
    pub line: usize,
    pub prompt_ids: Vec<u32>,
    pub target_ids: Vec<u32>,
}

/// One training row of exactly `max_len` positions.
#[derive(Debug, Clone, PartialEq)]
pub struct Encoded {
    pub ids: Vec<u32>,
    /// 1.0 where the loss counts (target tokens and EOS), 0.0 on BOS, prompt and padding.
    pub mask: Vec<f32>,
    /// Whether the end of the example was cut off to fit.
    pub truncated: bool,
}

impl Tokenized {
    /// Renders `example` and tokenizes its prompt and target separately, as the reference does
    /// (so no token spans the boundary between them).
    pub fn new(tokenizer: &Tokenizer, example: &Example) -> Self {
        let (prompt, target) = render(example);
        Tokenized { line: example.line, prompt_ids: tokenizer.encode(&prompt), target_ids: tokenizer.encode(&target) }
    }

    /// Length of the full row before truncation or padding: BOS + prompt + target + EOS.
    pub fn sequence_len(&self) -> usize {
        self.prompt_ids.len() + self.target_ids.len() + 2
    }

    /// BOS + prompt + target + EOS, cut to `max_len` or padded to it with PAD.
    pub fn encode(&self, max_len: usize) -> Encoded {
        let unmasked = 1 + self.prompt_ids.len();
        let full_len = self.sequence_len();
        let mut ids = Vec::with_capacity(full_len.max(max_len));
        ids.push(BOS_ID);
        ids.extend_from_slice(&self.prompt_ids);
        ids.extend_from_slice(&self.target_ids);
        ids.push(EOS_ID);
        let mut mask: Vec<f32> = (0..full_len).map(|i| if i < unmasked { 0.0 } else { 1.0 }).collect();
        ids.resize(max_len, PAD_ID);
        mask.resize(max_len, 0.0);
        Encoded { ids, mask, truncated: full_len > max_len }
    }

    /// Its training row in a run of sequence length `seq_len`: cut to it but not padded (batches
    /// pad to their own longest row).
    pub fn row(&self, seq_len: usize) -> Encoded {
        self.encode(self.sequence_len().min(seq_len))
    }

    /// Positions whose loss counts in [`Self::row`]: the target and EOS that fit.
    pub fn scored_positions(&self, seq_len: usize) -> usize {
        self.sequence_len().min(seq_len).saturating_sub(1 + self.prompt_ids.len())
    }

    /// How many target tokens survive in a row of `max_len` positions.
    pub fn target_tokens_kept(&self, max_len: usize) -> usize {
        max_len.saturating_sub(1 + self.prompt_ids.len()).min(self.target_ids.len())
    }
}

/// The reference's sequence length for a dataset whose longest row is `longest` tokens: the
/// smallest power-of-two multiple of 128 that holds it, but never more than `cap` (`--max-len`).
pub fn fit_max_len(longest: usize, cap: usize) -> usize {
    let limit = longest.min(cap);
    let mut bucket = FIRST_BUCKET;
    while bucket < limit {
        bucket = bucket.saturating_mul(2);
    }
    bucket.min(cap)
}
