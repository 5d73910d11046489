//! What a generation's `.cact` holds, in the order the runtime indexes it: the embedding, every
//! layer's tensors, the mHC tensors (and in Needle 3 the Monarch MLP's permutations), each engram
//! site's, the final norm, the optional probe heads, the tokenizer. The file is nameless; these
//! names are the reference's, recovered from the header geometry by position.
//!
//! One description per generation ([`super::needle2`], [`super::needle3`], picked by
//! [`super::format::layout`]), read by the writer ([`super::tensors`]), the
//! reader's names and the way back to the network's weights ([`super::weights`]).

/// One per-layer tensor: its export name, its checkpoint path under `stack/layers/block/` (stacked
/// over layers), and how it is stored.
pub struct LayerTensor {
    pub name: &'static str,
    pub path: &'static str,
    pub store: LayerStore,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerStore {
    /// FP16, as the checkpoint holds it.
    Fp16,
    /// A per-layer scalar, stored as a 1-element FP16 vector.
    Scalar,
    /// CQ, transposed to `[out, in]`.
    Kernel,
    /// FP16, present only when the model has Q/K/V convolution taps.
    ConvTap,
}

pub const fn fp16(name: &'static str, path: &'static str) -> LayerTensor {
    LayerTensor { name, path, store: LayerStore::Fp16 }
}

const fn scalar(name: &'static str, path: &'static str) -> LayerTensor {
    LayerTensor { name, path, store: LayerStore::Scalar }
}

const fn kernel(name: &'static str, path: &'static str) -> LayerTensor {
    LayerTensor { name, path, store: LayerStore::Kernel }
}

pub const fn conv_tap(name: &'static str, path: &'static str) -> LayerTensor {
    LayerTensor { name, path, store: LayerStore::ConvTap }
}

/// One tensor of a probe head, named `{head key}.{name}`.
pub struct HeadTensor {
    pub name: &'static str,
    pub source: HeadSource,
    /// CQ (at 4 bits, rows of the last axis) rather than FP16.
    pub cq: bool,
}

/// Where a head tensor comes from in the checkpoint (under the head's key).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum HeadSource {
    /// The parameter `{key}/{name}` as it is.
    Param,
    /// `{key}/proj/kernel`, transposed to `[out, in]`.
    Kernel,
    /// `{key}/proj/bias`, zeros when the projection has none.
    Bias,
    /// `{key}/calibration`, the reference's initial values when the checkpoint has none.
    Calibration(&'static [f32]),
}

/// A probe head a generation knows: its checkpoint key, the code the manifest stores, and the
/// tensors it adds to the generation's common ones.
pub struct Head {
    pub key: &'static str,
    pub code: u16,
    pub extra: &'static [HeadTensor],
}

/// The attention's tensors before the Q/K/V convolution (when there is one): the input norm and
/// the three projections.
pub const ATTENTION_IN: [LayerTensor; 4] = [
    fp16("norm_in", "ZCRMSNorm_0/scale"),
    kernel("q_proj", "self_attn/q_proj/kernel"),
    kernel("k_proj", "self_attn/k_proj/kernel"),
    kernel("v_proj", "self_attn/v_proj/kernel"),
];

/// The rest of the attention, its gate, and the norm before the MLP.
pub const ATTENTION_OUT: [LayerTensor; 7] = [
    fp16("q_norm", "self_attn/q_norm/scale"),
    fp16("k_norm", "self_attn/k_norm/scale"),
    kernel("gate_proj", "self_attn/gate_proj/kernel"),
    kernel("out_proj", "self_attn/out_proj/kernel"),
    fp16("post_norm", "post_attn_norm/scale"),
    scalar("attn_gate", "attn_gate"),
    fp16("pre_hada", "pre_hada_norm/scale"),
];

/// Everything that differs between the generations' files.
pub struct Layout {
    /// A layer's tensors in file order, in stretches.
    layer: &'static [&'static [LayerTensor]],
    /// Needle 3 stores the Monarch MLP's two permutations, FP32, after the mHC tensors.
    pub hada_perms: bool,
    pub heads: &'static [Head],
    /// The tensors every head has, in file order (before its `extra`).
    pub head_tensors: &'static [HeadTensor],
    /// The head parameter whose rows the projection reads, pooled (`[…, d_model]`).
    pub pooled_by: &'static str,
}

