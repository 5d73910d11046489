//! What the kernels' tests share: random inputs, and a fused op checked against the composite one.

use candle_core::{Device, Tensor, Var};

pub fn random(shape: &[usize], seed: u64) -> Tensor {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let n: usize = shape.iter().product();
    Tensor::from_vec((0..n).map(|_| rng.random_range(-2.0f32..2.0)).collect::<Vec<_>>(), shape, &Device::Cpu).unwrap()
}

pub fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
    (a - b).unwrap().abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar().unwrap()
}

/// The value and input gradient of `op(x)·probe` summed, for a fused and a composite op.
pub fn value_and_grad(x: &Tensor, probe: &Tensor, op: impl Fn(&Tensor) -> Tensor) -> (Tensor, Tensor) {
    let var = Var::from_tensor(x).unwrap();
    let y = op(var.as_tensor());
    let grads = (&y * probe).unwrap().sum_all().unwrap().backward().unwrap();
    (y, grads.get(var.as_tensor()).unwrap().clone())
}

pub fn assert_same(name: &str, fused: (Tensor, Tensor), composite: (Tensor, Tensor)) {
    let (value, grad) = (max_diff(&fused.0, &composite.0), max_diff(&fused.1, &composite.1));
    assert!(value < 1e-5 && grad < 1e-5, "{name}: value off by {value}, gradient by {grad}");
}
