//! What a Needle 2 `.cact` holds (cactus-needle 2.x's `export._tensors`): per layer the attention's
//! projections and norms and the Walsh MLP's three gains, and two FP16 probe heads.

use super::layout::{fp16, Head, HeadSource, HeadTensor, LayerTensor, Layout, ATTENTION_IN, ATTENTION_OUT};

pub const LAYOUT: Layout =
    Layout::new(&[&ATTENTION_IN, &ATTENTION_OUT, &WALSH_MLP], false, &HEADS, &HEAD_TENSORS, "probes");

/// The Walsh MLP's gains, after the attention's tensors.
const WALSH_MLP: [LayerTensor; 3] =
    [fp16("d1", "hadamard_mlp/d1"), fp16("d2", "hadamard_mlp/d2"), fp16("d3", "hadamard_mlp/d3")];

/// The optional probe heads and the code the manifest stores for each.
const HEADS: [Head; 2] =
    [Head { key: "contrastive_head", code: 1, extra: &[] }, Head { key: "confidence_head", code: 2, extra: &[] }];

/// Each head's tensors: the probes, the projection (transposed) and its bias, all FP16.
const HEAD_TENSORS: [HeadTensor; 3] = [
    HeadTensor { name: "probes", source: HeadSource::Param, cq: false },
    HeadTensor { name: "proj", source: HeadSource::Kernel, cq: false },
    HeadTensor { name: "bias", source: HeadSource::Bias, cq: false },
];