/// The mHC tensors after the last layer: six FP16 mixing vectors, then the three CQ phi matrices.
pub const MHC_FP16_TENSORS: [&str; 6] =
    ["mhc_a_pre", "mhc_a_post", "mhc_a_res", "mhc_b_pre", "mhc_b_post", "mhc_b_res"];
pub const MHC_PHI_TENSORS: [&str; 3] = ["mhc_phi_pre", "mhc_phi_post", "mhc_phi_res"];
/// Needle 3's Monarch permutations.
pub const HADA_PERMS: [&str; 2] = ["hada_p1", "hada_p2"];
/// Per engram site, in file order.
pub const ENGRAM_TENSORS: [&str; 4] = ["tables", "key_proj", "value_proj", "taps"];

pub const FINAL_NORM: &str = "final_norm";
pub const HEADS_MANIFEST: &str = "heads.manifest";
pub const TOKENIZER: &str = "tokenizer";

pub fn layer_name(layer: usize, tensor: &str) -> String {
    format!("layer{layer:02}.{tensor}")
}

pub fn engram_name(site: usize, tensor: &str) -> String {
    format!("engram{site}.{tensor}")
}

impl Layout {
    pub const fn new(
        layer: &'static [&'static [LayerTensor]],
        hada_perms: bool,
        heads: &'static [Head],
        head_tensors: &'static [HeadTensor],
        pooled_by: &'static str,
    ) -> Self {
        Self { layer, hada_perms, heads, head_tensors, pooled_by }
    }

    /// Per-layer tensors in file order, for a model with or without Q/K/V convolution taps.
    pub fn layer_tensors(&self, conv_taps: bool) -> impl Iterator<Item = &'static LayerTensor> + Clone {
        self.layer
            .iter()
            .flat_map(|stretch| stretch.iter())
            .filter(move |t| conv_taps || t.store != LayerStore::ConvTap)
    }

    /// How many tensors [`Layout::core_names`] names, counted without naming them (a header's layer
    /// count comes from the file; two u32 counts cannot overflow the u64 arithmetic).
    pub fn core_count(&self, num_layers: u32, num_sites: u32, conv_taps: bool) -> u64 {
        let per_layer = self.layer_tensors(conv_taps).count() as u64 * u64::from(num_layers);
        let perms = if self.hada_perms { HADA_PERMS.len() } else { 0 };
        let mhc = (MHC_FP16_TENSORS.len() + MHC_PHI_TENSORS.len() + perms) as u64;
        1 + per_layer + mhc + ENGRAM_TENSORS.len() as u64 * u64::from(num_sites) + 1
    }

    /// Names of every tensor from the embedding through `final_norm`.
    pub fn core_names(&self, num_layers: usize, num_sites: usize, conv_taps: bool) -> Vec<String> {
        let mut names = vec!["embedding".to_string()];
        for layer in 0..num_layers {
            names.extend(self.layer_tensors(conv_taps).map(|t| layer_name(layer, t.name)));
        }
        names.extend(MHC_FP16_TENSORS.iter().chain(&MHC_PHI_TENSORS).map(|t| t.to_string()));
        if self.hada_perms {
            names.extend(HADA_PERMS.iter().map(|t| t.to_string()));
        }
        for site in 0..num_sites {
            names.extend(ENGRAM_TENSORS.iter().map(|t| engram_name(site, t)));
        }
        names.push(FINAL_NORM.into());
        names
    }

    /// The head with manifest code `code`, if this generation knows it.
    pub fn head(&self, code: u16) -> Option<&'static Head> {
        self.heads.iter().find(|h| h.code == code)
    }

    /// A head's tensors in file order: the common ones, then its own.
    pub fn tensors_of(&self, head: Option<&'static Head>) -> impl Iterator<Item = &'static HeadTensor> {
        self.head_tensors.iter().chain(head.map_or(&[][..], |h| h.extra))
    }

    /// Names of the head section for the heads a manifest lists (an unknown code is named by its
    /// position, with the common tensors).
    pub fn head_names(&self, codes: &[u16]) -> Vec<String> {
        let mut names = vec![HEADS_MANIFEST.to_string()];
        for (h, &code) in codes.iter().enumerate() {
            let head = self.head(code);
            let key = head.map_or_else(|| format!("head{h}"), |head| head.key.to_string());
            names.extend(self.tensors_of(head).map(|t| format!("{key}.{}", t.name)));
        }
        names
    }
}
