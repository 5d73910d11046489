//! The loops the fused CPU kernels share: a tensor's f32s, and a row function run over every row,
//! in parallel when the work is large.

use candle_core::backend::BackendStorage;
use candle_core::{bail, CpuStorage, DType, Layout, Result, Tensor};
use rayon::prelude::*;

/// Rows of this many elements or fewer are processed on one thread: rayon's hand-off costs more.
const PARALLEL_MIN: usize = 1 << 14;

/// The contiguous f32 elements of a CPU tensor.
pub(super) fn f32s<'a>(storage: &'a CpuStorage, layout: &Layout) -> Result<&'a [f32]> {
    let CpuStorage::F32(values) = storage else { bail!("fused ops take f32 tensors, got {:?}", storage.dtype()) };
    match layout.contiguous_offsets() {
        Some((start, end)) => Ok(&values[start..end]),
        None => bail!("fused ops take contiguous tensors"),
    }
}

/// `rows` output rows of `width` values, row i written by `f(i, row)`: in parallel when the work
/// is large. The one loop every CPU kernel runs.
pub(super) fn fill_rows(rows: usize, width: usize, f: impl Fn(usize, &mut [f32]) + Sync) -> Vec<f32> {
    let mut out = vec![0f32; rows * width];
    let width = width.max(1);
    if out.len() <= PARALLEL_MIN {
        out.chunks_mut(width).enumerate().for_each(|(i, o)| f(i, o));
    } else {
        out.par_chunks_mut(width).enumerate().for_each(|(i, o)| f(i, o));
    }
    out
}

/// `f(i, input_row, output_row)` over every `width`-wide row of `input`.
pub(super) fn map_rows(input: &[f32], width: usize, f: impl Fn(usize, &[f32], &mut [f32]) + Sync) -> Vec<f32> {
    fill_rows(input.len() / width.max(1), width, |i, o| f(i, &input[i * width..][..width], o))
}

/// Like [`map_rows`] over two inputs of the same shape (a forward input and a gradient).
pub(super) fn map_row_pairs(
    a: &[f32],
    b: &[f32],
    width: usize,
    f: impl Fn(usize, &[f32], &[f32], &mut [f32]) + Sync,
) -> Vec<f32> {
    fill_rows(a.len() / width.max(1), width, |i, o| f(i, &a[i * width..][..width], &b[i * width..][..width], o))
}

/// Whether the fused CPU kernels serve `x` (else the composite ops do).
pub(super) fn fused(x: &Tensor) -> bool {
    x.device().is_cpu() && x.dtype() == DType::F32
}
