//! Quantization-aware training's fake quantization of activations (the reference's `fake_quant`):
//! each row of the last axis rounded to `bits`-bit symmetric integers scaled by its absolute
//! maximum, and straight-through for the gradient (the backward passes `dy` on unchanged).

use candle_core::{CpuStorage, CustomOp1, Layout, Result, Shape, Tensor, D};

use super::rows::{f32s, fused, map_rows};

/// `x` with each last-axis row quantized to `bits` bits and back; the gradient passes straight through.
pub fn fake_quant_rows(x: &Tensor, bits: u32) -> Result<Tensor> {
    if fused(x) {
        return x.contiguous()?.apply_op1(FakeQuant { bits });
    }
    fake_quant_composite(x, bits)
}

/// The composite ops the other devices run. candle's `round` takes halves away from zero where the
/// reference rounds them to even: a value exactly halfway between two levels is the one difference.
fn fake_quant_composite(x: &Tensor, bits: u32) -> Result<Tensor> {
    let qmax = f64::from(FakeQuant { bits }.qmax());
    let absmax = x.abs()?.max_keepdim(D::Minus1)?;
    // A row of zeros keeps a unit scale (its values are zeros whatever the scale).
    let scale = (absmax.affine(1.0 / qmax, 0.0)? + absmax.eq(0.0)?.to_dtype(x.dtype())?)?;
    let q = x.broadcast_div(&scale)?.round()?.clamp(-qmax - 1.0, qmax)?.broadcast_mul(&scale)?;
    x + (q - x)?.detach()
}

/// One row quantized to `bits`-bit symmetric integers scaled by its absolute maximum and back, in
/// place (a row of zeros stays zeros).
#[inline(always)]
pub(crate) fn fake_quant_row(x: &mut [f32], bits: u32) {
    let qmax = FakeQuant { bits }.qmax();
    let absmax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let scale = if absmax > 0.0 { absmax / qmax } else { 1.0 };
    let level = |u: f32| u.round_ties_even().clamp(-qmax - 1.0, qmax);
    // In the parity tests, the levels are logged, and on the path under test may follow the reference's.
    #[cfg(test)]
    if crate::level_log::feeding() {
        let inputs: Vec<f32> = x.iter().map(|x| x / scale).collect();
        let mut levels: Vec<f32> = inputs.iter().map(|&u| level(u)).collect();
        crate::level_log::observe(crate::level_log::Quantizer::Activations(bits), &inputs, &mut levels);
        x.iter_mut().zip(levels).for_each(|(x, l)| *x = l * scale);
        return;
    }
    for x in x.iter_mut() {
        *x = level(*x / scale) * scale;
    }
}

#[derive(Clone, Copy)]
struct FakeQuant {
    bits: u32,
}

impl FakeQuant {
    fn qmax(self) -> f32 {
        ((1u64 << self.bits.saturating_sub(1)) - 1) as f32
    }
}

impl CustomOp1 for FakeQuant {
    fn name(&self) -> &'static str {
        "fake-quant"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let width = layout.dims().last().copied().unwrap_or(1).max(1);
        let out = map_rows(f32s(storage, layout)?, width, |_, x, y| {
            y.copy_from_slice(x);
            fake_quant_row(y, self.bits);
        });
        Ok((CpuStorage::F32(out), layout.shape().clone()))
    }

    fn bwd(&self, _x: &Tensor, _y: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(grad.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;

    #[test]
    fn rows_round_to_their_own_scale_and_the_gradient_passes_through() {
        let x = Tensor::new(&[[1.0f32, -0.5, 0.25, 0.0], [0.0, 0.0, 0.0, 0.0]], &candle_core::Device::Cpu).unwrap();
        let q = fake_quant_rows(&x, 2).unwrap().to_vec2::<f32>().unwrap();
        // 2 bits: levels −2..=1 in units of absmax / 1; −0.5 is a tie, to even (0), 0.25 rounds to 0.
        assert_eq!(q, [[1.0, 0.0, 0.0, 0.0], [0.0; 4]]);
        let (x, probe) = (random(&[3, 9], 5), random(&[3, 9], 6));
        let (_, grad) = value_and_grad(&x, &probe, |x| fake_quant_rows(x, 8).unwrap());
        assert!(max_diff(&grad, &probe) == 0.0);
    }

    #[test]
    fn the_composite_form_agrees_away_from_ties() {
        let (x, probe) = (random(&[4, 16], 7), random(&[4, 16], 8));
        let fused = value_and_grad(&x, &probe, |x| fake_quant_rows(x, 8).unwrap());
        let composite = value_and_grad(&x, &probe, |x| fake_quant_composite(x, 8).unwrap());
        assert_same("fake quant", fused, composite);
    }
}
