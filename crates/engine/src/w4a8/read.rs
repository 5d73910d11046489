//! The W4A8 matrices read from a parsed `.cact`: a CQ tensor's codes and norms as the file stores
//! them, and every matrix a W4A8 network multiplies (kept apart from the matrices themselves so
//! that the network, which holds them, does not reach the file reader).

use std::collections::BTreeMap;
use std::sync::Arc;

use super::codes::{NetworkCodes, PROJECTIONS};
use super::error::W4a8Error;
use super::matrix::CqMatrix;
use crate::cact::format::TensorKind;
use crate::cact::layout::layer_name;
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
    /// Every layer's projections and the embedding of `file`, which must store them as CQ.
    pub fn from_cact(file: &CactFile) -> Result<Self, W4a8Error> {
        let by_name: BTreeMap<&str, usize> =
            file.records.iter().enumerate().map(|(i, r)| (r.name.as_str(), i)).collect();
        let matrix = |name: &str| -> Result<CqMatrix, W4a8Error> {
            let &index = by_name.get(name).ok_or_else(|| W4a8Error::Missing { name: name.to_string() })?;
            CqMatrix::from_cact(file, index)
        };
        let layers = (0..file.header.num_layers as usize)
            .map(|l| {
                let [q, k, v, gate, out] = PROJECTIONS.map(|p| matrix(&layer_name(l, p)));
                Ok(Arc::new([q?, k?, v?, gate?, out?]))
            })
            .collect::<Result<_, W4a8Error>>()?;
        Ok(Self::new(layers, matrix("embedding")?))
    }
}
