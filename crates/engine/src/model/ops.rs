//! Small differentiable building blocks candle-core does not provide in a form with a backward pass.

use candle_core::{Result, Tensor};

/// The logistic function as `½ + ½·tanh(x/2)`: unlike `1/(1+e^{-x})` its backward pass never
/// multiplies an overflowed `e^{-x}` by a zero gradient (which gives NaN for x < -88).
pub fn sigmoid(x: &Tensor) -> Result<Tensor> {
    (x * 0.5)?.tanh()?.affine(0.5, 0.5)
}

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

/// `log(softmax(x))` along the last axis, written from differentiable reductions.
pub fn log_softmax_last(x: &Tensor) -> Result<Tensor> {
    let last = x.rank() - 1;
    x.broadcast_sub(&x.log_sum_exp(last)?.unsqueeze(last)?)
}

/// `softmax(x)` along the last axis; the max is subtracted for range only (it cancels in the
/// gradient), so it is detached.
pub fn softmax_last(x: &Tensor) -> Result<Tensor> {
    let last = x.rank() - 1;
    let e = x.broadcast_sub(&x.max_keepdim(last)?.detach())?.exp()?;
    e.broadcast_div(&e.sum_keepdim(last)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn sigmoid_matches_the_logistic_function_and_shift_pads_with_zeros() {
        let x = Tensor::new(&[-3f32, 0.0, 2.5], &Device::Cpu).unwrap();
        let got = sigmoid(&x).unwrap().to_vec1::<f32>().unwrap();
        for (g, v) in got.iter().zip([-3f32, 0.0, 2.5]) {
            assert!((g - 1.0 / (1.0 + (-v).exp())).abs() < 1e-7);
        }
        let seq = Tensor::new(&[[1f32, 2.0, 3.0]], &Device::Cpu).unwrap();
        assert_eq!(shift_right(&seq, 1).unwrap().to_vec2::<f32>().unwrap(), [[0.0, 1.0, 2.0]]);
        assert_eq!(shift_right(&seq, 5).unwrap().to_vec2::<f32>().unwrap(), [[0.0, 0.0, 0.0]]);
    }

    #[test]
    fn softmax_rows_sum_to_one_and_log_softmax_is_its_log() {
        let x = Tensor::new(&[[1f32, 2.0, f32::NEG_INFINITY], [0.5, 0.5, 0.5]], &Device::Cpu).unwrap();
        let p = softmax_last(&x).unwrap().to_vec2::<f32>().unwrap();
        let lp = log_softmax_last(&x).unwrap().to_vec2::<f32>().unwrap();
        for (row, lrow) in p.iter().zip(&lp) {
            assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-6);
            for (a, b) in row.iter().zip(lrow) {
                assert!((a.ln() - b).abs() < 1e-6 || (*a == 0.0 && *b == f32::NEG_INFINITY));
            }
        }
    }
}
