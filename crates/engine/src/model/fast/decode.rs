//! Greedy decoding steps on the CPU path: each step runs the new tokens through every layer with
//! attention reading a key/value cache of the earlier positions, and adds their keys and values
//! to it. A prompt's prefill is one such step over the whole prompt.

use std::sync::{Arc, OnceLock};

use super::attention::Past;
use super::kv_cache::{LayerCache, Shape};
use super::mat::{matmul, Mat, MatMut, Threads};
use super::network::{dims_of, CpuNetwork, Workspace};
use super::pass::{lane_pair, Pass};
use crate::config::ModelConfig;
use crate::dataset::Encoded;
use crate::model::host::host;
use crate::model::kernels::RopeTables;
use crate::model::packing::{Family, Packing, Segment};
use crate::model::Result;

/// Steps of at most this many tokens run on one thread.
const ONE_THREAD_TOKENS: usize = 8;

/// The state a decoding run carries from step to step.
#[derive(Debug, Clone)]
pub struct CpuDecode {
    /// Every token so far, prompt included.
    history: Vec<u32>,
    /// Per layer, its keys and values, and the last inputs of its Q/K/V taps.
    cache: Vec<LayerCache>,
    /// Rotary tables of the positions decoded so far, and room for more.
    rope: Arc<RopeTables>,
    /// How many positions `rope` holds.
    rope_positions: usize,
}

impl CpuDecode {
    pub fn history(&self) -> &[u32] {
        &self.history
    }

    /// How many positions the rotary tables hold now.
    #[cfg(test)]
    pub(crate) fn rope_positions(&self) -> usize {
        self.rope_positions
    }

    /// Rotary tables that reach position `needed − 1`, grown as decoding goes
    /// ([`RopeTables::decode_capacity`]).
    fn rope_through(&mut self, needed: usize, cfg: &ModelConfig) -> Arc<RopeTables> {
        let positions = RopeTables::decode_capacity(self.rope_positions, needed, cfg.max_seq_len);
        if positions > self.rope_positions {
            self.rope = Arc::new(RopeTables::new(cfg.qk_head_dim(), positions, cfg.rope_theta));
            self.rope_positions = positions;
        }
        Arc::clone(&self.rope)
    }
}

impl CpuNetwork {
    /// A state that has seen nothing.
    pub fn decode_state(&self) -> CpuDecode {
        let cfg = self.network.config();
        let positions = RopeTables::decode_capacity(0, 1, cfg.max_seq_len);
        CpuDecode {
            history: Vec::new(),
            cache: vec![LayerCache::default(); cfg.num_layers],
            rope: Arc::new(RopeTables::new(cfg.qk_head_dim(), positions, cfg.rope_theta)),
            rope_positions: positions,
        }
    }

    /// Logits `[vocab]` after the last of `new` tokens, which follow the positions `state` has seen
    /// and join them. The engram memories of the new tokens are recomputed from the window of
    /// history they reach. A step of a few tokens runs on one thread: its pieces are too small to
    /// pay for waking another.
    pub fn decode_step(&self, new: &[u32], state: &mut CpuDecode, ws: &mut Workspace) -> Result<Vec<f32>> {
        if new.len() > ONE_THREAD_TOKENS {
            return self.step(new, state, ws);
        }
        static ONE_THREAD: OnceLock<Option<rayon::ThreadPool>> = OnceLock::new();
        match ONE_THREAD.get_or_init(|| rayon::ThreadPoolBuilder::new().num_threads(1).build().ok()) {
            Some(pool) => pool.install(|| self.step(new, state, ws)),
            None => self.step(new, state, ws),
        }
    }

    fn step(&self, new: &[u32], state: &mut CpuDecode, ws: &mut Workspace) -> Result<Vec<f32>> {
        let cfg = self.network.config();
        let (past, count) = (state.history.len(), new.len());
        let window = self.network.engram_window().map_or(0, |w| past.min(w));
        let ids: Vec<u32> = state.history[past - window..].iter().chain(new).copied().collect();
        let row = Encoded { mask: vec![1.0; ids.len()], ids, truncated: false };
        let packing = Packing::new(&[row], false)?;
        self.network.check_ids(&packing)?;
        let dims = dims_of(cfg, 0, count);
        let pass = Pass {
            dims,
            positions: (past as u32..(past + count) as u32).collect(),
            segments: vec![Segment { start: 0, len: count, context: None }],
            families: vec![Family { head: 0, tails: Vec::new(), range: 0..count }],
            rope: state.rope_through(past + count, cfg),
            sites: super::engram::memories(&self.network, &packing, window)?,
            conv: None,
            lora_scale: 0.0,
            ones: vec![1.0; dims.d],
        };
        ws.resize(&dims, self.layers.len(), false, false);
        self.embed(new, &dims, &mut ws.lanes[0])?;
        let no_lora = Default::default();
        for (l, (layer, cache)) in self.layers.iter().zip(&mut state.cache).enumerate() {
            let shape =
                Shape { kv_heads: dims.kv_heads, widths: [dims.qk, dims.v], window: layer.block.attention.window() };
            cache.reserve(past, count, shape);
            let Workspace { lanes, kept, work, .. } = &mut *ws;
            let (input, output) = lane_pair(lanes, l);
            let past_positions = Past { kv: cache.cached(past), recent: &cache.recent };
            layer.forward(&pass, &no_lora, input, &mut kept[0], work, output, Some(past_positions))?;
            let (new_keys, new_values, inputs) = work.keys_and_values();
            cache.append(past, count, new_keys, new_values, shape);
            if let Some(conv) = layer.block.attention.conv() {
                conv.keep_recent(&mut cache.recent, inputs);
            }
        }
        state.history.extend_from_slice(new);
        self.finish(&dims, ws);
        let table = host(&self.network.embedding)?;
        let (d, vocab) = (dims.d, self.network.output_rows());
        let mut logits = vec![0f32; vocab];
        let mut last = ws.hidden[(count - 1) * d..count * d].to_vec();
        self.as_output_reads(&mut last, d);
        let (last, embedding) = (Mat::new(&last, 1, d), Mat::new(&table[..vocab * d], vocab, d));
        matmul(MatMut::new(&mut logits, 1, vocab), last, embedding.t(), 1.0, false, Threads::All);
        Ok(logits)
    }
}
