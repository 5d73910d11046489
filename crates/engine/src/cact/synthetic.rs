//! Random-init checkpoints with the reference's parameter tree, for benchmarks and for tests that
//! need a `.cact` without a fixture file. Deterministic for a given seed.

use std::collections::BTreeMap;

use half::f16;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::geometry::{export_param_shapes, GeometryError};
use crate::checkpoint::{Checkpoint, DType, NdArray};
use crate::config::ModelConfig;

/// A checkpoint of `config`'s geometry with every parameter uniform in ±0.05, stored as float16
/// (like released checkpoints) or float32.
pub fn random_checkpoint(config: &ModelConfig, float16: bool, seed: u64) -> Result<Checkpoint, GeometryError> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut params = BTreeMap::new();
    for (path, shape) in export_param_shapes(config)? {
        let n: usize = shape.iter().product();
        let values: Vec<f32> = (0..n).map(|_| rng.random_range(-0.05..0.05)).collect();
        let array = if float16 {
            NdArray {
                dtype: DType::F16,
                shape,
                data: values.iter().flat_map(|&v| f16::from_f32(v).to_le_bytes()).collect(),
            }
        } else {
            NdArray { dtype: DType::F32, shape, data: values.iter().flat_map(|&v| v.to_le_bytes()).collect() }
        };
        params.insert(path, array);
    }
    Ok(Checkpoint { source: format!("<random seed {seed}>").into(), params, config: config.clone(), step: None })
}

/// A RAW tokenizer blob with `pieces` one-letter NORMAL pieces: enough for a build, which only
/// checks the piece count against `vocab_size`, and for the reader's blob walk.
pub fn placeholder_tokenizer_blob(pieces: usize) -> Vec<u8> {
    let mut blob = (pieces as u32).to_le_bytes().to_vec();
    blob.resize(super::TOKENIZER_HEADER_LEN, 0);
    for _ in 0..pieces {
        // score 0.0, type NORMAL, surface length 1, "a"
        blob.extend_from_slice(&[0, 0, 0, 0, 0, 1, 0, b'a']);
    }
    blob
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Device, Network};

    #[test]
    fn the_export_shapes_are_the_shapes_the_model_reads() {
        // d_model 80 with 3 orders leaves engram tables 26 wide: 78 of the 80 columns, so the engram
        // projections are [78, 80], not square; the model reads exactly the exported parameters.
        let config = ModelConfig {
            vocab_size: 16,
            d_model: 80,
            num_heads: 4,
            num_kv_heads: 2,
            num_layers: 2,
            engram_orders: vec![2, 3, 4],
            engram_slots: 4,
            engram_layers: vec![0, 1],
            mhc_lanes: 3,
            ..ModelConfig::default()
        };
        let ckpt = random_checkpoint(&config, false, 7).unwrap();
        assert_eq!(ckpt.params["engrams_1/key_proj/kernel"].shape, vec![78, 80]);
        Network::from_checkpoint(&ckpt, &Device::Cpu).unwrap();
    }
}
