//! The head end to end from tokens: the cells our network collects for the references' golden
//! rows (each row unpadded, on both compute paths) against the cells the reference collected, and
//! the head's logit on them against the reference's logit.

use candle_core::{DType, Device, Tensor};

use super::cells::row_cells;
use super::*;
use crate::cact::ladder::rung;
use crate::checkpoint::Checkpoint;
use crate::fixtures::{checkpoint_path, fixture};
use crate::model::{Forward, Network, Params};

/// Cells of width-48 to 96 networks in float32: the references' reductions run in another order.
const CELL_TOLERANCE: f32 = 1e-4;
const LOGIT_TOLERANCE: f32 = 1e-5;

fn golden(stem: &str) -> std::collections::HashMap<String, Tensor> {
    candle_core::safetensors::load(fixture(&format!("golden/{stem}/confidence.safetensors")), &Device::Cpu).unwrap()
}

/// The golden batch's rows without their padding.
fn rows(golden: &std::collections::HashMap<String, Tensor>) -> Vec<Vec<u32>> {
    let ids = golden["ids"].to_vec2::<i32>().unwrap();
    let keep = golden["keep"].to_vec2::<f32>().unwrap();
    ids.iter()
        .zip(&keep)
        .map(|(ids, keep)| ids.iter().zip(keep).filter(|(_, &k)| k > 0.0).map(|(&id, _)| id as u32).collect())
        .collect()
}

fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
    (a - b).unwrap().abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar().unwrap()
}

/// Collects the golden rows' cells with `params` on both paths and checks them against
/// `cells{suffix}` (its depth rows `kept`, all when `None`), and `head` on them against
/// `logit{suffix}`.
fn check(
    stem: &str,
    checkpoint: &Checkpoint,
    params: Params,
    head: &ConfidenceHead,
    suffix: &str,
    kept: Option<&[u32]>,
) {
    let golden = golden(stem);
    let rows = rows(&golden);
    let network = Network::load(&checkpoint.config, &params).unwrap();
    let mut want_cells = golden[&format!("cells{suffix}")].to_dtype(DType::F32).unwrap();
    if let Some(kept) = kept {
        want_cells = want_cells.index_select(&Tensor::new(kept, &Device::Cpu).unwrap(), 2).unwrap();
    }
    let want_logits = golden[&format!("logit{suffix}")].to_vec1::<f32>().unwrap();
    for autograd in [false, true] {
        let mut forward = Forward::with_autograd(network.clone(), autograd).unwrap();
        assert_eq!(forward.hand_written(), !autograd);
        let cells = row_cells(&mut forward, &rows, None).unwrap();
        for (row, (cells, want)) in cells.iter().zip(&want_logits).enumerate() {
            let len = rows[row].len();
            let gap = max_diff(cells, &want_cells.narrow(0, row, 1).unwrap().narrow(1, 0, len).unwrap());
            assert!(gap <= CELL_TOLERANCE, "{stem}{suffix} row {row} (autograd {autograd}): cells differ by {gap}");
            let keep = Tensor::ones((1, len), DType::F32, &Device::Cpu).unwrap();
            let logit = head.logits(cells, &keep, None).unwrap().to_vec1::<f32>().unwrap()[0];
            let gap = (logit - want).abs();
            assert!(
                gap <= LOGIT_TOLERANCE,
                "{stem}{suffix} row {row} (autograd {autograd}): logit {logit}, the reference's {want}"
            );
        }
    }
}

fn load(stem: &str) -> (Checkpoint, Params, ConfidenceHead) {
    let checkpoint = Checkpoint::load(&checkpoint_path(stem)).unwrap();
    let params = Params::from_checkpoint(&checkpoint, &Device::Cpu).unwrap();
    let head = ConfidenceHead::load(&checkpoint.config, &params).unwrap().expect("the fixture has a head");
    (checkpoint, params, head)
}

#[test]
fn cells_from_tokens_give_the_references_logits() {
    for stem in ["tiny_f32", "needle3_heads"] {
        let (checkpoint, params, head) = load(stem);
        check(stem, &checkpoint, params, &head, "", None);
    }
}

/// The reference's `quant=True` on the stored weights (its `hidden_cells` embeds with the float
/// embedding: only a caller's `cq_ste_params` would put it through CQ): the activations
/// fake-quantized, and the head's matrices through CQ at 4 bits (as the `.cact` ships them).
#[test]
fn needle3_quantized_cells_give_the_references_logits() {
    let (checkpoint, params, head) = load("needle3_heads");
    let params = params.fake_quantizing(&checkpoint.config).unwrap();
    check("needle3_heads", &checkpoint, params, &head.through_cq().unwrap(), "_qat", None);
}

/// A rung built on its own computes the cells of the reference's rung in the whole network, on the
/// rows of its blocks, and its sliced head gives the reference's masked logit.
#[test]
fn needle3_sliced_rung_cells_give_the_references_logits() {
    let stem = "needle3_heads";
    let mut checkpoint = Checkpoint::load(&checkpoint_path(stem)).unwrap();
    let keep = golden(stem)["row_keep_rung"].to_vec1::<f32>().unwrap();
    let kept: Vec<u32> = (0u32..).zip(keep).filter_map(|(row, keep)| (keep > 0.0).then_some(row)).collect();
    rung(&mut checkpoint, Some(kept.len() - 1)).unwrap();
    let params = Params::from_checkpoint(&checkpoint, &Device::Cpu).unwrap();
    let head = ConfidenceHead::load(&checkpoint.config, &params).unwrap().unwrap();
    check(stem, &checkpoint, params, &head, "_rung", Some(&kept));
}
