//! An adapter: its factors for each adapted kernel, how they start, and the low-rank update the
//! network adds with them.

use candle_core::{DType, Tensor, Var};
use rand::rngs::StdRng;
use rand::SeedableRng;
use rand_distr::{Distribution, StandardNormal};

use super::fit::FitProblem;
use crate::model::{Device, HostGrads, LowRank, ModelError, Params, Result};

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
        // The largest |w| from the two extremes: no |w| copy of each kernel at start-up.
        let (max, min): (f32, f32) = (weight.max_all()?.to_scalar()?, weight.min_all()?.to_scalar()?);
        let largest = max.max(-min);
        if largest > DEAD_KERNEL {
            paths.push(path);
        }
    }
    Ok(paths)
}

/// One adapted weight's trainable factors, one `A`/`B` pair per layer of the stacked kernel.
///
/// The pairs are separate variables so that a layer's update touches only its own gradient
/// (slicing one stacked variable per layer would pad every layer's gradient to the whole stack).
#[derive(Debug)]
pub struct Factor {
    pub path: String,
    /// The kernel's leading (layer) dimensions; empty for an unstacked kernel.
    lead: Vec<usize>,
    /// `[in, r]` per layer.
    pub a: Vec<Var>,
    /// `[r, out]` per layer.
    pub b: Vec<Var>,
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
                let (_, [a_shape, b_shape]) =
                    super::fit::expected_factors(base.dims(), rank).map_err(|problem| mismatch(&path, problem))?;
                let count: usize = a_shape.iter().product();
                let values: Vec<f32> =
                    (0..count).map(|_| StandardNormal.sample(&mut rng)).map(|v: f32| v / rank as f32).collect();
                let a = Tensor::from_vec(values, a_shape.as_slice(), params.device())?;
                let b = Tensor::zeros(b_shape.as_slice(), DType::F32, params.device())?;
                Factor::new(path, base.dims(), &a, &b, rank)
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
                    base.dims(),
                    &a.to_dtype(DType::F32)?.to_device(device)?,
                    &b.to_dtype(DType::F32)?.to_device(device)?,
                    rank,
                )
            })
            .collect::<Result<_>>()?;
        Ok(Self { rank, alpha, factors })
    }

    /// `alpha / rank`, the factor on `A·B`.
    pub fn scale(&self) -> f64 {
        self.alpha / self.rank as f64
    }

    /// The factors as the network takes them, tracked for gradients.
    pub fn low_rank(&self) -> LowRank {
        let mut low_rank = LowRank::new(self.scale());
        for factor in &self.factors {
            for (layer, (a, b)) in factor.a.iter().zip(&factor.b).enumerate() {
                low_rank.insert(&factor.path, layer, a.as_tensor().clone(), b.as_tensor().clone());
            }
        }
        low_rank
    }

    /// Gradients computed on the host ([`HostGrads`], by kernel path and layer) as tensors on
    /// `device` in [`Lora::vars`] order; zeros where a factor has none.
    pub fn tensors_from(&self, grads: &mut HostGrads, device: &Device) -> Result<Vec<Tensor>> {
        let mut out = Vec::new();
        for factor in &self.factors {
            let mut sides = [Vec::new(), Vec::new()];
            for (layer, (a, b)) in factor.a.iter().zip(&factor.b).enumerate() {
                let grad = grads.remove(&(factor.path.clone(), layer));
                for (side, (var, values)) in
                    sides.iter_mut().zip([(a, grad.as_ref().map(|g| &g.0)), (b, grad.as_ref().map(|g| &g.1))])
                {
                    side.push(match values {
                        Some(values) => Tensor::from_slice(values, var.shape(), device)?,
                        None => var.zeros_like()?,
                    });
                }
            }
            let [a, b] = sides;
            out.extend(a);
            out.extend(b);
        }
        Ok(out)
    }

    /// Every trainable tensor, per factor its `A` of each layer then its `B` of each layer: the
    /// optimizer's view.
    pub fn vars(&self) -> Vec<Var> {
        self.factors.iter().flat_map(|f| f.a.iter().chain(&f.b).cloned()).collect()
    }

    /// Tensors given per [`Lora::vars`] entry (values, gradients, moments) regrouped as the files
    /// hold them: per factor its stacked `A`-shaped tensor, then its stacked `B`-shaped one.
    pub fn stacked(&self, per_var: &[Tensor]) -> candle_core::Result<Vec<Tensor>> {
        let mut rest = per_var;
        let mut out = Vec::with_capacity(2 * self.factors.len());
        for factor in &self.factors {
            for side in [&factor.a, &factor.b] {
                let (parts, tail) = rest.split_at(side.len().min(rest.len()));
                out.push(factor.stack(parts)?);
                rest = tail;
            }
        }
        Ok(out)
    }

    /// The inverse of [`Lora::stacked`]: stacked tensors (two per factor) split per variable.
    pub fn unstacked(&self, stacked: &[Tensor]) -> candle_core::Result<Vec<Tensor>> {
        let mut out = Vec::new();
        for (tensor, side) in stacked.iter().zip(self.factors.iter().flat_map(|f| [&f.a, &f.b])) {
            let per_layer =
                tensor.reshape([&[side.len()], &tensor.dims()[tensor.rank().saturating_sub(2)..]].concat())?;
            out.extend((0..side.len()).map(|l| per_layer.get(l)).collect::<candle_core::Result<Vec<_>>>()?);
        }
        Ok(out)
    }

    /// The first factor holding a NaN or an infinity, named `path/A` or `path/B` with its layer;
    /// `None` when every value is finite.
    pub fn first_non_finite(&self) -> Result<Option<String>> {
        for factor in &self.factors {
            for (side, vars) in [("A", &factor.a), ("B", &factor.b)] {
                for (layer, var) in vars.iter().enumerate() {
                    let values = var.as_tensor().flatten_all()?.to_vec1::<f32>()?;
                    if values.iter().any(|v| !v.is_finite()) {
                        return Ok(Some(format!("{}/{side} (layer {layer})", factor.path)));
                    }
                }
            }
        }
        Ok(None)
    }

    /// Number of trainable scalars.
    pub fn parameter_count(&self) -> usize {
        self.vars().iter().map(|v| v.elem_count()).sum()
    }
}

