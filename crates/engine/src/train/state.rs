//! The resumable state of a run, saved next to the adapter after every epoch (and on cancel):
//! the factors, the optimizer moments and count, and what the run was started with, so `--resume`
//! continues on the same schedule.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::Tensor;

use super::adamw::AdamW;
use crate::lora::file::{
    f32_array, f32_bytes, factor_buffers, metadata_value, parse_safetensors, read_file, serialize_f32, write_atomically,
};
use crate::lora::{AdapterFileError, Lora};
use crate::model::Params;

/// The state file for an adapter at `adapter`: `<adapter>.state.safetensors`.
pub fn state_path(adapter: &Path) -> PathBuf {
    let mut name = adapter.as_os_str().to_owned();
    name.push(".state.safetensors");
    PathBuf::from(name)
}

/// What must agree between a saved state and the run that resumes it.
#[derive(Debug, Clone, PartialEq)]
pub struct RunKey {
    pub rank: usize,
    pub alpha: f64,
    pub steps: usize,
    pub seed: u64,
    pub base: String,
}

/// Writes the factors, the moments and the count atomically.
pub fn save_state(path: &Path, lora: &Lora, optimizer: &AdamW, key: &RunKey) -> Result<(), AdapterFileError> {
    let mut buffers = factor_buffers(lora)?;
    let names: Vec<String> = buffers.iter().map(|(name, _, _)| name.clone()).collect();
    let (mu, nu): (Vec<Tensor>, Vec<Tensor>) = optimizer.moments.iter().cloned().unzip();
    for (name, (mu, nu)) in names.iter().zip(lora.stacked(&mu)?.iter().zip(&lora.stacked(&nu)?)) {
        buffers.push((format!("{name}/mu"), mu.dims().to_vec(), f32_bytes(mu)?));
        buffers.push((format!("{name}/nu"), nu.dims().to_vec(), f32_bytes(nu)?));
    }
    let metadata = HashMap::from([
        ("count".to_string(), optimizer.count.to_string()),
        ("rank".to_string(), key.rank.to_string()),
        ("alpha".to_string(), key.alpha.to_string()),
        ("steps".to_string(), key.steps.to_string()),
        ("seed".to_string(), key.seed.to_string()),
        ("base".to_string(), key.base.clone()),
    ]);
    write_atomically(path, &serialize_f32(path, &buffers, metadata)?)
}

/// A saved run, checked against the resuming one.
pub struct SavedState {
    pub lora: Lora,
    /// First and second moments in [`Lora::vars`] order.
    pub moments: Vec<(Tensor, Tensor)>,
    /// Updates already applied.
    pub count: usize,
}

/// Reads a state file, with its factors over `params`.
pub fn load_state(path: &Path, params: &Params, key: &RunKey) -> Result<SavedState, AdapterFileError> {
    let bytes = read_file(path)?;
    let (tensors, metadata) = parse_safetensors(path, &bytes)?;
    let saved = RunKey {
        rank: metadata_value(path, &metadata, "rank")?,
        alpha: metadata_value(path, &metadata, "alpha")?,
        steps: metadata_value(path, &metadata, "steps")?,
        seed: metadata_value(path, &metadata, "seed")?,
        base: metadata_value(path, &metadata, "base")?,
    };
    if &saved != key {
        return Err(AdapterFileError::Metadata {
            path: path.into(),
            key: "run",
            problem: format!("records {saved:?} but this run is {key:?}; resume with the same flags or drop --resume"),
        });
    }
    let tensor = |name: &str| -> Result<Tensor, AdapterFileError> {
        let array = f32_array(path, &tensors, name)?;
        Ok(Tensor::from_vec(array.to_f32(), array.shape.as_slice(), params.device())?)
    };
    let mut weights: Vec<&str> = tensors.names().into_iter().filter_map(|n| n.strip_suffix("/A")).collect();
    weights.sort_unstable();
    let factors = weights
        .iter()
        .map(|w| Ok((w.to_string(), tensor(&format!("{w}/A"))?, tensor(&format!("{w}/B"))?)))
        .collect::<Result<Vec<_>, AdapterFileError>>()?;
    let lora = Lora::from_factors(params, key.rank, key.alpha, factors).map_err(|e| AdapterFileError::Metadata {
        path: path.into(),
        key: "factors",
        problem: e.to_string(),
    })?;
    let names: Vec<String> =
        lora.factors.iter().flat_map(|f| [format!("{}/A", f.path), format!("{}/B", f.path)]).collect();
    let moment = |kind: &str| -> Result<Vec<Tensor>, AdapterFileError> {
        let stacked = names.iter().map(|name| tensor(&format!("{name}/{kind}"))).collect::<Result<Vec<_>, _>>()?;
        lora.unstacked(&stacked).map_err(|e| AdapterFileError::Metadata {
            path: path.into(),
            key: "moments",
            problem: e.to_string(),
        })
    };
    let moments = moment("mu")?.into_iter().zip(moment("nu")?).collect();
    Ok(SavedState { lora, moments, count: metadata_value(path, &metadata, "count")? })
}
