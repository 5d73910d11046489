//! A CPU tensor's f32 elements read in place, without a copy: how the hand-written path reads the
//! base model's weights, and how the parameters are read back on the host.

use std::ops::Deref;

use candle_core::{bail, CpuStorage, Storage, Tensor};

/// A CPU f32 tensor's elements, read in place while the view (and its read guard) lives.
pub(crate) struct HostView<G> {
    guard: G,
    start: usize,
    end: usize,
}

impl<G: Deref<Target = Storage>> Deref for HostView<G> {
    type Target = [f32];

    fn deref(&self) -> &[f32] {
        match &*self.guard {
            Storage::Cpu(CpuStorage::F32(values)) => &values[self.start..self.end],
            // `host` admits nothing else.
            _ => &[],
        }
    }
}

/// The elements of `tensor`, which must be a contiguous f32 tensor on the CPU.
pub(crate) fn host(tensor: &Tensor) -> candle_core::Result<HostView<impl Deref<Target = Storage> + '_>> {
    let (guard, layout) = tensor.storage_and_layout();
    let Some((start, end)) = layout.contiguous_offsets() else { bail!("the CPU path reads contiguous tensors") };
    if !matches!(&*guard, Storage::Cpu(CpuStorage::F32(_))) {
        bail!("the CPU path reads f32 tensors on the CPU, got {:?}", tensor.dtype());
    }
    Ok(HostView { guard, start, end })
}
