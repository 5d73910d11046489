//! The whole network (the reference's `SimpleAttentionNetwork.__call__`): token ids → logits.

use candle_core::backprop::GradStore;
use candle_core::{DType, Tensor, Var};

use super::attention::{AttentionLayout, LayerKv, Rope};
use super::decode::DecodeState;
use super::engram::{EngramKv, EngramLookup};
use crate::dataset::Encoded;
use crate::model::kernels::RopeTables;
use crate::model::kernels::{fake_quant_rows, frozen_matmul};
use crate::model::linear::LowRank;
use crate::model::loss::Scored;
use crate::model::packing::Packing;
use crate::model::weights::network::Network;
use crate::model::Result;

/// The per-batch inputs of the layer stack.
struct LayerInputs {
    /// Token embeddings `[N, d]`, scaled.
    embedded: Tensor,
    layout: AttentionLayout,
    /// Each engram site's keys and values.
    memories: Vec<EngramKv>,
}

impl Network {
    /// Token ids `[B, T]` (any integer dtype) → logits `[B, T, vocab]` f32, under the causal mask
    /// only (padding is attended to, as in the reference's `__call__`).
    pub fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        let rows = ids.to_dtype(DType::U32)?.to_vec2::<u32>()?;
        let (b, t) = (rows.len(), rows.first().map_or(0, Vec::len));
        // Every position is kept (a unit mask keeps trailing PAD), each row a segment of its own.
        let rows: Vec<Encoded> =
            rows.into_iter().map(|ids| Encoded { mask: vec![1.0; ids.len()], ids, truncated: false }).collect();
        let hidden = self.hidden(&Packing::new(&rows, false)?, None)?;
        Ok(self.logits(&hidden)?.reshape((b, t, self.output_rows()))?)
    }

    /// `(Σ ce·mask, Σ mask)` of a packed batch (see [`crate::model::masked_ce_sum`]), with only the scored
    /// positions projected to the vocabulary; `low_rank` adapts the projections.
    pub fn masked_ce_sum(&self, packing: &Packing, low_rank: Option<&LowRank>) -> Result<(Tensor, f64)> {
        let sum = self.scored_ce_sum(packing.scored(), &self.hidden(packing, low_rank)?)?;
        Ok((sum, packing.scored().weight_sum()))
    }

    /// `Σ ce·mask` of the scored positions of hidden states `[N, d_model]`.
    fn scored_ce_sum(&self, scored: &Scored, hidden: &Tensor) -> Result<Tensor> {
        scored.ce_sum(hidden, |h| self.logits(h))
    }

    /// Hidden states `[…, d_model]` → logits through the tied (frozen) embedding.
    fn logits(&self, hidden: &Tensor) -> Result<Tensor> {
        let hidden = match self.qat {
            Some(qat) => fake_quant_rows(hidden, qat.act_bits)?,
            None => hidden.clone(),
        };
        Ok(frozen_matmul(&hidden, &self.embedding.narrow(0, 0, self.output_rows())?.t()?)?)
    }

    /// A packed batch → final hidden states `[N, d_model]`.
    fn hidden(&self, packing: &Packing, low_rank: Option<&LowRank>) -> Result<Tensor> {
        let inputs = self.inputs(packing)?;
        self.stack.forward(&inputs.embedded, &inputs.layout, &inputs.memories, low_rank)
    }

    /// A packed batch → the hidden cells of every depth `[N, R, d_model]` (`R = num_layers + 1`),
    /// what the confidence head reads ([`Stack::cells`]).
    pub fn hidden_cells(&self, packing: &Packing, low_rank: Option<&LowRank>) -> Result<Tensor> {
        let inputs = self.inputs(packing)?;
        self.stack.cells(&inputs.embedded, &inputs.layout, &inputs.memories, low_rank)
    }

    /// What every layer reads besides the lanes, from the packed tokens: none of it depends on a
    /// trainable weight, so none of it is part of the gradient graph.
    fn inputs(&self, packing: &Packing) -> Result<LayerInputs> {
        self.check_ids(packing)?;
        let device = self.device();
        let ids = Tensor::from_slice(&packing.ids, packing.len(), device)?;
        let embedded = (self.embedding.index_select(&ids, 0)? * (self.cfg.d_model as f64).sqrt())?;
        let rope = Rope::new(self.cfg.qk_head_dim(), packing.longest_row(), self.cfg.rope_theta, device)?;
        Ok(LayerInputs {
            embedded,
            layout: AttentionLayout::new(packing, &self.cfg, &rope, device)?,
            memories: self.engram_memories(packing)?,
        })
    }

    /// Each engram site's keys and values for the packed tokens.
    pub(in crate::model) fn engram_memories(&self, packing: &Packing) -> Result<Vec<EngramKv>> {
        match &self.engram_geometry {
            None => Ok(Vec::new()),
            Some(geometry) => {
                let lookup = EngramLookup::new(packing, geometry, self.device())?;
                self.engrams.iter().map(|e| e.forward(&lookup)).collect()
            }
        }
    }

    /// `Σ ce·mask / normalizer` over a packed batch and its gradients for the tensors `low_rank`
    /// holds, with activations kept for one layer at a time: a first pass keeps only each layer's
    /// input lanes, then the backward pass recomputes one layer's graph at a time from its input
    /// and the gradient arriving from above. The same gradients as `masked_ce_sum(…)` divided and
    /// differentiated, for about one more forward pass of time and a layer's activations of
    /// memory instead of the whole stack's.
    pub fn loss_and_grads_by_layer(
        &self,
        packing: &Packing,
        low_rank: &LowRank,
        normalizer: f64,
    ) -> Result<(f32, GradStore)> {
        let LayerInputs { embedded, layout, memories } = self.inputs(packing)?;
        let layer = |index: usize, lanes: &Tensor, low_rank: &LowRank| {
            self.stack.layer(index, lanes, &layout, &memories, Some(low_rank), None)
        };

        let untracked = low_rank.detached();
        let mut inputs = vec![self.stack.spread(&embedded)?];
        for index in 0..self.stack.num_layers() {
            let next = layer(index, &inputs[index], &untracked)?;
            inputs.push(next);
        }

        let top = Var::from_tensor(&inputs.pop().expect("the stack's output"))?;
        let loss = (self.scored_ce_sum(packing.scored(), &self.stack.finish(top.as_tensor())?)? / normalizer)?;
        let mut grads = loss.backward()?;
        // Every gradient is detached as it is taken: candle's gradients are themselves tracked
        // tensors, and a tracked upstream gradient would pull every layer's graph into the next.
        let mut upstream = grads.remove(top.as_tensor()).map_or_else(|| top.zeros_like(), Ok)?.detach();
        while let Some(input) = inputs.pop() {
            let index = inputs.len();
            // The first layer's input is the embedding, which needs no gradient.
            let input = if index == 0 { input } else { Var::from_tensor(&input)?.as_tensor().clone() };
            let output = layer(index, &input, low_rank)?;
            let layer_grads = (output * &upstream)?.sum_all()?.backward()?;
            for factor in low_rank.tensors() {
                if let Some(grad) = layer_grads.get(factor) {
                    let total = match grads.remove(factor) {
                        Some(earlier) => (earlier + grad)?,
                        None => grad.clone(),
                    };
                    grads.insert(factor, total.detach());
                }
            }
            if index > 0 {
                upstream = layer_grads.get(&input).map_or_else(|| input.zeros_like(), |g| Ok(g.detach()))?;
            }
        }
        Ok((loss.to_scalar()?, grads))
    }

    /// Logits `[vocab]` after the last of `new` tokens, which follow the positions `state` has seen
    /// and join them: one decoding step (the prompt's prefill when `state` is empty). Attention reads
    /// the cached keys; engram memories are recomputed from the window of history they reach.
    pub(in crate::model) fn decode_step(&self, new: &[u32], state: &mut DecodeState) -> Result<Tensor> {
        let (past, s) = (state.history.len(), new.len());
        let device = self.device();
        let window_start = past - self.engram_window().map_or(0, |w| past.min(w));
        // The new tokens with the history their engram n-grams and taps reach, as one row.
        let window: Vec<u32> = state.history[window_start..].iter().chain(new).copied().collect();
        let row = Encoded { mask: vec![1.0; window.len()], ids: window, truncated: false };
        let packing = Packing::new(&[row], false)?;
        self.check_ids(&packing)?;
        state.history.extend_from_slice(new);
        let ids = Tensor::from_slice(new, s, device)?;
        let embedded = (self.embedding.index_select(&ids, 0)? * (self.cfg.d_model as f64).sqrt())?;
        let memories = self
            .engram_memories(&packing)?
            .iter()
            .map(|memory| memory.positions(past - window_start, s))
            .collect::<Result<Vec<_>>>()?;
        let rope = state.rope_through(past + s, &self.cfg, device)?;
        let layout = AttentionLayout::decode(past, s, &self.cfg, rope, device)?;
        let mut lanes = self.stack.spread(&embedded)?;
        for (index, cache) in state.layers.iter_mut().enumerate() {
            lanes = self.stack.layer(index, &lanes, &layout, &memories, None, Some(cache))?;
        }
        let last = self.stack.finish(&lanes.narrow(0, s - 1, 1)?)?;
        Ok(self.logits(&last)?.flatten_all()?)
    }
}

