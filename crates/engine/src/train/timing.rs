//! What a run's time is made of, for the plan's estimate ([`super::Session::time_run`]).
//!
//! A pass's work is counted in the multiply-adds of its matrix products, which is where the time
//! goes: packed tokens through the projections (a shared prefix counted once), query–key pairs
//! through attention, scored positions through the vocabulary. A timed training step turns work
//! into seconds; every batch of the run (their order is known from the seed), the validation
//! passes and the held-out scoring are then counted the same way, so the estimate follows how
//! much each batch shares, how long its rows are and how much of them is scored.

use crate::config::ModelConfig;
use crate::model::packing::Packing;

/// The size of one or more passes.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Workload {
    pub tokens: f64,
    pub pairs: f64,
    pub scored: f64,
}

impl Workload {
    pub fn of(packing: &Packing) -> Self {
        Self {
            tokens: packing.len() as f64,
            pairs: packing.attention_pairs() as f64,
            scored: packing.scored().positions.len() as f64,
        }
    }

    /// Multiply-adds of a forward pass.
    pub fn forward(&self, cfg: &ModelConfig) -> f64 {
        let (tokens, pairs, scored) = per_unit(cfg);
        self.tokens * tokens + self.pairs * pairs + self.scored * scored
    }

    /// Multiply-adds of a training step: the forward; the backward's input gradients (as many
    /// again: no weight gradient for the frozen base), and attention's five products to its two.
    pub fn training(&self, cfg: &ModelConfig) -> f64 {
        let (tokens, pairs, scored) = per_unit(cfg);
        2.0 * self.tokens * tokens + 3.5 * self.pairs * pairs + 2.0 * self.scored * scored
    }
}

impl std::ops::AddAssign for Workload {
    fn add_assign(&mut self, other: Self) {
        self.tokens += other.tokens;
        self.pairs += other.pairs;
        self.scored += other.scored;
    }
}

/// Forward multiply-adds per packed token, per query–key pair and per scored position.
fn per_unit(cfg: &ModelConfig) -> (f64, f64, f64) {
    let (d, attn, kv, lanes) = (cfg.d_model, cfg.resolved_attn_dim(), cfg.kv_dim(), cfg.mhc_lanes);
    let layers = cfg.num_layers as f64;
    let projections = d * (2 * attn + 2 * kv) + attn * d;
    let lane_gates = lanes * d * (2 * lanes + lanes * lanes);
    let token = layers * (projections + lane_gates) as f64;
    // q·k and p·v over every head: twice the attention width per pair and layer.
    let pair = layers * 2.0 * attn as f64;
    (token, pair, (d * cfg.vocab_size) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataset::Encoded;

    #[test]
    fn shared_prefixes_count_once_and_attention_grows_with_the_rows() {
        let cfg = ModelConfig::needle2();
        let row = |tail: u32| {
            let ids: Vec<u32> = (1..=100).chain([tail, tail + 1]).collect();
            Encoded { mask: (0..102).map(|t| f32::from(u8::from(t > 100))).collect(), ids, truncated: false }
        };
        let rows = [row(500), row(600)];
        let (shared, unshared) =
            (Workload::of(&Packing::new(&rows, true).unwrap()), Workload::of(&Packing::new(&rows, false).unwrap()));
        assert_eq!((shared.tokens, unshared.tokens), (104.0, 204.0));
        assert_eq!((shared.scored, unshared.scored), (2.0, 2.0));
        assert!(shared.training(&cfg) < 0.6 * unshared.training(&cfg));
        assert!(shared.forward(&cfg) < shared.training(&cfg));
    }
}
