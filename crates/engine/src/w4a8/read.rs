//! The W4A8 matrices read from a parsed `.cact`: a CQ tensor's codes and norms as the file stores
//! them, and every matrix a W4A8 network multiplies (kept apart from the matrices themselves so
//! that the network, which holds them, does not reach the file reader).

use std::collections::BTreeMap;
use std::sync::Arc;

use super::codes::{EngramCodes, NetworkCodes, PROJECTIONS};
use super::error::W4a8Error;
use super::matrix::CqMatrix;
use crate::cact::format::TensorKind;
use crate::cact::layout::{engram_name, layer_name, ENGRAM_TENSORS, MHC_PHI_TENSORS};
use crate::cact::reader::CactFile;

impl CqMatrix {
    /// Tensor `index` of a parsed `.cact`, which must be a CQ tensor.
    pub fn from_cact(file: &CactFile, index: usize) -> Result<Self, W4a8Error> {
        let record = file.records.get(index).ok_or(W4a8Error::NoTensor { index, count: file.records.len() })?;
        let name = || record.name.clone();
        let TensorKind::Cq(bits) = record.kind else {
            return Err(W4a8Error::NotCq { index, name: name(), kind: record.kind.label() });
        };
        // The reader checked at parse time that a CQ record is 2-D and its blob inside the file.
        let (out, in_dim) = (record.shape[0] as usize, record.shape[1] as usize);
        let blob = file.blob(index).ok_or(W4a8Error::NoTensor { index, count: file.records.len() })?;
        Self::from_blob(blob, out, in_dim, bits).map_err(|source| W4a8Error::Blob { index, name: name(), source })
    }
}

impl NetworkCodes {
    /// Every CQ tensor of `file` the network reads: each layer's attention projections, each
    /// layer's rows of the three mHC gate projections, each engram site's tables and projections,
    /// and the embedding.
    pub fn from_cact(file: &CactFile) -> Result<Self, W4a8Error> {
        let by_name: BTreeMap<&str, usize> =
            file.records.iter().enumerate().map(|(i, r)| (r.name.as_str(), i)).collect();
        let matrix = |name: &str| -> Result<CqMatrix, W4a8Error> {
            let &index = by_name.get(name).ok_or_else(|| W4a8Error::Missing { name: name.to_string() })?;
            CqMatrix::from_cact(file, index)
        };
        let layer_count = file.header.num_layers as usize;
        let layers = (0..layer_count)
            .map(|l| {
                let [q, k, v, gate, out] = PROJECTIONS.map(|p| matrix(&layer_name(l, p)));
                Ok(Arc::new([q?, k?, v?, gate?, out?]))
            })
            .collect::<Result<_, W4a8Error>>()?;
        // Each phi tensor stacks the layers' rows: `[L·k, n·d]`, layer `l`'s `k` rows together.
        let [pre, post, res] = MHC_PHI_TENSORS.map(matrix);
        let phi = [pre?, post?, res?];
        for (m, name) in phi.iter().zip(MHC_PHI_TENSORS) {
            if layer_count == 0 || m.out() % layer_count != 0 {
                return Err(W4a8Error::Layers { name: name.to_string(), rows: m.out(), layers: layer_count });
            }
        }
        let lanes =
            (0..layer_count).map(|l| Arc::new(phi.each_ref().map(|m| m.rows(layer_rows(m, l, layer_count))))).collect();
        let engrams = (0..file.header.engram_layers.len())
            .map(|site| {
                let [tables, key, value] = [0, 1, 2].map(|t| matrix(&engram_name(site, ENGRAM_TENSORS[t])));
                Ok(EngramCodes { tables: tables?, key: key?, value: value? })
            })
            .collect::<Result<_, W4a8Error>>()?;
        Ok(Self::new(layers, lanes, engrams, matrix("embedding")?))
    }
}

/// Layer `l`'s rows of `m`, which stacks `layers` layers' rows.
fn layer_rows(m: &CqMatrix, l: usize, layers: usize) -> std::ops::Range<usize> {
    let per_layer = m.out() / layers;
    l * per_layer..(l + 1) * per_layer
}
