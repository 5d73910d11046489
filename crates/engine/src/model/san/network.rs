//! The whole network (the reference's `SimpleAttentionNetwork.__call__`): token ids → logits.

use std::path::Path;

use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Tensor, Var};

use super::attention::{AttentionLayout, LayerKv, Rope};
use super::block::Block;
use super::decode::DecodeState;
use super::engram::{Engram, EngramGeometry, EngramKv, EngramLookup};
use super::stack::Stack;
use crate::checkpoint::Checkpoint;
use crate::config::ModelConfig;
use crate::dataset::Encoded;
use crate::generation::Generation;
use crate::model::kernels::RopeTables;
use crate::model::kernels::{fake_quant_rows, frozen_matmul};
use crate::model::linear::LowRank;
use crate::model::loss::Scored;
use crate::model::norm::ZcRmsNorm;
use crate::model::packing::Packing;
use crate::model::params::{ParamPath, Params};
use crate::model::qat::Qat;
use crate::model::{ModelError, Result};
use crate::w4a8::NetworkCodes;

/// Probe counts of the reference's contrastive and confidence heads.
const CONTRASTIVE_PROBES: usize = 4;
const CONFIDENCE_PROBES: usize = 8;

/// The per-batch inputs of the layer stack.
struct LayerInputs {
    /// Token embeddings `[N, d]`, scaled.
    embedded: Tensor,
    layout: AttentionLayout,
    /// Each engram site's keys and values.
    memories: Vec<EngramKv>,
}

#[derive(Debug, Clone)]
pub struct Network {
    cfg: ModelConfig,
    /// `[vocab, d_model]`, also the (transposed) output projection.
    pub(in crate::model) embedding: Tensor,
    /// `None` when no layer has an engram site.
    engram_geometry: Option<EngramGeometry>,
    engrams: Vec<Engram>,
    pub(in crate::model) stack: Stack,
    qat: Option<Qat>,
    /// Under W4A8, the CQ codes the CPU path's projections and output head multiply by instead of
    /// the float weights ([`Network::with_codes`]).
    codes: Option<NetworkCodes>,
}

impl Network {
    /// Builds the network from `params`, failing on any missing, misshapen or unused parameter.
    /// The multi-token-prediction block and the contrastive/confidence heads are optional (the
    /// reference's plain forward never reads them); when present they are checked, not kept.
    pub fn load(cfg: &ModelConfig, params: &Params) -> Result<Self> {
        let cfg = cfg.clone().resolved();
        validate(&cfg)?;
        let root = params.root();
        // Like the reference, the engram settings only matter when some layer has a site.
        let engram_geometry = if cfg.engram_layers.is_empty() { None } else { Some(EngramGeometry::new(&cfg)?) };
        let engrams = match &engram_geometry {
            None => Vec::new(),
            Some(geometry) => (0..cfg.engram_layers.len())
                .map(|s| Engram::new(&cfg, geometry, root.pp(&format!("engrams_{s}"))))
                .collect::<Result<_>>()?,
        };
        let network = Self {
            embedding: root.pp("embedding").get(&[cfg.vocab_size, cfg.d_model], "embedding")?,
            stack: Stack::new(&cfg, root.pp("stack"))?,
            engram_geometry,
            engrams,
            cfg,
            qat: params.qat(),
            codes: None,
        };
        if ["mtp_block", "mtp_combine", "mtp_emb_norm", "mtp_final_norm"].iter().any(|p| params.has_prefix(p)) {
            check_mtp(&network.cfg, &root)?;
        }
        match network.cfg.generation {
            Generation::Needle2 => check_needle2_heads(&network.cfg, params, &root)?,
            Generation::Needle3 => check_needle3_heads(&network.cfg, params, &root)?,
        }
        params.ensure_all_used()?;
        Ok(network)
    }

    /// Every parameter a network of `cfg` reads, with its full (stacked) shape, in path order: the
    /// one list of the parameter tree, read off the layers' own constructors. The export checks a
    /// checkpoint against it ([`crate::cact::needle2::check_params`]) and synthetic checkpoints are
    /// made from it ([`crate::cact::synthetic`]). The optional parts (the MTP block and the probe
    /// heads) are not in it.
    pub fn param_shapes(cfg: &ModelConfig) -> Result<Vec<(String, Vec<usize>)>> {
        let params = Params::placeholders();
        Self::load(cfg, &params)?;
        Ok(params.shapes())
    }

