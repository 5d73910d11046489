//! The weights of the engram memories: how the hashed n-gram tables are laid out, which row of
//! them each packed token reads (the reference's hash, shared by both paths), and each site's
//! table and projections (computed in `san/engram.rs` and `fast/engram.rs`).

use candle_core::Tensor;

use crate::config::{ConfigError, EngramDims, ModelConfig, ENGRAM_CONV_TAPS};
use crate::model::packing::Packing;
use crate::model::params::ParamPath;
use crate::model::qat::Qat;
use crate::model::{ModelError, Result};

const HASH_SEED: u32 = 0x9E37_79B9;
const HASH_PRIME: u32 = 0x0100_0193;

/// How the engram tables are laid out (the reference's `engram_geometry`, see
/// [`ModelConfig::engram_dims`]) and how many slots each has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngramGeometry {
    pub orders: Vec<usize>,
    pub dims: EngramDims,
    pub slots: usize,
    /// The hash seeds' stride over heads: `engram_seed_heads` when set (a width-sliced Needle 3
    /// keeps its parent's seeds), else the heads per order.
    pub seed_stride: usize,
}

impl EngramGeometry {
    pub fn new(cfg: &ModelConfig) -> Result<Self> {
        let dims = cfg.engram_dims()?;
        // The lookups index the flattened `[tables · slots, sub_dim]` table with u32 ids.
        if dims.tables.checked_mul(cfg.engram_slots).is_none_or(|rows| rows == 0 || rows > u32::MAX as usize) {
            return Err(ModelError::InvalidConfig {
                field: "engram_slots",
                reason: format!(
                    "is {0}: {1} tables × {0} slots must come to between 1 and {2} rows (the lookups' u32 ids)",
                    cfg.engram_slots,
                    dims.tables,
                    u32::MAX
                ),
            });
        }
        let seed_stride = if cfg.engram_seed_heads == 0 { dims.heads } else { cfg.engram_seed_heads };
        Ok(Self { orders: cfg.engram_orders.clone(), dims, slots: cfg.engram_slots, seed_stride })
    }

    /// Earlier tokens one position's memory reads: the convolution's reach back plus its n-gram's,
    /// so a decoding step recomputes memories from this many tokens of history only.
    pub fn window(&self) -> usize {
        ENGRAM_CONV_TAPS * self.dims.dilation
    }
}

/// The table slot of every (packed token, table), row-major `[N, tables]`, exactly as the
/// reference's `engram_indices`: an FNV-style hash over the last `order` tokens of the token's row in
/// u32 arithmetic with wrap-around, tokens before the row's start reading as 0.
pub fn engram_indices(packing: &Packing, geometry: &EngramGeometry) -> Vec<u32> {
    let (tables, heads) = (geometry.dims.tables, geometry.dims.heads);
    let mut out = Vec::with_capacity(packing.len() * tables);
    for i in 0..packing.len() {
        for (oi, &order) in geometry.orders.iter().enumerate() {
            for h in 0..heads {
                let seed = HASH_SEED.wrapping_mul((oi * geometry.seed_stride + h + 1) as u32);
                let acc = (0..order).fold(seed, |acc, j| {
                    let token = packing.earlier(i, j).map_or(0, |p| packing.ids[p]);
                    (acc ^ token).wrapping_mul(HASH_PRIME)
                });
                out.push((acc ^ (acc >> 15)) % geometry.slots as u32);
            }
        }
    }
    out
}

/// The row of the flattened `[tables · slots, sub_dim]` table each (packed token, table) reads,
/// row-major `[N, tables]` (`table · slots + slot`, the slot from [`engram_indices`]), or `None` where
/// the table's n-gram would reach before the row's start (the reference's
/// `_mask_diag(causal, order − 1)`): what every site looks up, on either path.
pub fn engram_rows(packing: &Packing, geometry: &EngramGeometry) -> Vec<Option<u32>> {
    let tables = geometry.dims.tables;
    engram_indices(packing, geometry)
        .into_iter()
        .enumerate()
        .map(|(k, slot)| {
            let (i, table) = (k / tables, k % tables);
            let order = geometry.orders[table / geometry.dims.heads];
            (packing.positions[i] as usize + 1 >= order).then_some((table * geometry.slots) as u32 + slot)
        })
        .collect()
}

