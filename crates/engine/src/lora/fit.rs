//! Whether an adapter fits a base model, decided from shapes alone before anything is multiplied.
//!
//! An adapter file states its own shapes, so a product sized by them is sized by the file: an
//! 800 KB `A [100000, 1]`, `B [1, 100000]` would ask for a 40 GB `A·B` before any check on the
//! result could run. Every merge (eval, run, build) and every set of trainable factors therefore
//! checks `A` and `B` against the base weight and the adapter's rank first, here.

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::checkpoint::PickledAdapter;

/// The largest LoRA rank an adapter may have, and the bound `needle finetune` puts on `--lora-rank`
/// (the reference sets none; 4096 is far past any useful rank for Needle's widths), so every adapter
/// it writes fits.
pub const MAX_RANK: usize = 4096;

/// The sizes of one adapted kernel `W [lead…, in, out]` with `A [lead…, in, rank]` and
/// `B [lead…, rank, out]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FactorDims {
    /// The product of the leading (layer) dimensions; 1 for an unstacked kernel.
    pub layers: usize,
    pub d_in: usize,
    pub rank: usize,
    pub d_out: usize,
}

/// Why an adapter entry does not fit its base weight.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FitProblem {
    #[error("names a weight the base model does not have")]
    MissingWeight,
    #[error("adapts a base weight of shape {weight:?}; only kernels `[.., in, out]` take an adapter")]
    NotAKernel { weight: Vec<usize> },
    #[error("is {rank}; an adapter's rank must be in 1..={MAX_RANK}")]
    Rank { rank: usize },
    #[error("has shape {found:?}, but the base weight {weight:?} at the adapter's rank {rank} needs {expected:?}")]
    Shape { found: Vec<usize>, expected: Vec<usize>, weight: Vec<usize>, rank: usize },
    #[error("is {0}; merging needs a finite scale")]
    Scale(f64),
}

impl FitProblem {
    /// Whose fault it is: a base model the adapter was not trained on, or the adapter file itself.
    fn lies_with_the_adapter(&self) -> bool {
        match self {
            FitProblem::MissingWeight | FitProblem::NotAKernel { .. } | FitProblem::Shape { .. } => false,
            FitProblem::Rank { .. } | FitProblem::Scale(_) => true,
        }
    }
}

/// An adapter that does not fit the base model it is merged into: the file, the tensor (or
/// metadata entry) and what was expected of it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("adapter {}: `{tensor}` {problem}; {}", adapter.display(), self.fix())]
pub struct FitError {
    pub adapter: PathBuf,
    /// The base checkpoint the adapter records.
    pub base: String,
    pub tensor: String,
    pub problem: FitProblem,
}

impl FitError {
    fn fix(&self) -> String {
        if self.problem.lies_with_the_adapter() {
            "the adapter file is damaged: retrain it with `needle finetune`".to_owned()
        } else {
            format!(
                "pass the base checkpoint the adapter was trained from (it records `{}`), or retrain it with \
                 `needle finetune`",
                self.base
            )
        }
    }
}

/// `(leading dims, in, out)` of a kernel shape.
pub(super) fn kernel_dims(weight: &[usize]) -> Result<(&[usize], usize, usize), FitProblem> {
    match weight {
        [lead @ .., d_in, d_out] => Ok((lead, *d_in, *d_out)),
        _ => Err(FitProblem::NotAKernel { weight: weight.to_vec() }),
    }
}

/// The sizes of a kernel of shape `weight` adapted at `rank`, and the shapes `A` and `B` must have.
pub(super) fn expected_factors(weight: &[usize], rank: usize) -> Result<(FactorDims, [Vec<usize>; 2]), FitProblem> {
    let (lead, d_in, d_out) = kernel_dims(weight)?;
    // A product of dimensions the base model holds, so it cannot overflow.
    let dims = FactorDims { layers: lead.iter().product(), d_in, rank, d_out };
    Ok((dims, [[lead, &[d_in, rank]].concat(), [lead, &[rank, d_out]].concat()]))
}

/// Checks `a` and `b` against the kernel shape `weight` at `rank`; the error's `&str` says which
/// side is wrong (`"A"` or `"B"`).
pub fn factor_dims(
    weight: &[usize],
    a: &[usize],
    b: &[usize],
    rank: usize,
) -> Result<FactorDims, (&'static str, FitProblem)> {
    let (dims, [want_a, want_b]) = expected_factors(weight, rank).map_err(|problem| ("A", problem))?;
    for (side, found, expected) in [("A", a, want_a), ("B", b, want_b)] {
        if found != expected.as_slice() {
            return Err((side, FitProblem::Shape { found: found.to_vec(), expected, weight: weight.to_vec(), rank }));
        }
    }
    Ok(dims)
}