impl Network {
    /// A candle state that has seen nothing; its rotary tables grow with what it decodes.
    pub(in crate::model) fn decode_state(&self) -> Result<DecodeState> {
        let cfg = self.config();
        let positions = RopeTables::decode_capacity(0, 1, cfg.max_seq_len);
        Ok(DecodeState {
            history: Vec::new(),
            layers: vec![LayerKv::default(); cfg.num_layers],
            rope: Rope::new(cfg.qk_head_dim(), positions, cfg.rope_theta, self.device())?,
            rope_positions: positions,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use std::path::Path;

    use candle_core::Device;

    use crate::config::ModelConfig;
    use crate::fixtures::seeded_normal;
    use crate::model::params::Params;
    use crate::model::ModelError;

    /// Small but complete: GQA groups of 2, a padded Hadamard width (48 → 64), 2 lanes, an engram
    /// site at each layer.
    fn tiny_config() -> ModelConfig {
        ModelConfig {
            vocab_size: 40,
            d_model: 48,
            num_heads: 4,
            num_kv_heads: 2,
            num_layers: 2,
            engram_layers: vec![0, 1],
            engram_slots: 16,
            mhc_lanes: 2,
            ..ModelConfig::default()
        }
    }

    /// Every parameter of a random-init tiny network, by path.
    fn random_params(cfg: &ModelConfig) -> BTreeMap<String, Tensor> {
        let params = Params::random_init(&Device::Cpu);
        Network::load(cfg, &params).unwrap();
        params.paths().into_iter().map(|p| (p.clone(), params.get(&p).unwrap())).collect()
    }

    fn batch() -> (Tensor, Tensor) {
        let ids = Tensor::new(&[[2u32, 7, 7, 30, 11, 5, 1, 0], [2, 9, 3, 3, 3, 17, 39, 1]], &Device::Cpu).unwrap();
        let mask =
            Tensor::new(&[[0f32, 0., 0., 1., 1., 1., 1., 0.], [0., 0., 0., 0., 1., 1., 1., 1.]], &Device::Cpu).unwrap();
        (ids, mask)
    }

    fn batch_rows() -> Vec<Encoded> {
        let (ids, mask) = batch();
        let (ids, mask) = (ids.to_vec2::<u32>().unwrap(), mask.to_vec2::<f32>().unwrap());
        ids.into_iter().zip(mask).map(|(ids, mask)| Encoded { ids, mask, truncated: false }).collect()
    }

    #[test]
    fn low_rank_gradients_reach_every_attention_projection_of_every_layer() {
        let cfg = tiny_config();
        let params = Params::from_tensors(random_params(&cfg), &Device::Cpu).unwrap();
        let network = Network::load(&cfg, &params).unwrap();
        // Factors as an adapter starts them (`A` noise, `B` zero) on the q, k, v, gate and out
        // projections of every layer.
        let mut low_rank = LowRank::new(2.0);
        let mut factors_b = Vec::new();
        for projection in ["q_proj", "k_proj", "v_proj", "gate_proj", "out_proj"] {
            let path = format!("stack/layers/block/self_attn/{projection}/kernel");
            let (layers, d_in, d_out) = params.get(&path).unwrap().dims3().unwrap();
            for layer in 0..layers {
                let seed = factors_b.len() as u64;
                let a = Var::from_tensor(&seeded_normal(0.0, 0.25, &[d_in, 4], seed)).unwrap();
                let b = Var::zeros((4, d_out), DType::F32, &Device::Cpu).unwrap();
                low_rank.insert(&path, layer, a.as_tensor().clone(), b.as_tensor().clone());
                factors_b.push((format!("{path} B{layer}"), b));
            }
        }
        assert_eq!(factors_b.len(), 5 * cfg.num_layers);
        let packing = Packing::new(&batch_rows(), true).unwrap();
        let (sum, count) = network.masked_ce_sum(&packing, Some(&low_rank)).unwrap();
        let grads = (sum / count).unwrap().backward().unwrap();
        // B starts at zero, so only B's gradient is non-zero before the first update.
        for (name, b) in &factors_b {
            let grad = grads.get(b.as_tensor()).unwrap_or_else(|| panic!("no gradient for {name}"));
            let size: f32 = grad.abs().unwrap().sum_all().unwrap().to_scalar().unwrap();
            assert!(size.is_finite() && size > 0.0, "{name}: |grad| {size}");
        }
    }

    #[test]
    fn a_missing_misshapen_or_surplus_param_is_named() {
        let cfg = tiny_config();
        let full = random_params(&cfg);
        let load = |edit: &dyn Fn(&mut BTreeMap<String, Tensor>), cfg: &ModelConfig| {
            let mut tensors = full.clone();
            edit(&mut tensors);
            Network::load(cfg, &Params::from_tensors(tensors, &Device::Cpu).unwrap()).unwrap_err()
        };
        let k_proj = "stack/layers/block/self_attn/k_proj/kernel";
        let err = load(&|t| drop(t.remove(k_proj)), &cfg);
        assert!(
            matches!(&err, ModelError::MissingParam { path, expected } if path == k_proj && expected == &[2, 48, 24]),
            "{err}"
        );

        let err = load(
            &|t| drop(t.insert(k_proj.into(), Tensor::zeros((2, 48, 48), DType::F32, &Device::Cpu).unwrap())),
            &cfg,
        );
        assert!(
            matches!(&err, ModelError::ParamShape { path, actual, .. } if path == k_proj && actual == &[2, 48, 48]),
            "{err}"
        );

        let one_site = ModelConfig { engram_layers: vec![0], ..tiny_config() };
        let err = load(&|_| {}, &one_site);
        assert!(
            matches!(&err, ModelError::UnexpectedParam { path, count: 4 } if path == "engrams_1/embedding"),
            "{err}"
        );

        let three_layers = ModelConfig { num_layers: 3, ..tiny_config() };
        let err = load(&|_| {}, &three_layers);
        assert!(matches!(&err, ModelError::ParamShape { expected, .. } if expected[0] == 3), "{err}");
    }

    #[test]
    fn the_parameter_tree_is_listed_without_allocating_the_parameters() {
        // Every count at its bound: the embedding alone would be 2^40 floats.
        let cfg = ModelConfig {
            vocab_size: 1 << 24,
            d_model: 1 << 16,
            num_heads: 1 << 10,
            num_kv_heads: 1 << 10,
            num_layers: 1 << 10,
            engram_slots: 1 << 20,
            engram_layers: vec![0, 1023],
            mhc_lanes: 64,
            ..ModelConfig::default()
        };
        let shapes: BTreeMap<String, Vec<usize>> = Network::param_shapes(&cfg).unwrap().into_iter().collect();
        assert_eq!(shapes["embedding/embedding"], [1 << 24, 1 << 16]);
        assert_eq!(shapes["stack/mhc_phi_res"], [1 << 10, 64 << 16, 64 * 64]);
        assert_eq!(shapes["engrams_1/embedding"], [512, 1 << 20, 128]);
        // The tiny network's tree is the set of parameters a random-init load creates.
        let tiny = tiny_config();
        let listed: Vec<String> = Network::param_shapes(&tiny).unwrap().into_iter().map(|(path, _)| path).collect();
        assert_eq!(listed, random_params(&tiny).into_keys().collect::<Vec<_>>());
    }

    #[test]
    fn bad_tokens_and_a_foreign_tokenizer_are_errors() {
        let cfg = tiny_config();
        let network = Network::load(&cfg, &Params::from_tensors(random_params(&cfg), &Device::Cpu).unwrap()).unwrap();
        let empty = Tensor::zeros((1, 0), DType::U32, &Device::Cpu).unwrap();
        assert!(matches!(network.forward(&empty), Err(ModelError::EmptyBatch)));
        let ids = Tensor::new(&[[2u32, 40]], &Device::Cpu).unwrap();
        let err = network.forward(&ids).unwrap_err();
        assert!(matches!(err, ModelError::TokenOutOfRange { id: 40, row: 0, position: 1, vocab: 40 }), "{err}");
        let err = network.check_tokenizer_vocab(512, Path::new("m/tokenizer.model")).unwrap_err();
        assert!(err.to_string().contains("`m/tokenizer.model` has a vocabulary of 512 but the model's is 40"), "{err}");
        network.check_tokenizer_vocab(40, Path::new("m/tokenizer.model")).unwrap();
    }

    #[test]
    fn without_engram_sites_the_engram_settings_are_ignored() {
        let cfg = ModelConfig { engram_layers: vec![], engram_orders: vec![], ..tiny_config() };
        let params = Params::random_init(&Device::Cpu);
        let logits = Network::load(&cfg, &params).unwrap().forward(&batch().0).unwrap();
        assert_eq!(logits.dims(), &[2, 8, 40]);
        assert!(!params.has_prefix("engrams_0"));
    }

    #[test]
    fn configs_the_reference_cannot_run_are_rejected() {
        let params = Params::random_init(&Device::Cpu);
        for (cfg, field) in [
            (ModelConfig { num_kv_heads: 3, ..tiny_config() }, "num_kv_heads"),
            (ModelConfig { engram_layers: vec![2], ..tiny_config() }, "engram_layers"),
            (ModelConfig { num_heads: 5, ..tiny_config() }, "attn_dim"),
            (ModelConfig { mhc_lanes: 0, ..tiny_config() }, "mhc_lanes"),
        ] {
            let err = Network::load(&cfg, &params).unwrap_err();
            assert!(matches!(err, ModelError::InvalidConfig { field: f, .. } if f == field), "{err}");
        }
    }
}
