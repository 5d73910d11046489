//! Needle 3's depth ladder at build time (3.x's `rung`, `ladder_slice`, `ladder_config`): every
//! depth from 2 to the full stack is a trained subnetwork, the blocks joining in a fixed order —
//! both ends first, then the middle of the widest gap, again and again — so a shallower rung keeps
//! the blocks of every deeper one. `needle build --layers N` keeps the first `N` blocks of that order
//! (in depth order) with the engram sites, global layers and probe-head rows that belong to them.

use std::collections::BTreeMap;

use super::needle3;
use crate::checkpoint::{Checkpoint, NdArray};
use crate::config::ModelConfig;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LadderError {
    #[error("--layers must be in [2, {num_layers}], got {layers}")]
    Depth { layers: usize, num_layers: usize },
    #[error("the config's ladder_order {order:?} is not a permutation of its {num_layers} blocks")]
    Order { order: Vec<usize>, num_layers: usize },
    #[error("parameter `{path}` has shape {shape:?}; it has no axis {axis} with an entry per {what}")]
    Axis { path: String, shape: Vec<usize>, axis: usize, what: &'static str },
}

/// The order blocks join the ladder in: the config's saved one, else the bisection order.
pub fn ladder_order(config: &ModelConfig) -> Result<Vec<usize>, LadderError> {
    let n = config.num_layers;
    if !config.ladder_order.is_empty() {
        let mut sorted = config.ladder_order.clone();
        sorted.sort_unstable();
        if sorted != (0..n).collect::<Vec<_>>() {
            return Err(LadderError::Order { order: config.ladder_order.clone(), num_layers: n });
        }
        return Ok(config.ladder_order.clone());
    }
    if n <= 1 {
        return Ok((0..n).collect());
    }
    let mut selected = vec![0, n - 1];
    let mut order = selected.clone();
    while order.len() < n {
        selected.sort_unstable();
        // The widest gap, the first of equals; its middle joins next. (While blocks are left
        // out, some gap spans two or more.)
        let Some((left, right)) = selected.windows(2).map(|w| (w[0], w[1])).filter(|(l, r)| r - l > 1).fold(
            None,
            |best: Option<(usize, usize)>, gap| match best {
                Some(b) if b.1 - b.0 >= gap.1 - gap.0 => Some(b),
                _ => Some(gap),
            },
        ) else {
            break;
        };
        let middle = (left + right) / 2;
        selected.push(middle);
        order.push(middle);
    }
    Ok(order)
}

/// The checkpoint as `needle build` exports it: the width ladder dropped (the export stores one
/// width), and with `layers` below the full depth, the rung of that depth.
pub fn rung(ckpt: &mut Checkpoint, layers: Option<usize>) -> Result<(), LadderError> {
    ckpt.config.ladder_widths.clear();
    let num_layers = ckpt.config.num_layers;
    let Some(depth) = layers.filter(|&d| d != num_layers) else {
        return Ok(());
    };
    if !(2..num_layers).contains(&depth) {
        return Err(LadderError::Depth { layers: depth, num_layers });
    }
    let order = ladder_order(&ckpt.config)?;
    let mut selected = order[..depth].to_vec();
    selected.sort_unstable();
    let remap: BTreeMap<usize, usize> = selected.iter().enumerate().map(|(new, &old)| (old, new)).collect();
    // Head rows: the embedding's, then one per kept block.
    let rows: Vec<usize> = std::iter::once(0).chain(selected.iter().map(|l| l + 1)).collect();

    let sites = &ckpt.config.engram_layers;
    let mut params = BTreeMap::new();
    for (path, array) in std::mem::take(&mut ckpt.params) {
        let key = path.split('/').next().unwrap_or_default();
        let sliced = if key == "stack" && path != "stack/final_norm/scale" {
            Some(take(&path, &array, 0, &selected, "block")?)
        } else if needle3::LAYOUT.heads.iter().any(|head| head.key == key) {
            // A probe head pools a row per depth: the embedding's, then each block's.
            let leaf = path.rsplit('/').next().unwrap_or_default();
            match leaf {
                "probes" | "gain" => Some(take(&path, &array, 0, &rows, "depth row")?),
                "row_bias" => Some(take(&path, &array, 1, &rows, "depth row")?),
                _ => Some(array),
            }
        } else if let Some(site) = key.strip_prefix("engrams_").and_then(|s| s.parse::<usize>().ok()) {
            // A site whose block is kept is renumbered among the kept sites; the others go.
            match sites.get(site).filter(|layer| remap.contains_key(layer)) {
                Some(_) => {
                    let kept_before = sites[..site].iter().filter(|l| remap.contains_key(l)).count();
                    let renamed = format!("engrams_{kept_before}{}", &path[key.len()..]);
                    params.insert(renamed, array);
                    None
                }
                None => None,
            }
        } else {
            Some(array)
        };
        if let Some(array) = sliced {
            params.insert(path, array);
        }
    }
    ckpt.params = params;
    let remapped = |layers: &[usize]| layers.iter().filter_map(|l| remap.get(l).copied()).collect::<Vec<_>>();
    let config = &mut ckpt.config;
    config.ladder_order = remapped(&order);
    config.global_layers = remapped(&config.global_layers);
    config.engram_layers = remapped(&config.engram_layers);
    config.num_layers = depth;
    Ok(())
}

/// `array` with only the entries `index` along `axis` (`jnp.take`).
fn take(path: &str, array: &NdArray, axis: usize, index: &[usize], what: &'static str) -> Result<NdArray, LadderError> {
    let shape = &array.shape;
    let axis_error = || LadderError::Axis { path: path.into(), shape: shape.clone(), axis, what };
    let &len = shape.get(axis).ok_or_else(axis_error)?;
    if index.iter().any(|&i| i >= len) {
        return Err(axis_error());
    }
    let outer: usize = shape[..axis].iter().product();
    let inner = shape[axis + 1..].iter().product::<usize>() * array.dtype.itemsize();
    let mut data = Vec::with_capacity(outer * index.len() * inner);
    for o in 0..outer {
        for &i in index {
            let at = (o * len + i) * inner;
            data.extend_from_slice(&array.data[at..at + inner]);
        }
    }
    let mut shape = shape.clone();
    shape[axis] = index.len();
    Ok(NdArray { dtype: array.dtype, shape, data })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bisection_order_is_the_references() {
        // 3.x's `_ladder_layer_order(20)` and `(5)`.
        let order = |n| ladder_order(&ModelConfig { num_layers: n, ..ModelConfig::needle3() }).unwrap();
        assert_eq!(order(20), [0, 19, 9, 14, 4, 6, 11, 16, 2, 7, 12, 17, 1, 3, 5, 8, 10, 13, 15, 18]);
        assert_eq!(order(5), [0, 4, 2, 1, 3]);
        assert_eq!(order(4), [0, 3, 1, 2]);
        let bad = ModelConfig { num_layers: 3, ladder_order: vec![0, 0, 2], ..ModelConfig::needle3() };
        assert!(matches!(ladder_order(&bad), Err(LadderError::Order { .. })));
    }
}