    /// The checkpoint's params (widened to f32) on `device`, shaped by its config.
    pub fn from_checkpoint(checkpoint: &Checkpoint, device: &Device) -> Result<Self> {
        Self::load(&checkpoint.config, &Params::from_checkpoint(checkpoint, device)?)
    }

    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// The network run as W4A8: its attention projections and output head multiply `codes` (the
    /// `.cact`'s own, of these same weights) with 8-bit activations on the CPU path's integer
    /// kernels ([`crate::w4a8`]); everything else computes as before. Only the CPU path reads them.
    pub fn with_codes(self, codes: NetworkCodes) -> Result<Self> {
        if codes.layers().len() != self.cfg.num_layers {
            let reason = format!("has {} layers but the codes hold {}", self.cfg.num_layers, codes.layers().len());
            return Err(ModelError::InvalidConfig { field: "num_layers", reason });
        }
        Ok(Self { codes: Some(codes), ..self })
    }

    /// The W4A8 codes, when the network runs from them.
    pub fn codes(&self) -> Option<&NetworkCodes> {
        self.codes.as_ref()
    }

    pub fn device(&self) -> &Device {
        self.embedding.device()
    }

    /// Whether the network fake-quantizes as it computes (quantization-aware training).
    pub(in crate::model) fn qat(&self) -> Option<Qat> {
        self.qat
    }

    /// Fails when a tokenizer's vocabulary (read from `path`) is not this model's.
    pub fn check_tokenizer_vocab(&self, tokenizer_vocab: usize, path: &Path) -> Result<()> {
        if crate::tokenizer::fits(self.cfg.generation, tokenizer_vocab, self.cfg.vocab_size) {
            return Ok(());
        }
        Err(ModelError::VocabMismatch { path: path.into(), tokenizer_vocab, model_vocab: self.cfg.vocab_size })
    }

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