impl Factor {
    /// Checks `a` `[lead…, in, r]` and `b` `[lead…, r, out]` against the kernel's shape before
    /// anything is multiplied, then splits them per layer.
    fn new(path: String, kernel: &[usize], a: &Tensor, b: &Tensor, rank: usize) -> Result<Self> {
        let (lead, ..) = super::fit::kernel_dims(kernel).map_err(|problem| mismatch(&path, problem))?;
        let dims = super::fit::factor_dims(kernel, a.dims(), b.dims(), rank)
            .map_err(|(side, problem)| mismatch(&path, format!("{side} {problem}")))?;
        let split = |t: &Tensor| -> Result<Vec<Var>> {
            let per_layer = t.reshape([&[dims.layers], &t.dims()[lead.len()..]].concat())?;
            (0..dims.layers).map(|l| Ok(Var::from_tensor(&per_layer.get(l)?.contiguous()?)?)).collect()
        };
        Ok(Self { a: split(a)?, b: split(b)?, lead: lead.to_vec(), path })
    }

    /// `A` of every layer as one tensor `[lead…, in, r]`.
    pub fn stacked_a(&self) -> candle_core::Result<Tensor> {
        self.stack(&self.a.iter().map(|v| v.as_tensor().clone()).collect::<Vec<_>>())
    }

    /// `B` of every layer as one tensor `[lead…, r, out]`.
    pub fn stacked_b(&self) -> candle_core::Result<Tensor> {
        self.stack(&self.b.iter().map(|v| v.as_tensor().clone()).collect::<Vec<_>>())
    }

    /// Per-layer tensors of one side stacked under the kernel's leading dimensions.
    fn stack(&self, parts: &[Tensor]) -> candle_core::Result<Tensor> {
        let stacked = Tensor::stack(parts, 0)?;
        stacked.reshape([self.lead.as_slice(), &stacked.dims()[1..]].concat())
    }
}

fn base_weight(params: &Params, path: &str) -> Result<Tensor> {
    params.get(path).ok_or_else(|| mismatch(path, FitProblem::MissingWeight))
}

/// The model's error for factors that do not fit the loaded base weight at `path`.
fn mismatch(path: &str, reason: impl ToString) -> ModelError {
    ModelError::AdapterMismatch { path: path.into(), reason: reason.to_string(), base: LOADED_BASE.into() }
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
