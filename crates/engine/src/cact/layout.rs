//! The canonical tensor order of a `.cact` and the names the reference gives each position.
//! The runtime indexes tensors by position, so writer and reader share this one definition.

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
