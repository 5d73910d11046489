//! The architecture numbers a `.cact` header carries, derived from a [`ModelConfig`] as the
//! reference's `_geometry`, `_pack_cact` and `effective_kv_window` derive them, and the config a
//! header describes, read backwards. Every width comes from the config's own methods (the network
//! asks the same ones); what is here is what the format adds: its limits and the KV window.

use thiserror::Error;

use super::format::{list_slots, Header};
use crate::config::{ConfigError, EngramDims, ModelConfig, ENGRAM_CONV_TAPS};
use crate::generation::Generation;

/// A Needle 3 header's layer mask has a bit for each of this many layers.
const MASK_LAYERS: usize = 64;

/// The runtime's KV-cache budget the default window is sized from.
const KV_BUDGET_BYTES: usize = 11 * 1024 * 1024 + 512 * 1024;
const KV_GROUP: usize = 32;
const KV_WINDOW_MIN: usize = 160;

/// A config the `.cact` format cannot describe.
#[derive(Debug, Clone, Error, PartialEq, Eq)]
pub enum GeometryError {
    #[error("config field {0}")]
    Config(#[from] ConfigError),
    #[error("config field `{field}` is 0; a Needle model needs at least one (check the checkpoint's config)")]
    Zero { field: &'static str },
    #[error("config gives `{what}` a size beyond 64 bits (check the checkpoint's config)")]
    Overflow { what: &'static str },
    #[error("config field `{field}` lists {count} entries but the {generation} .cact header holds at most {max}")]
    TooMany { field: &'static str, count: usize, max: usize, generation: Generation },
    #[error("config gives engram site {site} but the model has only {num_layers} layers")]
    SiteOutOfRange { site: usize, num_layers: usize },
    #[error("config lists global layer {layer} but the model has only {num_layers} layers (and the .cact header's mask {MASK_LAYERS})")]
    GlobalOutOfRange { layer: usize, num_layers: usize },
    #[error("{what} = {value} does not fit the .cact header's u32 field")]
    TooLarge { what: &'static str, value: usize },
}

/// Derived geometry of one model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Geometry {
    /// Per-head width of queries and keys, and of values.
    pub head_dims: (usize, usize),
    pub engram: EngramDims,
    /// The Hadamard MLP's width ([`ModelConfig::hadamard_width`]).
    pub hada_n: usize,
}

impl Geometry {
    pub fn of(config: &ModelConfig) -> Result<Self, GeometryError> {
        config.validate()?;
        let generation = config.generation;
        for (field, header_field, count) in [
            ("engram_orders", "num_engram_orders", config.engram_orders.len()),
            ("engram_layers", "num_engram_sites", config.engram_layers.len()),
        ] {
            let max = list_slots(generation, header_field);
            if count > max {
                return Err(GeometryError::TooMany { field, count, max, generation });
            }
        }
        if let Some(&site) = config.engram_layers.iter().find(|&&s| s >= config.num_layers) {
            return Err(GeometryError::SiteOutOfRange { site, num_layers: config.num_layers });
        }
        let limit = config.num_layers.min(MASK_LAYERS);
        if let Some(&layer) = config.global_layers.iter().find(|&&l| l >= limit) {
            return Err(GeometryError::GlobalOutOfRange { layer, num_layers: config.num_layers });
        }
        let engram = config.engram_dims()?;
        let head_dims = (config.qk_head_dim(), config.v_head_dim());
        if head_dims.0 == 0 || head_dims.1 == 0 {
            return Err(GeometryError::Zero { field: "head_dim (attn_dim / num_heads)" });
        }
        Ok(Self { head_dims, engram, hada_n: config.hadamard_width() })
    }

    /// The header of a model of `config` whose file holds `num_tensors` tensors.
    pub fn header(
        &self,
        config: &ModelConfig,
        num_tensors: usize,
        codebook_len: usize,
    ) -> Result<Header, GeometryError> {
        let word = |what: &'static str, value: usize| {
            u32::try_from(value).map_err(|_| GeometryError::TooLarge { what, value })
        };
        let list =
            |what: &'static str, values: &[usize]| values.iter().map(|&v| word(what, v)).collect::<Result<Vec<_>, _>>();
        Ok(Header {
            generation: config.generation,
            num_tensors: word("num_tensors", num_tensors)?,
            codebook_len: word("codebook_len", codebook_len)?,
            kv_window: word("kv_window", effective_kv_window(config)?)?,
            kv_bits: if config.kv_bits == 0 { 8 } else { config.kv_bits },
            vocab_size: word("vocab_size", config.vocab_size)?,
            out_vocab: word("out_vocab", config.out_vocab)?,
            d_model: word("d_model", config.d_model)?,
            num_heads: word("num_heads", config.num_heads)?,
            num_kv_heads: word("num_kv_heads", config.num_kv_heads)?,
            num_layers: word("num_layers", config.num_layers)?,
            head_dim: word("head_dim", self.head_dims.0)?,
            v_head_dim: word("v_head_dim", self.head_dims.1)?,
            max_seq_len: word("max_seq_len", config.max_seq_len)?,
            hada_n: word("hada_n", self.hada_n)?,
            mhc_lanes: word("mhc_lanes", config.mhc_lanes)?,
            sliding_window: word("sliding_window", config.sliding_window)?,
            // In range: `of` checked every global layer against the mask's width.
            global_layers: config.global_layers.iter().fold(0, |mask, &l| mask | (1u64 << l)),
            qkv_conv_taps: word("qkv_conv_taps", config.qkv_conv_taps)?,
            engram_slots: word("engram_slots", config.engram_slots)?,
            engram_sub_dim: word("engram_sub_dim", self.engram.sub_dim)?,
            num_engram_tables: word("num_engram_tables", self.engram.tables)?,
            engram_conv_taps: word("engram_conv_taps", ENGRAM_CONV_TAPS)?,
            engram_conv_dilation: word("engram_conv_dilation", self.engram.dilation)?,
            engram_seed_heads: word("engram_seed_heads", config.engram_seed_heads)?,
            engram_orders: list("engram_orders", &config.engram_orders)?,
            engram_layers: list("engram_layers", &config.engram_layers)?,
            rope_theta: config.rope_theta as f32,
        })
    }
}

/// The model config a header describes (the fields a forward pass reads): what the writer put in,
/// read backwards. A Needle 2 header leaves Needle 3's fields at the values that turn them off.
pub fn model_config(h: &Header) -> ModelConfig {
    let orders: Vec<usize> = h.engram_orders.iter().map(|&o| o as usize).collect();
    let base = ModelConfig::defaults_for(h.generation);
    ModelConfig {
        vocab_size: h.vocab_size as usize,
        d_model: h.d_model as usize,
        // Two u32s multiply exactly in a u64; a width no usize holds is refused by the config's checks.
        attn_dim: usize::try_from(u64::from(h.num_heads) * u64::from(h.head_dim)).unwrap_or(usize::MAX),
        num_heads: h.num_heads as usize,
        num_kv_heads: h.num_kv_heads as usize,
        num_layers: h.num_layers as usize,
        max_seq_len: h.max_seq_len as usize,
        rope_theta: f64::from(h.rope_theta),
        engram_heads: (h.num_engram_tables as usize).checked_div(orders.len()).unwrap_or(0),
        engram_orders: orders,
        engram_slots: h.engram_slots as usize,
        engram_layers: h.engram_layers.iter().map(|&l| l as usize).collect(),
        mhc_lanes: h.mhc_lanes as usize,
        kv_window: h.kv_window as usize,
        kv_bits: h.kv_bits,
        // A v2 header's head width is the one width of every head; v3's is the queries' and keys'.
        qk_head_dim: match h.generation {
            Generation::Needle2 => 0,
            Generation::Needle3 => h.head_dim as usize,
        },
        v_head_dim: h.v_head_dim as usize,
        sliding_window: h.sliding_window as usize,
        global_layers: (0..MASK_LAYERS).filter(|&l| h.global_layers >> l & 1 == 1).collect(),
        qkv_conv_taps: h.qkv_conv_taps as usize,
        out_vocab: h.out_vocab as usize,
        engram_seed_heads: h.engram_seed_heads as usize,
        ..base
    }
}

/// The reference's `kv_budget_window`: the widest multiple of 32 positions whose KV cache (every
/// layer's keys and values plus each engram site's row, int8 with a scale per 32) fits the budget.
/// With a sliding window, the windowed layers' share is fixed and the global layers get what is left.
pub fn kv_budget_window(config: &ModelConfig) -> Result<usize, GeometryError> {
    config.validate()?;
    let overflow = GeometryError::Overflow { what: "KV bytes per position" };
    let kd = config.num_kv_heads.checked_mul(config.qk_head_dim()).ok_or(overflow.clone())?;
    let vd = config.num_kv_heads.checked_mul(config.v_head_dim()).ok_or(overflow.clone())?;
    let d = config.d_model;
    let per_layer = kd + vd + (kd / KV_GROUP + vd / KV_GROUP) * 4;
    let per_site = d + d / KV_GROUP * 4;
    let sites = config.engram_layers.len();
    let layers = config.num_layers;
    let max = config.max_seq_len;
    let zero = GeometryError::Zero { field: "num_layers × num_kv_heads (KV bytes per position)" };
    if config.sliding_window > 0 {
        let globals = config.global_layers.len();
        let local = config.sliding_window.min(max);
        let fixed = layers
            .saturating_sub(globals)
            .checked_mul(per_layer)
            .zip(sites.checked_mul(per_site))
            .and_then(|(l, s)| l.checked_add(s))
            .and_then(|n| n.checked_mul(local))
            .ok_or(overflow)?;
        if globals == 0 {
            return Ok(if fixed <= KV_BUDGET_BYTES { max } else { local.max(KV_WINDOW_MIN) });
        }
        // No room left (Python's floor division goes negative) means the minimum window.
        let room = KV_BUDGET_BYTES.saturating_sub(fixed);
        let ctx = room.checked_div(globals * per_layer).ok_or(zero)? / KV_GROUP * KV_GROUP;
        return Ok(ctx.min(max).max(KV_WINDOW_MIN));
    }
    let per_pos = per_layer
        .checked_mul(layers)
        .zip(per_site.checked_mul(sites))
        .and_then(|(l, s)| l.checked_add(s))
        .ok_or(overflow)?;
    let window = KV_BUDGET_BYTES.checked_div(per_pos).ok_or(zero)? / KV_GROUP * KV_GROUP;
    Ok(window.min(max).max(KV_WINDOW_MIN))
}

/// The reference's `effective_kv_window`: the trained window if set, capped by the budget.
pub fn effective_kv_window(config: &ModelConfig) -> Result<usize, GeometryError> {
    let budget = kv_budget_window(config)?;
    Ok(if config.kv_window == 0 { budget } else { budget.min(config.kv_window) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_size_needle_geometry_and_kv_window() {
        let cfg =
            ModelConfig { d_model: 768, num_layers: 27, num_heads: 12, num_kv_heads: 6, ..ModelConfig::default() };
        let g = Geometry::of(&cfg).unwrap();
        assert_eq!((g.head_dims.0, g.engram.heads, g.engram.sub_dim, g.hada_n), (64, 3, 128, 1024));
        // per position: 27 * (2*384 + 2*12*4) + 2 * (768 + 24*4) = 25056 bytes -> 480 positions.
        assert_eq!(kv_budget_window(&cfg).unwrap(), 480);
        assert_eq!(effective_kv_window(&ModelConfig { kv_window: 256, ..cfg.clone() }).unwrap(), 256);
        assert_eq!(effective_kv_window(&ModelConfig { kv_window: 4096, ..cfg }).unwrap(), 480);
    }

    #[test]
    fn needle3_kv_window_gives_the_global_layers_what_the_windowed_ones_leave() {
        // 3.2.8's `kv_budget_window(TransformerConfig())`, and with no global layer.
        let cfg = ModelConfig::needle3();
        assert_eq!(kv_budget_window(&cfg).unwrap(), 3456);
        assert_eq!(kv_budget_window(&ModelConfig { global_layers: vec![], ..cfg.clone() }).unwrap(), 4096);
        let g = Geometry::of(&cfg).unwrap();
        let header = g.header(&cfg, 300, 28).unwrap();
        assert_eq!(
            (header.head_dim, header.v_head_dim, header.global_layers),
            (48, 64, (1 << 4) | (1 << 9) | (1 << 14) | (1 << 19))
        );
        let deep = ModelConfig { global_layers: vec![70], num_layers: 80, ..cfg };
        assert!(matches!(Geometry::of(&deep), Err(GeometryError::GlobalOutOfRange { layer: 70, .. })));
    }

    #[test]
    fn impossible_configs_are_errors_not_panics() {
        let zero_heads = ModelConfig { num_heads: 0, ..ModelConfig::default() };
        assert!(matches!(Geometry::of(&zero_heads), Err(GeometryError::Config(e)) if e.field == "num_heads"));
        assert!(kv_budget_window(&zero_heads).is_err());
        let no_kv = ModelConfig { num_layers: 0, engram_layers: vec![], ..ModelConfig::default() };
        assert!(kv_budget_window(&no_kv).is_err());
        let narrow_heads = ModelConfig { attn_dim: 4, num_heads: 8, ..ModelConfig::needle2() };
        assert!(matches!(Geometry::of(&narrow_heads), Err(GeometryError::Zero { .. })));
        let lanes = ModelConfig { mhc_lanes: 1 << 40, ..ModelConfig::default() };
        assert!(matches!(Geometry::of(&lanes), Err(GeometryError::Config(e)) if e.field == "mhc_lanes"));
        // 4 orders × 2^62 heads wraps to 0 tables in unchecked arithmetic; the range check stops it first.
        let wrap = ModelConfig { engram_orders: vec![2, 3, 4, 5], engram_heads: 1 << 62, ..ModelConfig::default() };
        let err = Geometry::of(&wrap).unwrap_err();
        assert!(err.to_string().contains("`engram_heads` is 4611686018427387904"), "{err}");
        let bad_site = ModelConfig { num_layers: 2, engram_layers: vec![5], ..ModelConfig::default() };
        assert!(matches!(Geometry::of(&bad_site), Err(GeometryError::SiteOutOfRange { site: 5, .. })));
    }
}