/// Checks every factor pair of `adapter` against the base model's weight shapes (`base_shape`
/// looks one up by path) and the adapter's own rank and scale, before anything is multiplied.
/// Returns each pair's sizes by the path of the weight it adapts. The error is boxed: it is rare
/// and large, and the errors that carry it travel through every adapter read.
pub fn check_fit(
    adapter: &PickledAdapter,
    base_shape: impl Fn(&str) -> Option<Vec<usize>>,
) -> Result<BTreeMap<&str, FactorDims>, Box<FitError>> {
    let error = |tensor: String, problem| {
        Box::new(FitError { adapter: adapter.source.clone(), base: adapter.base.clone(), tensor, problem })
    };
    if !adapter.scale.is_finite() {
        return Err(error("scale".into(), FitProblem::Scale(adapter.scale)));
    }
    if !(1..=MAX_RANK).contains(&adapter.rank) {
        return Err(error("rank".into(), FitProblem::Rank { rank: adapter.rank }));
    }
    adapter
        .lora
        .iter()
        .map(|(path, factors)| {
            let weight = base_shape(path).ok_or_else(|| error(path.clone(), FitProblem::MissingWeight))?;
            let dims = factor_dims(&weight, &factors.a.shape, &factors.b.shape, adapter.rank)
                .map_err(|(side, problem)| error(format!("{path}/{side}"), problem))?;
            Ok((path.as_str(), dims))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::{DType, LoraFactors, NdArray};

    const Q_PROJ: &str = "stack/layers/block/self_attn/q_proj/kernel";

    /// A zero array of `shape` whose bytes are really there, as a reader would have produced it.
    fn zeros(shape: &[usize]) -> NdArray {
        NdArray { dtype: DType::F32, shape: shape.to_vec(), data: vec![0; 4 * shape.iter().product::<usize>()] }
    }

    fn adapter(rank: usize, a: &[usize], b: &[usize]) -> PickledAdapter {
        PickledAdapter {
            source: "hostile.safetensors".into(),
            lora: BTreeMap::from([(Q_PROJ.to_string(), LoraFactors { a: zeros(a), b: zeros(b) })]),
            scale: 2.0,
            base: "models/tiny_f32.pkl".into(),
            rank,
        }
    }

    /// The tiny fixture's stacked q_proj: 3 layers of 96 × 96.
    fn base(path: &str) -> Option<Vec<usize>> {
        (path == Q_PROJ).then(|| vec![3, 96, 96])
    }

    #[test]
    fn a_fitting_adapter_gives_each_pairs_sizes() {
        let lora = adapter(4, &[3, 96, 4], &[3, 4, 96]);
        let dims = check_fit(&lora, base).unwrap();
        assert_eq!(dims, BTreeMap::from([(Q_PROJ, FactorDims { layers: 3, d_in: 96, rank: 4, d_out: 96 })]));
    }

    #[test]
    fn a_huge_product_is_refused_from_the_shapes_alone() {
        // 800 KB of factors whose product would be 100000 × 100000 f32 (40 GB).
        let err = check_fit(&adapter(1, &[100_000, 1], &[1, 100_000]), base).unwrap_err();
        assert_eq!(err.tensor, format!("{Q_PROJ}/A"));
        assert!(matches!(&err.problem, FitProblem::Shape { expected, .. } if expected == &[3, 96, 1]), "{err}");
        let text = err.to_string();
        assert!(text.contains("hostile.safetensors") && text.contains("[3, 96, 1]"), "{text}");
    }

    #[test]
    fn each_wrong_side_is_named_with_the_shape_it_needs() {
        let err = check_fit(&adapter(4, &[3, 96, 4], &[3, 4, 64]), base).unwrap_err();
        assert_eq!(err.tensor, format!("{Q_PROJ}/B"));
        assert!(err.to_string().contains("needs [3, 4, 96]"), "{err}");
        let err = check_fit(&adapter(4, &[3, 96, 2], &[3, 2, 96]), base).unwrap_err();
        assert_eq!(err.tensor, format!("{Q_PROJ}/A"), "the factors' rank must be the recorded one");
    }

    #[test]
    fn rank_scale_and_targets_are_checked() {
        let err = check_fit(&adapter(0, &[3, 96, 0], &[3, 0, 96]), base).unwrap_err();
        assert_eq!((err.tensor.as_str(), err.problem), ("rank", FitProblem::Rank { rank: 0 }));
        let err = check_fit(&adapter(MAX_RANK + 1, &[1], &[1]), base).unwrap_err();
        assert_eq!(err.problem, FitProblem::Rank { rank: MAX_RANK + 1 });
        let mut nan = adapter(4, &[3, 96, 4], &[3, 4, 96]);
        nan.scale = f64::NAN;
        assert!(matches!(check_fit(&nan, base).unwrap_err().problem, FitProblem::Scale(_)));
        let err = check_fit(&adapter(4, &[3, 96, 4], &[3, 4, 96]), |_| None).unwrap_err();
        assert_eq!((err.tensor.as_str(), err.problem), (Q_PROJ, FitProblem::MissingWeight));
        let err = check_fit(&adapter(4, &[3, 96, 4], &[3, 4, 96]), |_| Some(vec![96])).unwrap_err();
        assert_eq!(err.problem, FitProblem::NotAKernel { weight: vec![96] });
    }

    #[test]
    fn an_adapters_own_fault_is_not_blamed_on_the_base_model() {
        let mut nan = adapter(4, &[3, 96, 4], &[3, 4, 96]);
        nan.scale = f64::NAN;
        for own in [check_fit(&nan, base), check_fit(&adapter(0, &[3, 96, 0], &[3, 0, 96]), base)] {
            let text = own.unwrap_err().to_string();
            assert!(text.contains("the adapter file is damaged") && !text.contains("base checkpoint"), "{text}");
        }
        let misfit = check_fit(&adapter(4, &[3, 96, 4], &[3, 4, 64]), base).unwrap_err().to_string();
        assert!(misfit.contains("pass the base checkpoint the adapter was trained from"), "{misfit}");
    }
}
