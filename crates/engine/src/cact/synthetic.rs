//! Random-init checkpoints with the network's own parameter tree ([`Network::param_shapes`]), for
//! benchmarks and for tests that need a `.cact` without a fixture file. Deterministic for a given
//! seed.

use std::collections::BTreeMap;

use half::f16;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::checkpoint::{Checkpoint, DType, NdArray};
use crate::config::ModelConfig;
use crate::model::{ModelError, Network};
use crate::tokenizer::{self, Piece, PieceKind};

/// A checkpoint of `config`'s geometry with every parameter uniform in ±0.05, stored as float16
/// (like released checkpoints) or float32.
pub fn random_checkpoint(config: &ModelConfig, float16: bool, seed: u64) -> Result<Checkpoint, ModelError> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut params = BTreeMap::new();
    for (path, shape) in Network::param_shapes(config)? {
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
/// checks the piece count against `vocab_size`, and for the reader's blob walk (not a vocabulary
/// a tokenizer would load: its pieces repeat).
pub fn placeholder_tokenizer_blob(pieces: usize) -> Vec<u8> {
    let piece = Piece { text: "a".into(), score: 0.0, kind: PieceKind::Normal };
    tokenizer::write_cact_blob(&vec![piece; pieces], &[], true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Device;

    #[test]
    fn the_synthetic_params_are_the_params_the_model_reads() {
        // d_model 80 with 3 orders leaves engram tables 26 wide: 78 of the 80 columns, so the engram
        // projections are [78, 80], not square; the model reads exactly the synthetic parameters.
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
