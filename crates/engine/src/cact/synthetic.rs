//! Random-init checkpoints with the reference's parameter tree, for benchmarks and for tests that
//! need a `.cact` without a fixture file. Deterministic for a given seed.

use std::collections::BTreeMap;

use half::f16;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::geometry::{Geometry, GeometryError, ENGRAM_CONV_TAPS};
use crate::checkpoint::{Checkpoint, DType, NdArray};
use crate::config::ModelConfig;

/// Every parameter the export reads, with its shape for `config` (heads excluded: they are optional).
pub fn export_param_shapes(config: &ModelConfig) -> Result<Vec<(String, Vec<usize>)>, GeometryError> {
    let geo = Geometry::of(config)?;
    let (d, l, lanes) = (config.d_model, config.num_layers, config.mhc_lanes);
    let attn = if config.attn_dim == 0 { d } else { config.attn_dim };
    let kv = config.num_kv_heads * geo.head_dim;
    let block = |p: &str| format!("stack/layers/block/{p}");
    let mut shapes = vec![
        ("embedding/embedding".to_string(), vec![config.vocab_size, d]),
        (block("ZCRMSNorm_0/scale"), vec![l, d]),
        (block("self_attn/q_proj/kernel"), vec![l, d, attn]),
        (block("self_attn/k_proj/kernel"), vec![l, d, kv]),
        (block("self_attn/v_proj/kernel"), vec![l, d, kv]),
        (block("self_attn/q_norm/scale"), vec![l, geo.head_dim]),
        (block("self_attn/k_norm/scale"), vec![l, geo.head_dim]),
        (block("self_attn/gate_proj/kernel"), vec![l, d, attn]),
        (block("self_attn/out_proj/kernel"), vec![l, attn, d]),
        (block("post_attn_norm/scale"), vec![l, d]),
        (block("attn_gate"), vec![l]),
        (block("pre_hada_norm/scale"), vec![l, d]),
        (block("hadamard_mlp/d1"), vec![l, geo.hada_n]),
        (block("hadamard_mlp/d2"), vec![l, geo.hada_n]),
        (block("hadamard_mlp/d3"), vec![l, geo.hada_n]),
        ("stack/mhc_a_pre".into(), vec![l]),
        ("stack/mhc_a_post".into(), vec![l]),
        ("stack/mhc_a_res".into(), vec![l]),
        ("stack/mhc_b_pre".into(), vec![l, lanes]),
        ("stack/mhc_b_post".into(), vec![l, lanes]),
        ("stack/mhc_b_res".into(), vec![l, lanes, lanes]),
        ("stack/mhc_phi_pre".into(), vec![l, lanes * d, lanes]),
        ("stack/mhc_phi_post".into(), vec![l, lanes * d, lanes]),
        ("stack/mhc_phi_res".into(), vec![l, lanes * d, lanes * lanes]),
        ("stack/final_norm/scale".into(), vec![d]),
    ];
    for site in 0..geo.sites.len() {
        let e = |p: &str| format!("engrams_{site}/{p}");
        shapes.push((e("embedding"), vec![geo.num_engram_tables(), config.engram_slots, geo.engram_sub_dim]));
        shapes.push((e("key_proj/kernel"), vec![d, d]));
        shapes.push((e("value_proj/kernel"), vec![d, d]));
        shapes.push((e("taps"), vec![ENGRAM_CONV_TAPS, d]));
    }
    Ok(shapes)
}

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
