//! What a Needle 2 `.cact` holds: its tensors in the order the runtime indexes them, the names the
//! reference gives each position, and its header as it follows from the model config — both ways,
//! as the writer fills it in and as a reader recovers the config from it. The writer and the reader
//! share this one definition.
//!
//! [`tensors`] lays a checkpoint out in this order; [`weights`] reads a built file back into the
//! network's parameters.

pub mod tensors;
pub mod weights;

pub use tensors::check_params;
pub(super) use tensors::{check_shapes, tensors};
pub use weights::WeightsError;

use super::format::Header;
use super::geometry::{effective_kv_window, Geometry};
use super::writer::{u32_field, BuildProblem};
use crate::config::{ModelConfig, ENGRAM_CONV_TAPS};

/// One per-layer tensor: its export name, its checkpoint path under `stack/layers/block/` (stacked
/// over layers), and whether it is a kernel (CQ, transposed to `[out, in]`) rather than an FP16 vector.
pub struct LayerTensor {
    pub name: &'static str,
    pub path: &'static str,
    pub kernel: bool,
}

const fn fp16(name: &'static str, path: &'static str) -> LayerTensor {
    LayerTensor { name, path, kernel: false }
}

const fn kernel(name: &'static str, path: &'static str) -> LayerTensor {
    LayerTensor { name, path, kernel: true }
}

/// The header of a model of `config` whose file holds `num_tensors` tensors.
pub(super) fn header(
    config: &ModelConfig,
    geo: &Geometry,
    num_tensors: usize,
    codebook_len: usize,
) -> Result<Header, BuildProblem> {
    let list = |what: &str, values: &[usize]| -> Result<Vec<u32>, BuildProblem> {
        values.iter().map(|&v| u32_field(what, v)).collect()
    };
    let kv_bits = if config.kv_bits == 0 { 8 } else { config.kv_bits };
    Ok(Header {
        num_tensors: u32_field("num_tensors", num_tensors)?,
        codebook_len: u32_field("codebook_len", codebook_len)?,
        kv_window: u32_field("kv_window", effective_kv_window(config)?)?,
        kv_bits,
        vocab_size: u32_field("vocab_size", config.vocab_size)?,
        d_model: u32_field("d_model", config.d_model)?,
        num_heads: u32_field("num_heads", config.num_heads)?,
        num_kv_heads: u32_field("num_kv_heads", config.num_kv_heads)?,
        num_layers: u32_field("num_layers", config.num_layers)?,
        head_dim: u32_field("head_dim", geo.head_dim)?,
        max_seq_len: u32_field("max_seq_len", config.max_seq_len)?,
        hada_n: u32_field("hada_n", geo.hada_n)?,
        mhc_lanes: u32_field("mhc_lanes", config.mhc_lanes)?,
        engram_slots: u32_field("engram_slots", config.engram_slots)?,
        engram_sub_dim: u32_field("engram_sub_dim", geo.engram.sub_dim)?,
        num_engram_tables: u32_field("num_engram_tables", geo.engram.tables)?,
        engram_conv_taps: u32_field("engram_conv_taps", ENGRAM_CONV_TAPS)?,
        engram_conv_dilation: u32_field("engram_conv_dilation", geo.engram.dilation)?,
        engram_orders: list("engram_orders", &geo.orders)?,
        engram_layers: list("engram_layers", &geo.sites)?,
        rope_theta: config.rope_theta as f32,
    })
}

/// The model config a header describes (the fields a forward pass reads): what the writer put in, read backwards.
pub fn model_config(h: &Header) -> ModelConfig {
    let orders: Vec<usize> = h.engram_orders.iter().map(|&o| o as usize).collect();
    ModelConfig {
        vocab_size: h.vocab_size as usize,
        d_model: h.d_model as usize,
        // Two u32s multiply exactly in a u64; a width no usize holds is refused by the config's checks.
        attn_dim: usize::try_from(u64::from(h.num_heads) * u64::from(h.head_dim)).unwrap_or(usize::MAX),
        num_heads: h.num_heads as usize,
        num_kv_heads: h.num_kv_heads as usize,
        num_layers: h.num_layers as usize,
        max_seq_len: h.max_seq_len as usize,
        rope_theta: f64::from(h.rope_theta),
        engram_heads: (h.num_engram_tables as usize).checked_div(orders.len()).unwrap_or(0),
        engram_orders: orders,
        engram_slots: h.engram_slots as usize,
        engram_layers: h.engram_layers.iter().map(|&l| l as usize).collect(),
        mhc_lanes: h.mhc_lanes as usize,
        kv_window: h.kv_window as usize,
        kv_bits: h.kv_bits,
        ..ModelConfig::default()
    }
}