    /// The vocabulary rows the output head scores: Needle 3's `out_vocab` text slice, else all.
    pub fn output_rows(&self) -> usize {
        match self.cfg.out_vocab {
            0 => self.cfg.vocab_size,
            rows => rows,
        }
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

    /// Earlier tokens a position's engram memory reads (`None` without engram sites): what a
    /// decoding step recomputes memories from.
    pub(in crate::model) fn engram_window(&self) -> Option<usize> {
        self.engram_geometry.as_ref().map(EngramGeometry::window)
    }

    /// The engram tables' layout and the sites, where some layer has one.
    pub(in crate::model) fn engrams(&self) -> Option<(&EngramGeometry, &[Engram])> {
        self.engram_geometry.as_ref().map(|geometry| (geometry, self.engrams.as_slice()))
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

    /// Fails on a token outside the vocabulary, naming its row and position, or on an answer token
    /// outside the output head.
    pub(in crate::model) fn check_ids(&self, packing: &Packing) -> Result<()> {
        let vocab = self.cfg.vocab_size;
        for row in 0..packing.num_rows() {
            for position in 0..packing.row_len(row) {
                let id = packing.ids[packing.index(row, position)];
                if id as usize >= vocab {
                    return Err(ModelError::TokenOutOfRange { id, row, position, vocab });
                }
            }
        }
        // Needle 3's head scores only its text slice (`out_vocab`): a target past it has no logit.
        let rows = self.output_rows();
        match packing.scored().targets.iter().find(|&&id| id as usize >= rows) {
            Some(&id) => Err(ModelError::TargetOutsideHead { id, rows }),
            None => Ok(()),
        }
    }
}

/// The geometry constraints the reference assumes (it would fail in a reshape or an assert).
fn validate(cfg: &ModelConfig) -> Result<()> {
    cfg.validate()?;
    let invalid = |field, reason: String| Err(ModelError::InvalidConfig { field, reason });
    for (field, value) in [
        ("vocab_size", cfg.vocab_size),
        ("d_model", cfg.d_model),
        ("num_heads", cfg.num_heads),
        ("num_kv_heads", cfg.num_kv_heads),
        ("mhc_lanes", cfg.mhc_lanes),
    ] {
        if value == 0 {
            return invalid(field, "is 0; it must be ≥ 1".into());
        }
    }
    // Needle 2's heads (and Needle 3's when it leaves a width out) split `attn_dim`.
    let head_dim = cfg.head_dim();
    let legacy_odd = cfg.qk_head_dim == 0 && head_dim & 1 == 1;
    if (cfg.qk_head_dim == 0 || cfg.v_head_dim == 0)
        && (head_dim == 0 || head_dim * cfg.num_heads != cfg.attn_dim || legacy_odd)
    {
        return invalid(
            "attn_dim",
            format!("{} must split into {} heads of an even width", cfg.attn_dim, cfg.num_heads),
        );
    }
    if cfg.qk_head_dim & 1 == 1 {
        return invalid("qk_head_dim", format!("is {}; RoPE rotates halves, so it must be even", cfg.qk_head_dim));
    }
    if cfg.num_heads / cfg.num_kv_heads * cfg.num_kv_heads != cfg.num_heads {
        return invalid("num_kv_heads", format!("{} must divide num_heads {}", cfg.num_kv_heads, cfg.num_heads));
    }
    for (field, layers) in [("engram_layers", &cfg.engram_layers), ("global_layers", &cfg.global_layers)] {
        if let Some(layer) = layers.iter().find(|&&l| l >= cfg.num_layers) {
            return invalid(field, format!("names layer {layer} but the model has {} layers", cfg.num_layers));
        }
    }
    Ok(())
}

/// Checks the multi-token-prediction parameters' presence and shapes.
fn check_mtp(cfg: &ModelConfig, root: &ParamPath) -> Result<()> {
    let d = cfg.d_model;
    Block::new(cfg, 0, root.pp("mtp_block"))?;
    root.pp("mtp_combine").get(&[2 * d, d], "kernel")?;
    ZcRmsNorm::new(d, root.pp("mtp_emb_norm"))?;
    ZcRmsNorm::new(d, root.pp("mtp_final_norm"))?;
    Ok(())
}

/// Checks the probe heads a Needle 2 checkpoint may carry (the network does not run them).
fn check_needle2_heads(cfg: &ModelConfig, params: &Params, root: &ParamPath) -> Result<()> {
    if params.has_prefix("contrastive_head") {
        check_head(&root.pp("contrastive_head"), CONTRASTIVE_PROBES, cfg.d_model, cfg.contrastive_dim)?;
        root.pp("contrastive_head").get(&[], "log_temp")?;
    }
    if params.has_prefix("confidence_head") {
        check_head(&root.pp("confidence_head"), CONFIDENCE_PROBES, cfg.d_model, 1)?;
        root.pp("confidence_head").pp("proj").get(&[1], "bias")?;
    }
    Ok(())
}

/// Checks the probe heads a Needle 3 checkpoint may carry (3.x's `ProbeHead`s; the network does
/// not run them, the `.cact` ships them). Each pools a row per depth (the embedding, then every
/// block): `k` probes per row with their gains, `q` queries with a bias per row and probe, then
/// projects the `q` pooled rows; `k`, `q` and the output width are the head's own.
fn check_needle3_heads(cfg: &ModelConfig, params: &Params, root: &ParamPath) -> Result<()> {
    let (rows, d) = (cfg.num_layers + 1, cfg.d_model);
    for (key, bias) in [("embedding_head", false), ("confidence_head", true), ("router_head", true)] {
        if !params.has_prefix(key) {
            continue;
        }
        let head = root.pp(key);
        let proj = head.pp("proj");
        // Sizes read off the head's own arrays; a missing or misshapen one fails its `get` below.
        let k = head.dims("probes").and_then(|s| s.get(1).copied()).unwrap_or(0);
        let q = head.dims("query").and_then(|s| s.first().copied()).unwrap_or(0);
        let out = proj.dims("kernel").and_then(|s| s.get(1).copied()).unwrap_or(0);
        head.get(&[rows, k, d], "probes")?;
        head.get(&[rows, k], "gain")?;
        head.get(&[q, d], "query")?;
        head.get(&[q, rows, k], "row_bias")?;
        proj.get(&[q.saturating_mul(d), out], "kernel")?;
        if bias {
            proj.get(&[out], "bias")?;
        } else {
            head.get(&[], "log_temp")?;
            head.get(&[], "bias")?;
        }
        if head.dims("calibration").is_some() {
            head.get(&[3], "calibration")?;
        }
    }
    Ok(())
}

/// Checks a probe-pooling head's `probes` and `proj/kernel` shapes.
fn check_head(head: &ParamPath, probes: usize, d_model: usize, out: usize) -> Result<()> {
    head.get(&[probes, d_model], "probes")?;
    head.pp("proj").get(&[probes * d_model, out], "kernel")?;
    Ok(())
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
        let lora = crate::lora::Lora::init(&params, 4, 8.0, 0).unwrap();
        assert_eq!(lora.factors.len(), 5, "q, k, v, gate and out projections");
        let packing = Packing::new(&batch_rows(), true).unwrap();
        let (sum, count) = network.masked_ce_sum(&packing, Some(&lora.low_rank())).unwrap();
        let grads = (sum / count).unwrap().backward().unwrap();
        for factor in &lora.factors {
            // B starts at zero, so only B's gradient is non-zero before the first update.
            for (layer, b) in factor.b.iter().enumerate() {
                let grad =
                    grads.get(b.as_tensor()).unwrap_or_else(|| panic!("no gradient for {} B{layer}", factor.path));
                let size: f32 = grad.abs().unwrap().sum_all().unwrap().to_scalar().unwrap();
                assert!(size.is_finite() && size > 0.0, "{} B{layer}: |grad| {size}", factor.path);
            }
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
