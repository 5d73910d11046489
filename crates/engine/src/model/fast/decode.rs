//! Greedy decoding steps on the CPU path: each step runs the new tokens of one or several decoding
//! runs through every layer with attention reading each run's key/value cache of its earlier
//! positions, and adds their keys and values to it. A prompt's prefill is one such step over the
//! whole prompt; a batch's step is one over a new token of each of its rows.

use std::sync::{Arc, OnceLock};

use super::attention::Past;
use super::engram::Site;
use super::kv_cache::{LayerCache, Shape};
use super::mat::{matmul, Mat, MatMut, Threads};
use super::network::{dims_of, integer_logits, CpuNetwork, Workspace};
use super::pass::{lane_pair, Pass};
use crate::config::ModelConfig;
use crate::dataset::Encoded;
use crate::model::host::host;
use crate::model::kernels::RopeTables;
use crate::model::packing::{Family, Packing, Segment};
use crate::model::{ModelError, Result};

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

    /// Logits `[vocab]` after the last of `new[b]` tokens for each run `states[b]`, whose tokens
    /// they follow and join: one step of several decoding runs together (a prompt's prefill, or a
    /// new token of each row of a batch). The runs are the segments of one pass, so every
    /// projection reads its weights once for all of them; attention and the Q/K/V taps read each
    /// run's own cache. The engram memories of the new tokens are recomputed from the window of
    /// history they reach. A step of a few tokens runs on one thread: its pieces are too small to
    /// pay for waking another.
    pub fn decode_steps(
        &self,
        new: &[&[u32]],
        states: &mut [&mut CpuDecode],
        ws: &mut Workspace,
    ) -> Result<Vec<Vec<f32>>> {
        if new.iter().map(|n| n.len()).sum::<usize>() > ONE_THREAD_TOKENS {
            return self.steps(new, states, ws);
        }
        static ONE_THREAD: OnceLock<Option<rayon::ThreadPool>> = OnceLock::new();
        match ONE_THREAD.get_or_init(|| rayon::ThreadPoolBuilder::new().num_threads(1).build().ok()) {
            Some(pool) => pool.install(|| self.steps(new, states, ws)),
            None => self.steps(new, states, ws),
        }
    }

    fn steps(&self, new: &[&[u32]], states: &mut [&mut CpuDecode], ws: &mut Workspace) -> Result<Vec<Vec<f32>>> {
        let pass = self.batch_pass(new, states)?;
        let dims = pass.dims;
        ws.resize(&dims, self.layers.len(), false, false);
        self.embed(&new.concat(), &dims, &mut ws.lanes[0])?;
        let no_lora = Default::default();
        let lens: Vec<usize> = states.iter().map(|s| s.history.len()).collect();
        for (l, layer) in self.layers.iter().enumerate() {
            let shape =
                Shape { kv_heads: dims.kv_heads, widths: [dims.qk, dims.v], window: layer.block.attention.window() };
            for ((state, &len), segment) in states.iter_mut().zip(&lens).zip(&pass.segments) {
                state.cache[l].reserve(len, segment.len, shape);
            }
            let Workspace { lanes, kept, work, .. } = &mut *ws;
            let (input, output) = lane_pair(lanes, l);
            let pasts: Vec<Past> = (states.iter().zip(&lens))
                .map(|(state, &len)| Past { kv: state.cache[l].cached(len), recent: &state.cache[l].recent })
                .collect();
            layer.forward(&pass, &no_lora, input, &mut kept[0], work, output, &pasts)?;
            let (new_keys, new_values, inputs) = work.keys_and_values();
            for ((state, &len), segment) in states.iter_mut().zip(&lens).zip(&pass.segments) {
                let cache = &mut state.cache[l];
                cache.append(len, segment.range(), dims.tokens, [new_keys, new_values], shape);
                if let Some(conv) = layer.block.attention.conv() {
                    let width = dims.qkv_width();
                    conv.keep_recent(&mut cache.recent, &inputs[segment.start * width..][..segment.len * width]);
                }
            }
        }
        states.iter_mut().zip(new).for_each(|(state, new)| state.history.extend_from_slice(new));
        self.finish(&dims, ws);
        let (d, vocab, rows) = (dims.d, self.network.output_rows(), pass.segments.len());
        // Each run's last token, projected to the vocabulary together.
        let mut last: Vec<f32> =
            pass.segments.iter().flat_map(|s| &ws.hidden[(s.start + s.len - 1) * d..][..d]).copied().collect();
        if let Some(codes) = self.network.codes() {
            return integer_logits(codes.head(), &last, rows, d, vocab);
        }
        self.as_output_reads(&mut last, d);
        let table = host(&self.network.embedding)?;
        let mut logits = vec![0f32; rows * vocab];
        let (last, embedding) = (Mat::new(&last, rows, d), Mat::new(&table[..vocab * d], vocab, d));
        matmul(MatMut::new(&mut logits, rows, vocab), last, embedding.t(), 1.0, false, Threads::All);
        Ok(logits.chunks(vocab).map(<[f32]>::to_vec).collect())
    }

    /// The pass of one batched step: run `b`'s tokens `new[b]` are segment `b`, at the positions
    /// after those its state has seen, with the engram memories of its own history.
    fn batch_pass(&self, new: &[&[u32]], states: &mut [&mut CpuDecode]) -> Result<Pass> {
        let cfg = self.network.config();
        let tokens: usize = new.iter().map(|n| n.len()).sum();
        let dims = dims_of(cfg, 0, tokens);
        let (mut segments, mut families, mut positions) = (Vec::new(), Vec::new(), Vec::with_capacity(tokens));
        let mut sites: Vec<Site> = Vec::new();
        let mut rope: Option<(usize, Arc<RopeTables>)> = None;
        for (b, (new, state)) in new.iter().zip(states.iter_mut()).enumerate() {
            let (past, count, start) = (state.history.len(), new.len(), positions.len());
            let window = self.network.engram_window().map_or(0, |w| past.min(w));
            let ids: Vec<u32> = state.history[past - window..].iter().chain(*new).copied().collect();
            let row = Encoded { mask: vec![1.0; ids.len()], ids, truncated: false };
            let packing = Packing::new(&[row], false)?;
            self.network.check_ids(&packing)?;
            let row_sites = super::engram::memories(&self.network, &packing, window)?;
            match sites.is_empty() {
                true => sites = row_sites,
                false => sites.iter_mut().zip(row_sites).for_each(|(site, row)| site.extend(row)),
            }
            segments.push(Segment { start, len: count, context: None });
            families.push(Family { head: b, tails: Vec::new(), range: start..start + count });
            positions.extend(past as u32..(past + count) as u32);
            // Every run's tables hold the same angles; the longest serves them all.
            let tables = state.rope_through(past + count, cfg);
            if rope.as_ref().is_none_or(|(held, _)| *held < state.rope_positions) {
                rope = Some((state.rope_positions, tables));
            }
        }
        let Some((_, rope)) = rope else { return Err(ModelError::EmptyBatch) };
        Ok(Pass {
            dims,
            positions,
            segments,
            families,
            rope,
            sites,
            conv: None,
            lora_scale: 0.0,
            ones: vec![1.0; dims.d],
        })
    }
}