/// Per-layer tensors, in file order.
pub const LAYER_TENSORS: [LayerTensor; 14] = [
    fp16("norm_in", "ZCRMSNorm_0/scale"),
    kernel("q_proj", "self_attn/q_proj/kernel"),
    kernel("k_proj", "self_attn/k_proj/kernel"),
    kernel("v_proj", "self_attn/v_proj/kernel"),
    fp16("q_norm", "self_attn/q_norm/scale"),
    fp16("k_norm", "self_attn/k_norm/scale"),
    kernel("gate_proj", "self_attn/gate_proj/kernel"),
    kernel("out_proj", "self_attn/out_proj/kernel"),
    fp16("post_norm", "post_attn_norm/scale"),
    fp16("attn_gate", "attn_gate"),
    fp16("pre_hada", "pre_hada_norm/scale"),
    fp16("d1", "hadamard_mlp/d1"),
    fp16("d2", "hadamard_mlp/d2"),
    fp16("d3", "hadamard_mlp/d3"),
];

/// The mHC tensors after the last layer: six FP16 mixing vectors, then the three CQ phi matrices.
pub const MHC_FP16_TENSORS: [&str; 6] =
    ["mhc_a_pre", "mhc_a_post", "mhc_a_res", "mhc_b_pre", "mhc_b_post", "mhc_b_res"];
pub const MHC_PHI_TENSORS: [&str; 3] = ["mhc_phi_pre", "mhc_phi_post", "mhc_phi_res"];

/// Per engram site, in file order.
pub const ENGRAM_TENSORS: [&str; 4] = ["tables", "key_proj", "value_proj", "taps"];

/// Optional probe heads: checkpoint key and the code the manifest stores for it.
pub const HEAD_CODES: [(&str, u16); 2] = [("contrastive_head", 1), ("confidence_head", 2)];
/// Each head contributes these three FP16 tensors.
pub const HEAD_TENSORS: [&str; 3] = ["probes", "proj", "bias"];

pub const FINAL_NORM: &str = "final_norm";
pub const HEADS_MANIFEST: &str = "heads.manifest";
pub const TOKENIZER: &str = "tokenizer";

pub fn layer_name(layer: usize, tensor: &str) -> String {
    format!("layer{layer:02}.{tensor}")
}

pub fn engram_name(site: usize, tensor: &str) -> String {
    format!("engram{site}.{tensor}")
}

/// How many tensors [`core_names`] names, counted without naming them (a header's layer count
/// comes from the file; two u32 counts cannot overflow the u64 arithmetic).
pub fn core_count(num_layers: u32, num_sites: u32) -> u64 {
    let per_layer = LAYER_TENSORS.len() as u64 * u64::from(num_layers);
    let mhc = (MHC_FP16_TENSORS.len() + MHC_PHI_TENSORS.len()) as u64;
    1 + per_layer + mhc + ENGRAM_TENSORS.len() as u64 * u64::from(num_sites) + 1
}

/// Names of every tensor from the embedding through `final_norm`.
pub fn core_names(num_layers: usize, num_sites: usize) -> Vec<String> {
    let mut names = vec!["embedding".to_string()];
    for layer in 0..num_layers {
        names.extend(LAYER_TENSORS.iter().map(|t| layer_name(layer, t.name)));
    }
    names.extend(MHC_FP16_TENSORS.iter().chain(&MHC_PHI_TENSORS).map(|t| t.to_string()));
    for site in 0..num_sites {
        names.extend(ENGRAM_TENSORS.iter().map(|t| engram_name(site, t)));
    }
    names.push(FINAL_NORM.into());
    names
}

/// Names of the head section for the heads a manifest lists (unknown codes are named by position).
pub fn head_names(codes: &[u16]) -> Vec<String> {
    let mut names = vec![HEADS_MANIFEST.to_string()];
    for (h, code) in codes.iter().enumerate() {
        let key = HEAD_CODES.iter().find(|(_, c)| c == code).map_or_else(|| format!("head{h}"), |(k, _)| k.to_string());
        names.extend(HEAD_TENSORS.iter().map(|t| format!("{key}.{t}")));
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_core_count_is_the_number_of_core_names() {
        for (layers, sites) in [(0, 0), (3, 1), (27, 4)] {
            assert_eq!(core_count(layers, sites), core_names(layers as usize, sites as usize).len() as u64);
        }
    }
}
