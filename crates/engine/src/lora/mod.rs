//! LoRA adapters as the reference trains them: which weights get one, how they start, and how
//! they enter the network.
//!
//! Each adapted kernel `W` (`[layers, in, out]` for the stacked blocks) gets `A` `[layers, in, r]`
//! and `B` `[layers, r, out]`; the network sees `W + (alpha / r)·A·B`. `A` starts as N(0, 1)/r
//! and `B` as zeros, so training starts from the base model's exact outputs.

use candle_core::{DType, Tensor, Var};
use rand::rngs::StdRng;
use rand::SeedableRng;
use rand_distr::{Distribution, StandardNormal};

use crate::model::{lora_merged, ModelError, Params, Result};

pub mod file;
pub use file::{load_adapter, save_adapter, AdapterFileError, AdapterMeta};

/// The projections the reference adapts (`LORA_TARGETS` in `needle/model/finetune.py`).
pub const TARGETS: [&str; 5] = ["q_proj", "k_proj", "v_proj", "gate_proj", "out_proj"];

/// How errors name the base model when the adapter's own record of it is not at hand.
const LOADED_BASE: &str = "the loaded checkpoint";

/// Kernels whose largest |w| is at most this are left alone: the reference treats them as unused
/// (a zero-initialised projection would only train noise).
const DEAD_KERNEL: f32 = 1e-6;

/// Whether `path` names a kernel of a stacked block's target projection (never the MTP block,
/// which is not under `stack/layers`).
pub fn is_target(path: &str) -> bool {
    let parts: Vec<&str> = path.split('/').collect();
    parts.last() == Some(&"kernel")
        && parts.contains(&"stack")
        && parts.contains(&"layers")
        && parts.iter().any(|part| TARGETS.contains(part))
}

/// The weights the reference's `lora_target_paths` picks, in path order.
pub fn target_paths(params: &Params) -> Result<Vec<String>> {
    let mut paths = Vec::new();
    for path in params.paths().into_iter().filter(|p| is_target(p)) {
        let Some(weight) = params.get(&path) else { continue };
        let largest: f32 = weight.abs()?.flatten_all()?.max(0)?.to_scalar()?;
        if largest > DEAD_KERNEL {
            paths.push(path);
        }
    }
    Ok(paths)
}

/// One adapted weight: the frozen base kernel and its two trainable factors.
#[derive(Debug)]
pub struct Factor {
    pub path: String,
    base: Tensor,
    pub a: Var,
    pub b: Var,
}

/// A set of LoRA factors over one base model.
#[derive(Debug)]
pub struct Lora {
    pub rank: usize,
    pub alpha: f64,
    pub factors: Vec<Factor>,
}

impl Lora {
    /// Fresh factors for every target of `params`: `A` ~ N(0, 1)/rank drawn from `seed` in path
    /// order, `B` = 0.
    pub fn init(params: &Params, rank: usize, alpha: f64, seed: u64) -> Result<Self> {
        let mut rng = StdRng::seed_from_u64(seed);
        let factors = target_paths(params)?
            .into_iter()
            .map(|path| {
                let base = base_weight(params, &path)?;
                let (lead, in_dim, out_dim) = split_kernel_dims(&path, base.dims())?;
                let a_shape = [lead.as_slice(), &[in_dim, rank]].concat();
                let b_shape = [lead.as_slice(), &[rank, out_dim]].concat();
                let count: usize = a_shape.iter().product();
                let values: Vec<f32> =
                    (0..count).map(|_| StandardNormal.sample(&mut rng)).map(|v: f32| v / rank as f32).collect();
                let a = Tensor::from_vec(values, a_shape.as_slice(), params.device())?;
                let b = Tensor::zeros(b_shape.as_slice(), DType::F32, params.device())?;
                Factor::new(path, base, &a, &b)
            })
            .collect::<Result<_>>()?;
        Ok(Self { rank, alpha, factors })
    }

