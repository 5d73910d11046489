//! Parity with the references' confidence heads (`tests/fixtures/make_confidence_goldens.py`): the
//! head run on the hidden cells each reference computed, against the logits and confidences it made
//! of them. Float32 fixtures within 1e-5; bfloat16 ones within twice the reference's own bfloat16
//! rounding of the head (`bf16_spread`, measured by the script against the same head computed in
//! float32, which they also match within 1e-5).

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor};

use super::*;
use crate::cact::ladder::rung;
use crate::checkpoint::Checkpoint;
use crate::fixtures::{checkpoint_path, fixture};
use crate::model::Params;

const TOLERANCE: f32 = 1e-5;

struct Golden {
    tensors: HashMap<String, Tensor>,
    meta: serde_json::Value,
}

impl Golden {
    fn load(stem: &str) -> Self {
        let tensors =
            candle_core::safetensors::load(fixture(&format!("golden/{stem}/confidence.safetensors")), &Device::Cpu)
                .unwrap()
                .into_iter()
                .map(|(name, t)| {
                    let t = if t.dtype() == DType::I32 { t } else { t.to_dtype(DType::F32).unwrap() };
                    (name, t)
                })
                .collect();
        let meta = std::fs::read_to_string(fixture(&format!("golden/{stem}/confidence.json"))).unwrap();
        Self { tensors, meta: serde_json::from_str(&meta).unwrap() }
    }

    fn get(&self, name: &str) -> &Tensor {
        self.tensors.get(name).unwrap_or_else(|| panic!("golden tensor `{name}`"))
    }

    /// The depth-row mask of the rung case.
    fn rows(&self) -> Vec<bool> {
        self.get("row_keep_rung").to_vec1::<f32>().unwrap().into_iter().map(|keep| keep > 0.0).collect()
    }
}

fn head_of(checkpoint: &Checkpoint) -> ConfidenceHead {
    let params = Params::from_checkpoint(checkpoint, &Device::Cpu).unwrap();
    ConfidenceHead::load(&checkpoint.config, &params).unwrap().expect("the fixture carries a confidence head")
}

fn head(stem: &str) -> ConfidenceHead {
    head_of(&Checkpoint::load(&checkpoint_path(stem)).unwrap())
}

fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
    (a - b).unwrap().abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar().unwrap()
}

/// The head's logits on case `suffix` of the golden (its cells, the batch's mask unless the case
/// has its own) and their largest distance from `want{suffix}`; the confidences are checked too.
fn check(head: &ConfidenceHead, golden: &Golden, suffix: &str, rows: Option<&[bool]>, want: &str, tolerance: f32) {
    let own_keep = format!("keep{suffix}");
    let keep = golden.tensors.get(&own_keep).unwrap_or_else(|| golden.get("keep"));
    let logits = head.logits(golden.get(&format!("cells{suffix}")), keep, rows).unwrap();
    let gap = max_diff(&logits, golden.get(&format!("{want}{suffix}")));
    assert!(gap <= tolerance, "case `{suffix}`: logits differ from `{want}` by {gap} (tolerance {tolerance})");
    if want == "logit" {
        let gap = max_diff(&confidence(&logits).unwrap(), golden.get(&format!("confidence{suffix}")));
        assert!(gap <= tolerance, "case `{suffix}`: confidences differ by {gap}");
    }
}

/// Every fixture's batch and its padded row alone: a float32 fixture within 1e-5 of the reference;
/// a bfloat16 one within 1e-5 of the reference's head computed in float32, and within twice its own
/// bfloat16 rounding of the head computed as the checkpoint's config says.
#[test]
fn heads_match_the_references() {
    for stem in ["tiny_f32", "pretrained", "needle3_heads", "needle3_bf16"] {
        let (head, golden) = (head(stem), Golden::load(stem));
        let checks = match golden.meta["dtype"].as_str() {
            Some("float32") => vec![("logit", TOLERANCE)],
            Some("bfloat16") => {
                let spread = golden.meta["bf16_spread"].as_f64().unwrap() as f32;
                assert!(spread > 0.0 && spread < 1e-2, "{stem}: a bfloat16 spread of {spread}");
                vec![("logit_f32", TOLERANCE), ("logit", 2.0 * spread)]
            }
            other => panic!("{stem}: a golden of dtype {other:?}"),
        };
        for (want, tolerance) in checks {
            for suffix in ["", "_unpadded"] {
                check(&head, &golden, suffix, None, want, tolerance);
            }
        }
    }
}

