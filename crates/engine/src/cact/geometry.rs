//! The architecture numbers a `.cact` header carries, derived from a [`ModelConfig`] as the
//! reference's `_geometry`, `_pack_cact` and `effective_kv_window` derive them. Every width comes
//! from the config's own methods (the network asks the same ones); what is here is what the format
//! adds: its list limits and the KV window.

use thiserror::Error;

use crate::config::{ConfigError, EngramDims, ModelConfig};

/// The header has room for this many engram orders and this many engram sites.
pub const MAX_HEADER_LIST: usize = 4;

/// The runtime's KV-cache budget the default window is sized from.
const KV_BUDGET_BYTES: usize = 11 * 1024 * 1024 + 512 * 1024;
const KV_GROUP: usize = 32;
const KV_WINDOW_MIN: usize = 160;

/// A config the `.cact` format cannot describe.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum GeometryError {
    #[error("config field {0}")]
    Config(#[from] ConfigError),
    #[error("config field `{field}` is 0; a Needle 2 model needs at least one (check the checkpoint's config)")]
    Zero { field: &'static str },
    #[error("config gives `{what}` a size beyond 64 bits (check the checkpoint's config)")]
    Overflow { what: &'static str },
    #[error("config field `{field}` lists {count} entries but the .cact header holds at most {MAX_HEADER_LIST}")]
    TooMany { field: &'static str, count: usize },
    #[error("config gives engram site {site} but the model has only {num_layers} layers")]
    SiteOutOfRange { site: usize, num_layers: usize },
}

/// Derived geometry of one model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Geometry {
    pub head_dim: usize,
    pub orders: Vec<usize>,
    pub engram: EngramDims,
    pub sites: Vec<usize>,
    /// The Hadamard MLP's width ([`ModelConfig::hadamard_width`]).
    pub hada_n: usize,
}

impl Geometry {
    pub fn of(config: &ModelConfig) -> Result<Self, GeometryError> {
        config.validate()?;
        for (field, count) in
            [("engram_orders", config.engram_orders.len()), ("engram_layers", config.engram_layers.len())]
        {
            if count > MAX_HEADER_LIST {
                return Err(GeometryError::TooMany { field, count });
            }
        }
        if let Some(&site) = config.engram_layers.iter().find(|&&s| s >= config.num_layers) {
            return Err(GeometryError::SiteOutOfRange { site, num_layers: config.num_layers });
        }
        let engram = config.engram_dims()?;
        let head_dim = config.head_dim();
        if head_dim == 0 {
            return Err(GeometryError::Zero { field: "head_dim (attn_dim / num_heads)" });
        }
        Ok(Self {
            head_dim,
            orders: config.engram_orders.clone(),
            engram,
            sites: config.engram_layers.clone(),
            hada_n: config.hadamard_width(),
        })
    }
}

/// The reference's `kv_budget_window`: the widest multiple of 32 positions whose KV cache (every
/// layer's keys and values plus each engram site's row, int8 with a scale per 32) fits the budget.
pub fn kv_budget_window(config: &ModelConfig) -> Result<usize, GeometryError> {
    config.validate()?;
    let (kv, d) = (config.kv_dim(), config.d_model);
    let per_layer = kv.checked_add(kv / KV_GROUP * 4).and_then(|n| n.checked_mul(2));
    let per_site = d.checked_add(d / KV_GROUP * 4);
    let per_pos = per_layer
        .and_then(|n| n.checked_mul(config.num_layers))
        .zip(per_site.and_then(|n| n.checked_mul(config.engram_layers.len())))
        .and_then(|(layers, sites)| layers.checked_add(sites))
        .ok_or(GeometryError::Overflow { what: "KV bytes per position" })?;
    let window = KV_BUDGET_BYTES
        .checked_div(per_pos)
        .ok_or(GeometryError::Zero { field: "num_layers × num_kv_heads (KV bytes per position)" })?
        / KV_GROUP
        * KV_GROUP;
    Ok(window.min(config.max_seq_len).max(KV_WINDOW_MIN))
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
        assert_eq!((g.head_dim, g.engram.heads, g.engram.sub_dim, g.hada_n), (64, 3, 128, 1024));
        // per position: 27 * (2*384 + 2*12*4) + 2 * (768 + 24*4) = 25056 bytes -> 480 positions.
        assert_eq!(kv_budget_window(&cfg).unwrap(), 480);
        assert_eq!(effective_kv_window(&ModelConfig { kv_window: 256, ..cfg.clone() }).unwrap(), 256);
        assert_eq!(effective_kv_window(&ModelConfig { kv_window: 4096, ..cfg }).unwrap(), 480);
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
