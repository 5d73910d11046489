//! The weights of the whole network (the reference's `SimpleAttentionNetwork`): the embedding,
//! the engram sites and the layer stack, loaded from a [`Params`] source and checked against the
//! config; the heads a checkpoint may carry (multi-token prediction, contrastive, confidence,
//! router) are checked, not kept. The candle path computes it in `san/network.rs`, the CPU path
//! in `fast/network.rs`.

use std::path::Path;

use candle_core::{Device, Tensor};

use crate::checkpoint::Checkpoint;
use crate::config::ModelConfig;
use crate::generation::Generation;
use crate::model::norm::ZcRmsNorm;
use crate::model::packing::Packing;
use crate::model::params::{ParamPath, Params};
use crate::model::qat::Qat;
use crate::model::weights::block::Block;
use crate::model::weights::engram::{Engram, EngramGeometry};
use crate::model::weights::stack::Stack;
use crate::model::{ModelError, Result};
use crate::w4a8::NetworkCodes;

/// Probe counts of the reference's contrastive and confidence heads.
const CONTRASTIVE_PROBES: usize = 4;
const CONFIDENCE_PROBES: usize = 8;

#[derive(Debug, Clone)]
pub struct Network {
    pub(in crate::model) cfg: ModelConfig,
    /// `[vocab, d_model]`, also the (transposed) output projection.
    pub(in crate::model) embedding: Tensor,
    /// `None` when no layer has an engram site.
    pub(in crate::model) engram_geometry: Option<EngramGeometry>,
    pub(in crate::model) engrams: Vec<Engram>,
    pub(in crate::model) stack: Stack,
    pub(in crate::model) qat: Option<Qat>,
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

    /// The network run as W4A8 from `codes` (the `.cact`'s own, of these same weights): its
    /// attention, mHC and engram projections and its output head multiply them with 8-bit
    /// activations on the CPU path's integer kernels, its embedding and engram tables are looked
    /// up in them ([`crate::w4a8`]); everything else computes as before. Only the CPU path's
    /// forward reads them; the float tensors of those weights may be placeholders
    /// ([`crate::cact::reader::CactFile::params_beside_codes`]).
    pub fn with_codes(self, codes: NetworkCodes) -> Result<Self> {
        if codes.layers().len() != self.cfg.num_layers || codes.lanes().len() != self.cfg.num_layers {
            let reason = format!("has {} layers but the codes hold {}", self.cfg.num_layers, codes.layers().len());
            return Err(ModelError::InvalidConfig { field: "num_layers", reason });
        }
        if codes.engrams().len() != self.engrams.len() {
            let reason =
                format!("has {} engram sites but the codes hold {}", self.engrams.len(), codes.engrams().len());
            return Err(ModelError::InvalidConfig { field: "engram_layers", reason });
        }
        Ok(Self { codes: Some(codes), ..self })
    }

    /// The W4A8 codes, when the network runs from them.
    pub fn codes(&self) -> Option<&NetworkCodes> {
        self.codes.as_ref()
    }

    /// Fails, saying it cannot `what`, for a network that reads its CQ weights from their codes:
    /// its float tensors of them are placeholders that only the CPU path's forward passes over.
    pub(in crate::model) fn check_float_weights(&self, what: &str) -> Result<()> {
        match self.codes {
            None => Ok(()),
            Some(_) => Err(ModelError::Unsupported {
                what: format!("{what} with a W4A8 network: it runs from the .cact's codes, forward on the CPU only"),
            }),
        }
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

    /// The vocabulary rows the output head scores: Needle 3's `out_vocab` text slice, else all.
    pub fn output_rows(&self) -> usize {
        match self.cfg.out_vocab {
            0 => self.cfg.vocab_size,
            rows => rows,
        }
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
