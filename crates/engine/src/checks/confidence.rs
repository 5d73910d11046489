//! The decode probability of an answer, the turn's confidence until a trained confidence head
//! gives one: the lowest probability greedy decoding gave a token of its `<tool_call>` block when
//! it makes a call (one unsure token is enough to make a call wrong), else the geometric mean over
//! all its tokens (a refusal is as sure as its words are on the whole).

use crate::dataset::{TOOL_CALL_END, TOOL_CALL_START};
use crate::model::Completion;
use crate::tokenizer::Tokenizer;

/// `completion`'s decode probability; `calls` says whether its answer makes a call. An answer of
/// no tokens is the empty product, 1.
pub fn decode_probability(tokenizer: &Tokenizer, completion: &Completion, calls: bool) -> f64 {
    let probabilities = &completion.probabilities;
    let block = match calls {
        true => call_tokens(tokenizer, &completion.ids),
        false => None,
    };
    match block {
        Some(range) => probabilities[range].iter().copied().fold(1f32, f32::min).into(),
        None if probabilities.is_empty() => 1.0,
        None => {
            let log_sum: f64 = probabilities.iter().map(|&p| f64::from(p).ln()).sum();
            (log_sum / probabilities.len() as f64).exp()
        }
    }
}

/// The tokens whose text overlaps the answer's tool-call block, from `<tool_call>` to the end of
/// `</tool_call>` (or of the answer, when the block is not closed); `None` when there is no block.
fn call_tokens(tokenizer: &Tokenizer, ids: &[u32]) -> Option<std::ops::Range<usize>> {
    let text = tokenizer.decode(ids);
    let start = text.find(TOOL_CALL_START)?;
    let end = text[start..].find(TOOL_CALL_END).map_or(text.len(), |at| start + at + TOOL_CALL_END.len());
    // Where each token's text ends: the length of the text decoded up to it.
    let ends: Vec<usize> = (1..=ids.len()).map(|n| tokenizer.decode(&ids[..n]).len()).collect();
    let first = ends.iter().position(|&e| e > start)?;
    let last = ends.iter().position(|&e| e >= end).unwrap_or(ids.len() - 1);
    (first <= last).then_some(first..last + 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::fixture;
    use crate::model::Stop;

    fn completion(tokenizer: &Tokenizer, pieces: &[(&str, f32)]) -> Completion {
        let (mut ids, mut probabilities) = (Vec::new(), Vec::new());
        for (text, p) in pieces {
            let piece = tokenizer.encode(text);
            probabilities.extend(std::iter::repeat_n(*p, piece.len()));
            ids.extend(piece);
        }
        Completion {
            ids,
            probabilities,
            stop: Stop::EndOfTurn,
            prompt_tokens: 0,
            prefill_seconds: 0.0,
            decode_seconds: 0.0,
        }
    }

    #[test]
    fn a_call_is_as_sure_as_its_least_sure_token_and_a_refusal_its_mean() {
        let tokenizer = Tokenizer::load(&fixture("models/tokenizer.model")).unwrap();
        // The reasoning's 0.1 is outside the block and does not count against the call.
        let call = completion(
            &tokenizer,
            &[
                ("<think>hmm</think>\n", 0.1),
                ("<tool_call>[{\"name\":\"a\",", 0.9),
                ("\"arguments\":{}}]", 0.6),
                ("</tool_call>", 0.8),
                ("<|im_end|>", 0.05),
            ],
        );
        assert_eq!(decode_probability(&tokenizer, &call, true), 0.6f32 as f64);
        let refusal = completion(&tokenizer, &[("<tool_call>[]</tool_call>", 0.5)]);
        assert!((decode_probability(&tokenizer, &refusal, false) - 0.5).abs() < 1e-6);
        let mixed = Completion { probabilities: vec![0.25, 1.0], ids: vec![5, 6], ..refusal };
        assert!((decode_probability(&tokenizer, &mixed, false) - 0.5).abs() < 1e-6, "the geometric mean of 0.25 and 1");
        let empty = Completion { probabilities: vec![], ids: vec![], ..mixed };
        assert_eq!(decode_probability(&tokenizer, &empty, false), 1.0);
    }
}
