//! A projection of the network: a frozen kernel, with a trainable low-rank update beside it.
//!
//! LoRA is applied as `x·W + s·(x·A)·B` rather than by merging `W + s·A·B`: the merged form makes
//! the backward pass form a dense gradient of every adapted kernel, and a whole merged stack per
//! step, only to project it onto `A` and `B`.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use candle_core::Tensor;

use super::kernels::frozen_matmul;
use super::qat::cq_along;
use super::Result;

/// Low-rank updates for some kernels of a network: `(A, B)` by kernel path and layer, and the
/// scale `alpha / rank` on their product.
#[derive(Debug, Clone)]
pub struct LowRank {
    pub(super) scale: f64,
    factors: HashMap<(String, usize), (Tensor, Tensor)>,
}

impl LowRank {
    pub fn new(scale: f64) -> Self {
        Self { scale, factors: HashMap::new() }
    }

    /// `A` `[in, r]` and `B` `[r, out]` for layer `layer` of the kernel at `path` (layer 0 for a
    /// kernel that is not stacked).
    pub fn insert(&mut self, path: &str, layer: usize, a: Tensor, b: Tensor) {
        self.factors.insert((path.to_string(), layer), (a, b));
    }

    /// The same factors cut from the gradient graph: for passes that need no gradient.
    pub fn detached(&self) -> Self {
        let factors = self.factors.iter().map(|(k, (a, b))| (k.clone(), (a.detach(), b.detach()))).collect();
        Self { scale: self.scale, factors }
    }

    /// The factors' rank (0 when there are none).
    pub fn rank(&self) -> usize {
        self.factors.values().next().map_or(0, |(a, _)| a.dims().last().copied().unwrap_or(0))
    }

    /// Every factor tensor, `A` and `B` of each kernel and layer.
    pub fn tensors(&self) -> impl Iterator<Item = &Tensor> {
        self.factors.values().flat_map(|(a, b)| [a, b])
    }

    /// Every factor pair by kernel path and layer.
    pub(super) fn entries(&self) -> impl Iterator<Item = (&(String, usize), &(Tensor, Tensor))> {
        self.factors.iter()
    }

    pub(super) fn get(&self, path: &str, layer: usize) -> Option<&(Tensor, Tensor)> {
        self.factors.get(&(path.to_string(), layer))
    }
}

/// A frozen kernel `[in, out]`, named by its checkpoint path and layer.
#[derive(Debug, Clone)]
pub struct Linear {
    kernel: Kernel,
    pub(super) path: String,
    pub(super) layer: usize,
}

#[derive(Debug, Clone)]
enum Kernel {
    /// Multiplied by as it is.
    AsIs(Tensor),
    /// Under QAT: the kernel as stored, which an adapter merges into before CQ, and its own round
    /// trip, computed the first time something multiplies by it (shared by the network's clones).
    ThroughCq { stored: Tensor, quantized: Arc<OnceLock<Tensor>> },
}

impl Linear {
    /// A kernel multiplied by as it is.
    pub(super) fn new(weight: Tensor, path: String, layer: usize) -> Self {
        Self { kernel: Kernel::AsIs(weight), path, layer }
    }

    /// Under QAT, a kernel `stored` that is multiplied by through CQ.
    pub(super) fn through_cq(stored: Tensor, path: String, layer: usize) -> Self {
        Self { kernel: Kernel::ThroughCq { stored, quantized: Arc::default() }, path, layer }
    }

    /// Under QAT, the kernel as stored, which an adapter merges into before CQ.
    pub(super) fn stored(&self) -> Option<&Tensor> {
        match &self.kernel {
            Kernel::AsIs(_) => None,
            Kernel::ThroughCq { stored, .. } => Some(stored),
        }
    }

    /// The kernel the forward multiplies by: as stored, or under QAT through CQ, which is computed
    /// the first time something multiplies by it. An adapted kernel never is (the adapter merges
    /// into the stored kernel, and that is quantized instead): a training run skips the round trip
    /// of its adapted kernels and their memory.
    pub(super) fn weight(&self) -> Result<Tensor> {
        match &self.kernel {
            Kernel::AsIs(weight) => Ok(weight.clone()),
            Kernel::ThroughCq { stored, quantized } => {
                if let Some(weight) = quantized.get() {
                    return Ok(weight.clone());
                }
                let weight = cq_along(stored, true)?;
                Ok(quantized.get_or_init(|| weight).clone())
            }
        }
    }

    /// `x` `[…, in]` → `x·W` (`+ s·(x·A)·B` when `low_rank` adapts this kernel). Under QAT an adapted
    /// kernel is `CQ(W + s·A·B)`, what `needle build` would ship, with the gradient passed straight
    /// through the quantizer to `A` and `B` (the reference's `cq_ste_params(merge_lora(…))`).
    pub fn forward(&self, x: &Tensor, low_rank: Option<&LowRank>) -> Result<Tensor> {
        let Some(((a, b), scale)) = low_rank.and_then(|l| Some((l.get(&self.path, self.layer)?, l.scale))) else {
            return Ok(frozen_matmul(x, &self.weight()?)?);
        };
        let dims = x.dims();
        let rows = x.elem_count() / dims[dims.len() - 1];
        let update = |x: &Tensor| -> Result<Tensor> {
            Ok((x.reshape((rows, dims[dims.len() - 1]))?.matmul(a)?.matmul(b)? * scale)?)
        };
        match self.stored() {
            None => {
                let y = frozen_matmul(x, &self.weight()?)?;
                Ok((&y + update(x)?.reshape(y.shape())?)?)
            }
            Some(stored) => {
                let merged = (stored + (a.detach().matmul(&b.detach())? * scale)?)?;
                let y = frozen_matmul(x, &cq_along(&merged, true)?)?;
                // The update's value is already in `y`: it adds only its gradient, and none to `x`
                // (whose gradient comes from the quantized kernel alone).
                let through = update(&x.detach())?.reshape(y.shape())?;
                Ok((y + (&through - through.detach())?)?)
            }
        }
    }
}

/// Gradients of the factors of a [`LowRank`], by kernel path and layer: `(dA, dB)` flattened, in
/// the factors' shapes.
pub type HostGrads = HashMap<(String, usize), (Vec<f32>, Vec<f32>)>;
