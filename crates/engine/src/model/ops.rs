//! Small differentiable building blocks candle-core does not provide in a form with a backward pass.

use candle_core::{Result, Tensor};

/// Shifts the time axis (dim 1) right by `offset`, filling with zeros: position t sees t − offset.
pub fn shift_right(x: &Tensor, offset: usize) -> Result<Tensor> {
    let t = x.dim(1)?;
    if offset == 0 {
        Ok(x.clone())
    } else if offset >= t {
        x.zeros_like()
    } else {
        x.narrow(1, 0, t - offset)?.pad_with_zeros(1, offset, 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn shift_pads_with_zeros() {
        let seq = Tensor::new(&[[1f32, 2.0, 3.0]], &Device::Cpu).unwrap();
        assert_eq!(shift_right(&seq, 1).unwrap().to_vec2::<f32>().unwrap(), [[0.0, 1.0, 2.0]]);
        assert_eq!(shift_right(&seq, 5).unwrap().to_vec2::<f32>().unwrap(), [[0.0, 0.0, 0.0]]);
    }
}
