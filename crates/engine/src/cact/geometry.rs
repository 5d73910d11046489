//! The architecture numbers a `.cact` header carries, derived from a [`ModelConfig`] exactly as the
//! reference's `_geometry`, `_pack_cact` and `effective_kv_window` derive them.

use thiserror::Error;

use crate::config::ModelConfig;

/// Width of one engram sub-table when the config leaves `engram_heads` at 0.
const ENGRAM_SUB_DIM: usize = 128;
/// Causal-conv taps of every engram site (fixed by the architecture).
pub const ENGRAM_CONV_TAPS: usize = 4;
/// The header has room for this many engram orders and this many engram sites.
pub const MAX_HEADER_LIST: usize = 4;

/// The runtime's KV-cache budget the default window is sized from.
const KV_BUDGET_BYTES: usize = 11 * 1024 * 1024 + 512 * 1024;
const KV_GROUP: usize = 32;
const KV_WINDOW_MIN: usize = 160;

/// A config the `.cact` format cannot describe.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum GeometryError {
    #[error("config field `{field}` is 0; a Needle 2 model needs at least one (check the checkpoint's config)")]
    Zero { field: &'static str },
    #[error("config field `{field}` lists {count} entries but the .cact header holds at most {MAX_HEADER_LIST}")]
    TooMany { field: &'static str, count: usize },
    #[error("config field `{field}` = {value} does not fit the header's u32")]
    TooLarge { field: &'static str, value: usize },
    #[error("config gives engram site {site} but the model has only {num_layers} layers")]
    SiteOutOfRange { site: usize, num_layers: usize },
}

/// Derived geometry of one model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Geometry {
    pub head_dim: usize,
    pub orders: Vec<usize>,
    /// Engram heads per order.
    pub engram_heads: usize,
    pub engram_sub_dim: usize,
    pub sites: Vec<usize>,
    /// Next power of two ≥ d_model: the Hadamard MLP's width.
    pub hada_n: usize,
}

impl Geometry {
    pub fn of(config: &ModelConfig) -> Result<Self, GeometryError> {
        for (field, value) in [
            ("num_heads", config.num_heads),
            ("d_model", config.d_model),
            ("engram_orders", config.engram_orders.len()),
        ] {
            if value == 0 {
                return Err(GeometryError::Zero { field });
            }
        }
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
        let attn_dim = if config.attn_dim == 0 { config.d_model } else { config.attn_dim };
        let n_orders = config.engram_orders.len();
        let engram_heads = if config.engram_heads == 0 {
            (config.d_model / (n_orders * ENGRAM_SUB_DIM)).max(1)
        } else {
            config.engram_heads
        };
        let engram_sub_dim = config.d_model / (n_orders * engram_heads);
        if engram_sub_dim == 0 {
            return Err(GeometryError::Zero { field: "d_model / (engram orders × engram_heads)" });
        }
        Ok(Self {
            head_dim: attn_dim / config.num_heads,
            orders: config.engram_orders.clone(),
            engram_heads,
            engram_sub_dim,
            sites: config.engram_layers.clone(),
            hada_n: config.d_model.next_power_of_two(),
        })
    }

    /// Engram hash tables per site: one per (order, head).
    pub fn num_engram_tables(&self) -> usize {
        self.orders.len() * self.engram_heads
    }
}

/// The reference's `kv_budget_window`: the widest multiple of 32 positions whose KV cache (every
/// layer's keys and values plus each engram site's row, int8 with a scale per 32) fits the budget.
pub fn kv_budget_window(config: &ModelConfig) -> Result<usize, GeometryError> {
    if config.num_heads == 0 {
        return Err(GeometryError::Zero { field: "num_heads" });
    }
    let attn_dim = if config.attn_dim == 0 { config.d_model } else { config.attn_dim };
    let kv = config.num_kv_heads * (attn_dim / config.num_heads);
    let d = config.d_model;
    let per_pos =
        config.num_layers * (2 * kv + 2 * (kv / KV_GROUP) * 4) + config.engram_layers.len() * (d + (d / KV_GROUP) * 4);
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
        assert_eq!((g.head_dim, g.engram_heads, g.engram_sub_dim, g.hada_n), (64, 3, 128, 1024));
        // per position: 27 * (2*384 + 2*12*4) + 2 * (768 + 24*4) = 25056 bytes -> 480 positions.
        assert_eq!(kv_budget_window(&cfg).unwrap(), 480);
        assert_eq!(effective_kv_window(&ModelConfig { kv_window: 256, ..cfg.clone() }).unwrap(), 256);
        assert_eq!(effective_kv_window(&ModelConfig { kv_window: 4096, ..cfg }).unwrap(), 480);
    }

    #[test]
    fn impossible_configs_are_errors_not_panics() {
        let zero_heads = ModelConfig { num_heads: 0, ..ModelConfig::default() };
        assert_eq!(Geometry::of(&zero_heads), Err(GeometryError::Zero { field: "num_heads" }));
        assert!(kv_budget_window(&zero_heads).is_err());
        let no_kv = ModelConfig { num_layers: 0, engram_layers: vec![], ..ModelConfig::default() };
        assert!(kv_budget_window(&no_kv).is_err());
        let bad_site = ModelConfig { num_layers: 2, engram_layers: vec![5], ..ModelConfig::default() };
        assert!(matches!(Geometry::of(&bad_site), Err(GeometryError::SiteOutOfRange { site: 5, .. })));
    }
}