    /// Factors given by value (a saved adapter, a resumed run, a golden), checked against `params`.
    pub fn from_factors(
        params: &Params,
        rank: usize,
        alpha: f64,
        factors: impl IntoIterator<Item = (String, Tensor, Tensor)>,
    ) -> Result<Self> {
        let factors = factors
            .into_iter()
            .map(|(path, a, b)| {
                let base = base_weight(params, &path)?;
                let device = params.device();
                Factor::new(
                    path,
                    base,
                    &a.to_dtype(DType::F32)?.to_device(device)?,
                    &b.to_dtype(DType::F32)?.to_device(device)?,
                )
            })
            .collect::<Result<_>>()?;
        Ok(Self { rank, alpha, factors })
    }

    /// `alpha / rank`, the factor on `A·B`.
    pub fn scale(&self) -> f64 {
        self.alpha / self.rank as f64
    }

    /// Puts `W + scale·A·B` for every factor into `params`, tracked for gradients of `A` and `B`.
    pub fn apply(&self, params: &mut Params) -> Result<()> {
        for factor in &self.factors {
            let merged = factor.merged(factor.a.as_tensor(), factor.b.as_tensor(), self.scale())?;
            params.insert(factor.path.clone(), merged);
        }
        Ok(())
    }

    /// Like [`Lora::apply`] but detached from the graph: for evaluation, which needs no gradients.
    pub fn apply_frozen(&self, params: &mut Params) -> Result<()> {
        for factor in &self.factors {
            let merged = factor.merged(&factor.a.as_tensor().detach(), &factor.b.as_tensor().detach(), self.scale())?;
            params.insert(factor.path.clone(), merged);
        }
        Ok(())
    }

    /// Every trainable tensor, `A` then `B` of each factor in order: the optimizer's view.
    pub fn vars(&self) -> Vec<Var> {
        self.factors.iter().flat_map(|f| [f.a.clone(), f.b.clone()]).collect()
    }

    /// Number of trainable scalars.
    pub fn parameter_count(&self) -> usize {
        self.factors.iter().map(|f| f.a.elem_count() + f.b.elem_count()).sum()
    }
}

impl Factor {
    fn new(path: String, base: Tensor, a: &Tensor, b: &Tensor) -> Result<Self> {
        let factor = Self { base, a: Var::from_tensor(a)?, b: Var::from_tensor(b)?, path };
        // Fail now, naming the weight, rather than at the first forward pass.
        factor.merged(a, b, 1.0)?;
        Ok(factor)
    }

    fn merged(&self, a: &Tensor, b: &Tensor, scale: f64) -> Result<Tensor> {
        lora_merged(&self.base, a, b, scale).map_err(|reason| ModelError::AdapterMismatch {
            path: self.path.clone(),
            reason,
            base: LOADED_BASE.into(),
        })
    }
}

fn base_weight(params: &Params, path: &str) -> Result<Tensor> {
    params.get(path).ok_or_else(|| ModelError::AdapterMismatch {
        path: path.into(),
        reason: "the base model has no such weight".into(),
        base: LOADED_BASE.into(),
    })
}

/// `(leading dims, in, out)` of a kernel shape.
fn split_kernel_dims(path: &str, dims: &[usize]) -> Result<(Vec<usize>, usize, usize)> {
    match dims {
        [lead @ .., in_dim, out_dim] => Ok((lead.to_vec(), *in_dim, *out_dim)),
        _ => Err(ModelError::AdapterMismatch {
            path: path.into(),
            reason: format!("a kernel needs at least two dimensions, this one has shape {dims:?}"),
            base: LOADED_BASE.into(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_are_stacked_projection_kernels_only() {
        assert!(is_target("stack/layers/block/self_attn/q_proj/kernel"));
        assert!(is_target("stack/layers/block/mlp/gate_proj/kernel"));
        assert!(!is_target("stack/layers/block/self_attn/q_proj/bias"));
        assert!(!is_target("mtp_block/self_attn/q_proj/kernel"));
        assert!(!is_target("stack/layers/block/mlp/up_proj/kernel"));
        assert!(!is_target("stack/layers/block/self_attn/q_proj_extra/kernel"));
    }
}
