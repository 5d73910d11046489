//! The hidden cells a confidence head reads, collected from the network that answers: each row's
//! `[1, T, R, d]`, every token kept (rows are laid out packed, without padding, so the reference's
//! padding mask has nothing to mask).

use candle_core::Tensor;

use crate::dataset::Encoded;
use crate::model::packing::Packing;
use crate::model::Result;
use crate::model::{Forward, LowRank};

/// Packed tokens computed in one pass at most (a longer row takes a pass of its own): bounds the
/// pass's activations, as training's passes are bounded.
const PASS_TOKENS: usize = 8192;

/// Each row's hidden cells `[1, T, R, d]`, computed by `forward` (`low_rank` adapting its
/// projections). Rows that begin alike (an app's tools prompt) share that prefix's computation,
/// whose cells are then every such row's own: attention is causal, so a prefix's cells do not
/// depend on what follows it.
pub fn row_cells(forward: &mut Forward, rows: &[Vec<u32>], low_rank: Option<&LowRank>) -> Result<Vec<Tensor>> {
    // No position is scored: the cells need no next-token targets, and a Needle 3 head that scores
    // only its text slice (`out_vocab`) has no logit for a token past it, which a prompt may hold.
    let encoded: Vec<Encoded> =
        rows.iter().map(|ids| Encoded { mask: vec![0.0; ids.len()], ids: ids.clone(), truncated: false }).collect();
    let mut cells: Vec<Option<Tensor>> = vec![None; rows.len()];
    for pass in Packing::new(&encoded, true)?.passes(PASS_TOKENS) {
        let members: Vec<Encoded> = pass.iter().map(|&row| encoded[row].clone()).collect();
        let packing = Packing::new(&members, true)?;
        let packed = forward.hidden_cells(&packing, low_rank)?;
        for (member, &row) in pass.iter().enumerate() {
            let indices: Vec<u32> = (0..packing.row_len(member)).map(|t| packing.index(member, t) as u32).collect();
            let indices = Tensor::from_vec(indices, packing.row_len(member), packed.device())?;
            cells[row] = Some(packed.index_select(&indices, 0)?.unsqueeze(0)?);
        }
    }
    Ok(cells.into_iter().map(|row| row.expect("every row is in one pass")).collect())
}
