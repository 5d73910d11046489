//! The whole network (the reference's `SimpleAttentionNetwork.__call__`): token ids → logits.

use std::path::Path;

use candle_core::{DType, Device, Tensor};

use super::attention::{causal_bias, Rope};
use super::block::Block;
use super::engram::{Engram, EngramGeometry, EngramLookup};
use super::norm::ZcRmsNorm;
use super::params::{ParamPath, Params};
use super::stack::Stack;
use super::{ModelError, Result};
use crate::checkpoint::Checkpoint;
use crate::config::ModelConfig;

/// Probe counts of the reference's contrastive and confidence heads.
const CONTRASTIVE_PROBES: usize = 4;
const CONFIDENCE_PROBES: usize = 8;

#[derive(Debug, Clone)]
pub struct Network {
    cfg: ModelConfig,
    /// `[vocab, d_model]`, also the (transposed) output projection.
    embedding: Tensor,
    engram_geometry: EngramGeometry,
    engrams: Vec<Engram>,
    stack: Stack,
}

impl Network {
    /// Builds the network from `params`, failing on any missing, misshapen or unused parameter.
    /// The multi-token-prediction block and the contrastive/confidence heads are optional (the
    /// reference's plain forward never reads them); when present they are checked, not kept.
    pub fn load(cfg: &ModelConfig, params: &Params) -> Result<Self> {
        let cfg = cfg.clone().resolved();
        validate(&cfg)?;
        let root = params.root();
        let engram_geometry = EngramGeometry::new(&cfg)?;
        let engrams = (0..cfg.engram_layers.len())
            .map(|s| Engram::new(&cfg, &engram_geometry, root.pp(&format!("engrams_{s}"))))
            .collect::<Result<_>>()?;
        let network = Self {
            embedding: root.pp("embedding").get(&[cfg.vocab_size, cfg.d_model], "embedding")?,
            stack: Stack::new(&cfg, root.pp("stack"))?,
            engram_geometry,
            engrams,
            cfg,
        };
        if ["mtp_block", "mtp_combine", "mtp_emb_norm", "mtp_final_norm"].iter().any(|p| params.has_prefix(p)) {
            check_mtp(&network.cfg, &root)?;
        }
        if params.has_prefix("contrastive_head") {
            check_head(&root.pp("contrastive_head"), CONTRASTIVE_PROBES, network.cfg.d_model, network.cfg.contrastive_dim)?;
            root.pp("contrastive_head").get(&[], "log_temp")?;
        }
        if params.has_prefix("confidence_head") {
            check_head(&root.pp("confidence_head"), CONFIDENCE_PROBES, network.cfg.d_model, 1)?;
            root.pp("confidence_head").pp("proj").get(&[1], "bias")?;
        }
        params.ensure_all_used()?;
        Ok(network)
    }

    /// The checkpoint's params (widened to f32) on `device`, shaped by its config.
    pub fn from_checkpoint(checkpoint: &Checkpoint, device: &Device) -> Result<Self> {
        Self::load(&checkpoint.config, &Params::from_checkpoint(checkpoint, device)?)
    }

    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    pub fn device(&self) -> &Device {
        self.embedding.device()
    }

    /// Fails when a tokenizer's vocabulary (read from `path`) is not this model's.
    pub fn check_tokenizer_vocab(&self, tokenizer_vocab: usize, path: &Path) -> Result<()> {
        if tokenizer_vocab == self.cfg.vocab_size {
            return Ok(());
        }
        Err(ModelError::VocabMismatch { path: path.into(), tokenizer_vocab, model_vocab: self.cfg.vocab_size })
    }

    /// Token ids `[B, T]` (any integer dtype) → logits `[B, T, vocab]` f32, under the causal mask
    /// only (padding is attended to, as in the reference's `__call__`).
    pub fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        let ids = ids.to_dtype(DType::U32)?;
        let rows = ids.to_vec2::<u32>()?;
        self.check_ids(&rows)?;
        let (b, t) = ids.dims2()?;
        let d = self.cfg.d_model;
        let device = self.device();

        let x = (self.embedding.index_select(&ids.flatten_all()?, 0)?.reshape((b, t, d))? * (d as f64).sqrt())?;
        let rope = Rope::new(self.cfg.head_dim(), t, self.cfg.rope_theta, device)?;
        let causal = causal_bias(t, device)?;
        let memories = if self.engrams.is_empty() {
            Vec::new()
        } else {
            let lookup = EngramLookup::new(&rows, &self.engram_geometry, device)?;
            self.engrams.iter().map(|e| e.forward(&lookup)).collect::<Result<_>>()?
        };
        let hidden = self.stack.forward(&x, &rope, &causal, &memories)?;
        Ok(hidden.broadcast_matmul(&self.embedding.t()?)?)
    }

    fn check_ids(&self, rows: &[Vec<u32>]) -> Result<()> {
        let vocab = self.cfg.vocab_size;
        for (row, ids) in rows.iter().enumerate() {
            if let Some(position) = ids.iter().position(|&id| id as usize >= vocab) {
                return Err(ModelError::TokenOutOfRange { id: ids[position], row, position, vocab });
            }
        }
        Ok(())
    }
}

/// The geometry constraints the reference assumes (it would fail in a reshape or an assert).
fn validate(cfg: &ModelConfig) -> Result<()> {
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
    if cfg.attn_dim % cfg.num_heads != 0 || cfg.head_dim() % 2 != 0 || cfg.head_dim() == 0 {
        return invalid("attn_dim", format!("{} must split into {} heads of an even width", cfg.attn_dim, cfg.num_heads));
    }
    if cfg.num_heads % cfg.num_kv_heads != 0 {
        return invalid("num_kv_heads", format!("{} must divide num_heads {}", cfg.num_kv_heads, cfg.num_heads));
    }
    if let Some(layer) = cfg.engram_layers.iter().find(|&&l| l >= cfg.num_layers) {
        return invalid("engram_layers", format!("names layer {layer} but the model has {} layers", cfg.num_layers));
    }
    Ok(())
}

/// Checks the multi-token-prediction parameters' presence and shapes.
fn check_mtp(cfg: &ModelConfig, root: &ParamPath) -> Result<()> {
    let d = cfg.d_model;
    Block::new(cfg, root.pp("mtp_block"))?;
    root.pp("mtp_combine").get(&[2 * d, d], "kernel")?;
    ZcRmsNorm::new(d, root.pp("mtp_emb_norm"))?;
    ZcRmsNorm::new(d, root.pp("mtp_final_norm"))?;
    Ok(())
}

/// Checks a probe-pooling head's `probes` and `proj/kernel` shapes.
fn check_head(head: &ParamPath, probes: usize, d_model: usize, out: usize) -> Result<()> {
    head.get(&[probes, d_model], "probes")?;
    head.pp("proj").get(&[probes * d_model, out], "kernel")?;
    Ok(())
}
