//! What a Needle 3 `.cact` (format v3) holds (cactus-needle 3.x's `export._tensors`): Needle 2's
//! layer with the Q/K/V convolution taps after the projections and the Monarch MLP's gains,
//! factors and conditioning in place of the Walsh gains; the Monarch permutations after the mHC
//! tensors; three probe heads whose matrices are CQ.

use super::layout::{conv_tap, fp16, Head, HeadSource, HeadTensor, LayerTensor, Layout, ATTENTION_IN, ATTENTION_OUT};

pub const LAYOUT: Layout =
    Layout::new(&[&ATTENTION_IN, &CONV_TAPS, &ATTENTION_OUT, &MONARCH_MLP], true, &HEADS, &HEAD_TENSORS, "query");

/// The Q/K/V convolution's taps, after the projections (only when the model has them).
const CONV_TAPS: [LayerTensor; 3] = [
    conv_tap("q_taps", "self_attn/q_taps"),
    conv_tap("k_taps", "self_attn/k_taps"),
    conv_tap("v_taps", "self_attn/v_taps"),
];

/// The Monarch MLP's gains and bias, its three transforms' Kronecker factors, and its conditioning.
const MONARCH_MLP: [LayerTensor; 13] = [
    fp16("d1", "hadamard_mlp/d1"),
    fp16("d2", "hadamard_mlp/d2"),
    fp16("b2", "hadamard_mlp/b2"),
    fp16("d3", "hadamard_mlp/d3"),
    fp16("d4", "hadamard_mlp/d4"),
    fp16("w1a", "hadamard_mlp/w1a"),
    fp16("w1b", "hadamard_mlp/w1b"),
    fp16("w2a", "hadamard_mlp/w2a"),
    fp16("w2b", "hadamard_mlp/w2b"),
    fp16("w3a", "hadamard_mlp/w3a"),
    fp16("w3b", "hadamard_mlp/w3b"),
    fp16("cond_v", "hadamard_mlp/cond_v"),
    fp16("cond_u", "hadamard_mlp/cond_u"),
];

/// The router's calibration when the checkpoint has none (3.x's `RouterHead.calibration_init`).
const ROUTER_CALIBRATION: [f32; 3] = [0.90, 0.00, 0.60];

/// The probe heads in canonical order, with the code the manifest stores for each.
const HEADS: [Head; 3] = [
    Head { key: "embedding_head", code: 1, extra: &[] },
    Head { key: "confidence_head", code: 2, extra: &[] },
    Head {
        key: "router_head",
        code: 3,
        extra: &[HeadTensor { name: "calibration", source: HeadSource::Calibration(&ROUTER_CALIBRATION), cq: false }],
    },
];

/// Each head's tensors: the probes, gains, queries and row biases of its pooling, then its
/// projection (transposed) and bias; the three matrices CQ, as the head was trained under QAT.
const HEAD_TENSORS: [HeadTensor; 6] = [
    HeadTensor { name: "probes", source: HeadSource::Param, cq: true },
    HeadTensor { name: "gain", source: HeadSource::Param, cq: false },
    HeadTensor { name: "query", source: HeadSource::Param, cq: true },
    HeadTensor { name: "row_bias", source: HeadSource::Param, cq: false },
    HeadTensor { name: "proj", source: HeadSource::Kernel, cq: true },
    HeadTensor { name: "bias", source: HeadSource::Bias, cq: false },
];
