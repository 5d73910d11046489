//! The committed fixtures (`tests/fixtures`) the unit tests read, and the seeded random tensors
//! they draw: a test that fails must fail again, the same way, when it is rerun.

use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};
use rand::SeedableRng;
use rand_distr::{Distribution, Normal};

pub fn fixture(relative: &str) -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures")).join(relative)
}

/// The checkpoint `models/<stem>`: a Needle 3 safetensors file where there is one, else a pickle.
pub fn checkpoint_path(stem: &str) -> PathBuf {
    let needle3 = fixture(&format!("models/{stem}.safetensors"));
    if needle3.exists() {
        needle3
    } else {
        fixture(&format!("models/{stem}.pkl"))
    }
}

/// A CPU tensor of `shape` drawn from N(`mean`, `std`²), the same for the same `seed` (candle's
/// `Tensor::randn` draws from an unseeded generator).
pub fn seeded_normal(mean: f32, std: f32, shape: &[usize], seed: u64) -> Tensor {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let normal = Normal::new(mean, std).expect("a finite, non-negative std");
    let values = (0..shape.iter().product()).map(|_| normal.sample(&mut rng)).collect();
    Tensor::from_vec(values, shape, &Device::Cpu).expect("as many values as the shape holds")
}