/// A padded row scores as the same row without its padding.
#[test]
fn padding_does_not_move_a_logit() {
    for stem in ["tiny_f32", "needle3_heads"] {
        let (head, golden) = (head(stem), Golden::load(stem));
        let padded = head.logits(golden.get("cells"), golden.get("keep"), None).unwrap().to_vec1::<f32>().unwrap();
        let alone = head.logits(golden.get("cells_unpadded"), golden.get("keep_unpadded"), None).unwrap();
        let gap = (padded[2] - alone.to_vec1::<f32>().unwrap()[0]).abs();
        assert!(gap <= TOLERANCE, "{stem}: padding moved the logit by {gap}");
    }
}

#[test]
fn needle3_shallower_rung_and_quantized_head_match_the_reference() {
    let (head, golden) = (head("needle3_heads"), Golden::load("needle3_heads"));
    let rows = golden.rows();
    check(&head, &golden, "_rung", Some(&rows), "logit", TOLERANCE);
    check(&head.through_cq().unwrap(), &golden, "_qat", None, "logit", TOLERANCE);
}

/// A rung built on its own (the checkpoint sliced as `needle build --layers` slices it, the head
/// keeping the rows of its blocks) scores the rung's cells as the whole head does with the row mask.
#[test]
fn needle3_sliced_rung_matches_the_masked_whole_head() {
    let golden = Golden::load("needle3_heads");
    let mut checkpoint = Checkpoint::load(&checkpoint_path("needle3_heads")).unwrap();
    let depth = golden.meta["rung"].as_u64().unwrap() as usize;
    rung(&mut checkpoint, Some(depth)).unwrap();
    let kept: Vec<u32> = (0u32..).zip(golden.rows()).filter_map(|(row, keep)| keep.then_some(row)).collect();
    assert_eq!(kept.len(), depth + 1, "the embedding row and one per kept block");
    let kept = Tensor::new(kept, &Device::Cpu).unwrap();
    let cells = golden.get("cells_rung").index_select(&kept, 2).unwrap();
    let logits = head_of(&checkpoint).logits(&cells, golden.get("keep"), None).unwrap();
    let gap = max_diff(&logits, golden.get("logit_rung"));
    assert!(gap <= TOLERANCE, "the sliced rung's logits differ by {gap}");
}

#[test]
fn a_checkpoint_without_a_head_has_none() {
    let checkpoint = Checkpoint::load(&checkpoint_path("tiny_f16")).unwrap();
    let params = Params::from_checkpoint(&checkpoint, &Device::Cpu).unwrap();
    assert!(ConfidenceHead::load(&checkpoint.config, &params).unwrap().is_none());
}

#[test]
fn bad_inputs_are_refused_with_what_the_head_reads() {
    let (needle3, golden) = (head("needle3_heads"), Golden::load("needle3_heads"));
    let (cells, keep) = (golden.get("cells"), golden.get("keep"));

    let shallow = cells.narrow(2, 0, 4).unwrap();
    let err = needle3.logits(&shallow, keep, None).unwrap_err();
    assert!(matches!(err, HeadError::Inputs { rows: 5, d_model: 48, .. }), "{err}");
    assert!(err.to_string().contains("[batch, tokens, 5, 48]"), "{err}");
    let err = needle3.logits(cells, &keep.narrow(1, 0, 4).unwrap(), None).unwrap_err();
    assert!(matches!(err, HeadError::Inputs { .. }), "{err}");

    let empty = Tensor::cat(&[keep.narrow(0, 0, 2).unwrap(), keep.narrow(0, 2, 1).unwrap().zeros_like().unwrap()], 0);
    let err = needle3.logits(cells, &empty.unwrap(), None).unwrap_err();
    assert!(matches!(err, HeadError::EmptyRow { row: 2 }), "{err}");

    for rows in [vec![true; 4], vec![false; 5]] {
        let err = needle3.logits(cells, keep, Some(&rows)).unwrap_err();
        assert!(matches!(err, HeadError::RowMask { rows: 5, .. }), "{err}");
    }

    let (needle2, golden) = (head("tiny_f32"), Golden::load("tiny_f32"));
    let err = needle2.logits(golden.get("cells"), golden.get("keep"), Some(&[true; 4])).unwrap_err();
    assert!(matches!(err, HeadError::NoLadder), "{err}");
}