/// A config problem is a model config problem, reported by the field's name.
impl From<ConfigError> for ModelError {
    fn from(e: ConfigError) -> Self {
        ModelError::InvalidConfig { field: e.field, reason: e.problem }
    }
}

/// One engram site (the reference's `engrams_<i>` module).
#[derive(Debug, Clone)]
pub struct Engram {
    /// `[tables, slots, sub_dim]`, looked up with tables and slots flattened.
    pub(in crate::model) embedding: Tensor,
    pub(in crate::model) key_proj: Tensor,
    pub(in crate::model) value_proj: Tensor,
    /// `[ENGRAM_CONV_TAPS, d_model]`, tap `j` reading `j · dilation` positions back.
    pub(in crate::model) taps: Tensor,
    pub(in crate::model) geometry: EngramGeometry,
    pub(in crate::model) qat: Option<Qat>,
}

impl Engram {
    pub fn new(cfg: &ModelConfig, geometry: &EngramGeometry, vb: ParamPath) -> Result<Self> {
        let (dims, d) = (&geometry.dims, cfg.d_model);
        Ok(Self {
            embedding: vb.get(&[dims.tables, geometry.slots, dims.sub_dim], "embedding")?,
            // The projections read the concatenated table entries, which may be narrower than d_model.
            key_proj: vb.pp("key_proj").get(&[dims.width(), d], "kernel")?,
            value_proj: vb.pp("value_proj").get(&[dims.width(), d], "kernel")?,
            taps: vb.get(&[ENGRAM_CONV_TAPS, d], "taps")?,
            geometry: geometry.clone(),
            qat: vb.qat(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataset::Encoded;

    fn geometry(orders: Vec<usize>, heads: usize, slots: usize) -> EngramGeometry {
        let (tables, dilation) = (orders.len() * heads, orders.iter().copied().max().unwrap_or(1));
        EngramGeometry { orders, dims: EngramDims { heads, tables, sub_dim: 1, dilation }, slots, seed_stride: heads }
    }

    #[test]
    fn indices_match_the_reference_hash_with_u32_wraparound() {
        // Values printed by the reference's `engram_indices(jnp.array([[5, 7, 4000000000]]), (2, 3), 2, 8192)`.
        let row = Encoded { ids: vec![5, 7, 4_000_000_000], mask: vec![0.0; 3], truncated: false };
        let got = engram_indices(&Packing::new(&[row], false).unwrap(), &geometry(vec![2, 3], 2, 8192));
        assert_eq!(got, REFERENCE_INDICES);
    }
    const REFERENCE_INDICES: [u32; 12] = [1637, 1314, 5792, 3524, 78, 2045, 409, 5733, 3831, 5213, 728, 4871];

    #[test]
    fn geometry_defaults_to_128_wide_tables_per_order() {
        let cfg = ModelConfig { d_model: 768, ..ModelConfig::default() };
        let g = EngramGeometry::new(&cfg).unwrap();
        assert_eq!((g.dims.heads, g.dims.sub_dim, g.dims.tables, g.window()), (3, 128, 6, 12));
        let bad = ModelConfig { engram_orders: vec![], ..ModelConfig::default() };
        assert!(matches!(EngramGeometry::new(&bad), Err(ModelError::InvalidConfig { field: "engram_orders", .. })));
    }

    #[test]
    fn a_head_count_that_wraps_is_an_error_not_a_division_by_zero() {
        // 4 orders × 2^62 heads wraps to 0 tables in unchecked arithmetic.
        let cfg = ModelConfig { engram_orders: vec![2, 3, 4, 5], engram_heads: 1 << 62, ..ModelConfig::default() };
        let err = EngramGeometry::new(&cfg).unwrap_err();
        assert!(matches!(err, ModelError::InvalidConfig { field: "engram_heads", .. }), "{err}");
        // Within the config's ranges, a flattened table too tall for u32 ids is refused too.
        let tall = ModelConfig {
            engram_heads: 1024,
            engram_orders: vec![2; 16],
            d_model: 1 << 16,
            engram_slots: 1 << 24,
            ..ModelConfig::default()
        };
        let err = EngramGeometry::new(&tall).unwrap_err();
        assert!(matches!(err, ModelError::InvalidConfig { field: "engram_slots", .. }), "{err}");
    }
}
