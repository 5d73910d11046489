//! The CPU path's network: its layers read from the network's weights ([`crate::model::weights`]), one pass forward (and
//! back) over a packed batch, the loss and the adapter's gradients, in a [`Workspace`] kept from step
//! to step.

use std::sync::Arc;

use candle_core::Tensor;
use rayon::prelude::*;

use super::attention::FactorGrads;
use super::block;
use super::conv::Reads;
use super::engram;
use super::kept::{Kept, Work};
use super::mat::{matmul, Mat, MatMut, Threads};
use super::pass::{lane_pair, resize_zeroed, Dims, Pass, ProjectionLora};
use super::stack::HostLayer;
use crate::config::ModelConfig;
use crate::generation::Generation;
use crate::model::host::host;
use crate::model::kernels::{fake_quant_row, log_sum_exp, rms_norm_backward_row, rms_norm_row, RopeTables};
use crate::model::linear::{HostGrads, LowRank};
use crate::model::packing::Packing;
use crate::model::qat::QAT_WEIGHT_BITS;
use crate::model::{ModelError, Network, Result};
use crate::quant::cq_round_trip_columns;
use crate::simd::{exp, widest};
use crate::w4a8::{Activations, CqMatrix};

/// Scored positions projected to the vocabulary at a time: bounds the logits buffer.
const LOGIT_ROWS: usize = 512;

/// An adapter's factors on the host for every layer's projections (see [`CpuNetwork::factors`]).
pub struct HostFactors {
    layers: Vec<[Option<ProjectionLora>; 5]>,
    rank: usize,
    scale: f32,
}

/// The network's parameters as the CPU path reads them.
#[derive(Debug, Clone)]
pub struct CpuNetwork {
    pub(super) network: Network,
    pub(super) layers: Vec<HostLayer>,
    pub(super) final_gain: Vec<f32>,
}

/// Buffers of the CPU path's passes, kept from step to step.
#[derive(Debug, Default)]
pub struct Workspace {
    /// The lanes entering each layer, and the last layer's output; a forward-only pass keeps two,
    /// each layer reading one and writing the other.
    pub(super) lanes: Vec<Vec<f32>>,
    /// One per layer, or a single one that every layer reuses (recomputing, or no backward).
    pub(super) kept: Vec<Kept>,
    pub(super) work: Work,
    /// The lanes' gradient entering and leaving a layer's backward.
    pub(super) grad_in: Vec<f32>,
    pub(super) grad_out: Vec<f32>,
    /// The mean of the last lanes `[N, d]`, the final hidden states, and their gradient.
    pub(super) mean: Vec<f32>,
    pub(super) hidden: Vec<f32>,
    pub(super) grad_hidden: Vec<f32>,
    pub(super) logits: Vec<f32>,
}

impl CpuNetwork {
    /// Whether the CPU path can run `network`: its weights are f32 tensors on the CPU (of either
    /// generation).
    pub fn supports(network: &Network) -> bool {
        network.device().is_cpu()
            && network.embedding.dtype() == candle_core::DType::F32
            && computes(network.config().generation)
    }

    pub fn new(network: &Network) -> Result<Self> {
        let cfg = network.config();
        // `Network::with_codes` checked that there are codes for every layer.
        let codes = network.codes();
        let layers: Vec<HostLayer> = (network.stack.layers.iter().enumerate())
            .map(|(l, layer)| {
                let codes = codes.map(|c| (&c.layers()[l], &c.lanes()[l]));
                HostLayer::new(layer, cfg.attention_window(l), codes)
            })
            .collect::<Result<_>>()?;
        Ok(Self { layers, final_gain: network.stack.final_norm.gain()?, network: network.clone() })
    }

    pub fn network(&self) -> &Network {
        &self.network
    }

    /// Activation bytes per packed token of a pass (training when `backward`, else a forward
    /// only): what a workspace holds, for the memory plan.
    pub fn bytes_per_token(config: &crate::config::ModelConfig, rank: usize, backward: bool, recompute: bool) -> usize {
        let dims = dims_of(config, rank, 0);
        let lanes = 4 * dims.lanes * dims.d;
        let layers = config.num_layers;
        let kept = Kept::bytes_per_token(&dims) * if backward && !recompute { layers } else { 1 };
        let lane_copies = if backward { (layers + 1) * lanes + 2 * lanes } else { 2 * lanes };
        // Each site's keys and values, and the mean, hidden states and their gradient.
        let sites = 8 * dims.d * config.engram_layers.len();
        kept + lane_copies + Work::bytes_per_token(&dims, backward) + sites + 12 * dims.d
    }

    /// The factors of `low_rank` on the host (none without one), merged under QAT with the kernels
    /// they adapt: computed once a step, for every pass of it.
    pub fn factors(&self, low_rank: Option<&LowRank>) -> Result<HostFactors> {
        let scale = low_rank.map_or(0.0, |l| l.scale as f32);
        let mut layers = Vec::with_capacity(self.layers.len());
        for layer in &self.layers {
            let mut factors: [Option<ProjectionLora>; 5] = Default::default();
            for (slot, linear) in factors.iter_mut().zip(&layer.block.attention.proj) {
                if let Some((a, b)) = low_rank.and_then(|l| l.get(&linear.path, linear.layer)) {
                    let (a, b) = (a.flatten_all()?.to_vec1()?, b.flatten_all()?.to_vec1()?);
                    let merged = linear.stored().map(|stored| merged_through_cq(stored, &a, &b, scale)).transpose()?;
                    *slot = Some(ProjectionLora { a, b, merged });
                }
            }
            layers.push(factors);
        }
        Ok(HostFactors { layers, rank: low_rank.map_or(0, |l| l.rank()), scale })
    }

    /// The pass's inputs: positions, rotary tables and the engram memories on the host.
    fn pass(&self, packing: &Packing, factors: &HostFactors) -> Result<Pass> {
        let cfg = self.network.config();
        let dims = dims_of(cfg, factors.rank, packing.len());
        Ok(Pass {
            dims,
            positions: packing.positions.clone(),
            segments: packing.segments().to_vec(),
            families: packing.families(),
            rope: Arc::new(RopeTables::new(dims.qk, packing.longest_row(), cfg.rope_theta)),
            sites: engram::memories(&self.network, packing, 0)?,
            conv: (cfg.qkv_conv_taps > 0).then(|| Reads::new(packing, cfg.qkv_conv_taps)),
            lora_scale: factors.scale,
            ones: vec![1.0; dims.d],
        })
    }

    /// The embedded tokens `ids` spread over every lane, into `lanes` `[N, n·d]`.
    /// Under W4A8 each row is looked up in the embedding's codes (decoded exactly as the simulated
    /// path's float table holds it), ids checked by the caller.
    pub(super) fn embed(&self, ids: &[u32], dims: &Dims, lanes: &mut [f32]) -> Result<()> {
        match self.network.codes() {
            Some(codes) => spread_rows(ids, dims, lanes, |id, row| codes.head().row(id as usize, row)),
            None => {
                let (table, d) = (host(&self.network.embedding)?, dims.d);
                spread_rows(ids, dims, lanes, |id, row| row.copy_from_slice(&table[id as usize * d..][..d]));
            }
        }
        Ok(())
    }

    /// The forward over every layer, keeping the lanes between layers (always) and each layer's
    /// internals (when `keep_all`; else the last layer's, in `kept[0]`); each layer's index and
    /// output lanes are handed to `each` as they are made (a plain pass hands them to nothing).
    fn forward_layers(
        &self,
        pass: &Pass,
        lora: &[[Option<ProjectionLora>; 5]],
        ws: &mut Workspace,
        keep_all: bool,
        mut each: impl FnMut(usize, &[f32]),
    ) -> Result<()> {
        let Workspace { lanes, kept, work, .. } = ws;
        for (l, layer) in self.layers.iter().enumerate() {
            let kept = &mut kept[if keep_all { l } else { 0 }];
            let (input, output) = lane_pair(lanes, l);
            layer.forward(pass, &lora[l], input, kept, work, output, &[])?;
            each(l, output);
        }
        Ok(())
    }

    /// The final hidden states `[N, d]` from the last lanes: the lane mean, normed.
    pub(super) fn finish(&self, dims: &Dims, ws: &mut Workspace) {
        let (n, d) = (dims.lanes, dims.d);
        let last = &ws.lanes[self.layers.len() % ws.lanes.len()];
        (ws.mean.par_chunks_mut(d), ws.hidden.par_chunks_mut(d)).into_par_iter().zip(last.par_chunks(n * d)).for_each(
            |((mean, hidden), lanes)| {
                widest(
                    #[inline(always)]
                    || {
                        lane_mean(lanes, mean);
                        rms_norm_row(mean, &self.final_gain, hidden);
                    },
                )
            },
        );
    }

    /// The hidden cells the confidence head reads, `[N, R, d]` with `R = layers + 1`, of a packed
    /// batch under its adapter's `factors`: the scaled embedding, then the lane mean of each
    /// layer's output (before the final norm), forward only.
    pub fn hidden_cells(&self, packing: &Packing, factors: &HostFactors, ws: &mut Workspace) -> Result<Vec<f32>> {
        self.network.check_ids(packing)?;
        let pass = self.pass(packing, factors)?;
        let dims = pass.dims;
        let (n, d, rows) = (dims.lanes, dims.d, self.layers.len() + 1);
        ws.resize(&dims, self.layers.len(), false, false);
        self.embed(&packing.ids, &dims, &mut ws.lanes[0])?;
        let mut cells = vec![0f32; dims.tokens * rows * d];
        // Every lane holds the scaled embedding: the first lane is row 0.
        let embedded = &ws.lanes[0];
        cells.par_chunks_mut(rows * d).zip(embedded.par_chunks(n * d)).for_each(|(cell, lanes)| {
            cell[..d].copy_from_slice(&lanes[..d]);
        });
        self.forward_layers(&pass, &factors.layers, ws, false, |l, output| {
            cells.par_chunks_mut(rows * d).zip(output.par_chunks(n * d)).for_each(|(cell, lanes)| {
                lane_mean(lanes, &mut cell[(l + 1) * d..][..d]);
            });
        })?;
        Ok(cells)
    }

    /// Hidden states (rows of `d`) as the output head reads them: under QAT as the runtime's int8
    /// activations (straight-through for the gradient).
    pub(super) fn as_output_reads(&self, rows: &mut [f32], d: usize) {
        if let Some(qat) = self.network.qat() {
            rows.par_chunks_mut(d).for_each(|row| {
                widest(
                    #[inline(always)]
                    || fake_quant_row(row, qat.act_bits),
                )
            });
        }
    }

    /// `Σ ce·weight` over the scored positions of `packing`, from the final hidden states; with
    /// `gradient`, also `d(Σ ce·weight / normalizer)/d hidden` into `ws.grad_hidden`.
    fn scored_loss(&self, packing: &Packing, dims: &Dims, ws: &mut Workspace, gradient: Option<f64>) -> Result<f64> {
        let scored = packing.scored();
        let d = dims.d;
        let vocab = self.network.output_rows();
        // Under W4A8 (forward only) the logits multiply the embedding's codes; else its floats.
        let codes = self.network.codes().filter(|_| gradient.is_none());
        let table = match codes {
            Some(_) => None,
            None => Some(host(&self.network.embedding)?),
        };
        let embedding = table.as_ref().map(|table| Mat::new(&table[..vocab * d], vocab, d));
        if gradient.is_some() {
            ws.grad_hidden.fill(0.0);
        }
        let mut total = 0f64;
        let mut gathered = Vec::new();
        let mut grad_rows = Vec::new();
        for start in (0..scored.positions.len()).step_by(LOGIT_ROWS) {
            let end = (start + LOGIT_ROWS).min(scored.positions.len());
            let rows = end - start;
            gathered.clear();
            for &p in &scored.positions[start..end] {
                gathered.extend_from_slice(&ws.hidden[p as usize * d..][..d]);
            }
            resize_zeroed(&mut ws.logits, rows * vocab);
            match (codes, embedding) {
                (Some(codes), _) => {
                    let logits = integer_logits(codes.head(), &gathered, rows, d, vocab)?;
                    ws.logits.chunks_mut(vocab).zip(&logits).for_each(|(dst, row)| dst.copy_from_slice(row));
                }
                (None, Some(embedding)) => {
                    self.as_output_reads(&mut gathered, d);
                    let (logits, x) = (MatMut::new(&mut ws.logits, rows, vocab), Mat::new(&gathered, rows, d));
                    matmul(logits, x, embedding.t(), 1.0, false, Threads::All);
                }
                (None, None) => return Err(ModelError::Unsupported { what: "a loss without an output head".into() }),
            }
            let (targets, weights) = (&scored.targets[start..end], &scored.weights[start..end]);
            total += ws
                .logits
                .par_chunks_mut(vocab)
                .zip(targets.par_iter().zip(weights))
                .map(|(row, (&target, &weight))| {
                    widest(
                        #[inline(always)]
                        || {
                            let lse = log_sum_exp(row);
                            let ce = f64::from(lse - row[target as usize]) * f64::from(weight);
                            if let Some(normalizer) = gradient {
                                let scale = (f64::from(weight) / normalizer) as f32;
                                row.iter_mut().for_each(|x| *x = exp(*x - lse) * scale);
                                row[target as usize] -= scale;
                            }
                            ce
                        },
                    )
                })
                .sum::<f64>();
            if let (Some(_), Some(embedding)) = (gradient, embedding) {
                grad_rows.resize(rows * d, 0.0);
                matmul(
                    MatMut::new(&mut grad_rows, rows, d),
                    Mat::new(&ws.logits, rows, vocab),
                    embedding,
                    1.0,
                    false,
                    Threads::All,
                );
                for (&p, g) in scored.positions[start..end].iter().zip(grad_rows.chunks(d)) {
                    ws.grad_hidden[p as usize * d..][..d].iter_mut().zip(g).for_each(|(a, g)| *a += g);
                }
            }
        }
        Ok(total)
    }

    /// `(Σ ce·mask, Σ mask)` of a packed batch under its adapter's `factors`, forward only (under
    /// W4A8, its logits from the embedding's codes as a decoding step's are).
    pub fn masked_ce_sum(&self, packing: &Packing, factors: &HostFactors, ws: &mut Workspace) -> Result<(f64, f64)> {
        self.network.check_ids(packing)?;
        let pass = self.pass(packing, factors)?;
        ws.resize(&pass.dims, self.layers.len(), false, false);
        self.embed(&packing.ids, &pass.dims, &mut ws.lanes[0])?;
        self.forward_layers(&pass, &factors.layers, ws, false, |_, _| {})?;
        self.finish(&pass.dims, ws);
        Ok((self.scored_loss(packing, &pass.dims, ws, None)?, packing.scored().weight_sum()))
    }

    /// `Σ ce·mask / normalizer` of a packed batch and the gradients of its adapter's `factors`
    /// (added to `grads`). With `recompute`, the forward keeps only the lanes between layers and
    /// the backward recomputes each layer's internals before its backward.
    pub fn loss_and_grads(
        &self,
        packing: &Packing,
        factors: &HostFactors,
        normalizer: f64,
        recompute: bool,
        ws: &mut Workspace,
        grads: &mut HostGrads,
    ) -> Result<f32> {
        self.network.check_float_weights("training")?;
        self.network.check_ids(packing)?;
        let pass = self.pass(packing, factors)?;
        let lora = &factors.layers;
        let dims = pass.dims;
        ws.resize(&dims, self.layers.len(), true, recompute);
        self.embed(&packing.ids, &dims, &mut ws.lanes[0])?;
        self.forward_layers(&pass, lora, ws, !recompute, |_, _| {})?;
        self.finish(&dims, ws);
        let loss = self.scored_loss(packing, &dims, ws, Some(normalizer))? / normalizer;

        // Into the last lanes: through the final norm and the lane mean.
        let (n, d) = (dims.lanes, dims.d);
        let Workspace { mean, grad_hidden, grad_in, .. } = &mut *ws;
        let (mean, grad_hidden) = (&*mean, &*grad_hidden);
        grad_in.par_chunks_mut(n * d).enumerate().for_each_init(
            || vec![0f32; d],
            |g_mean, (i, lanes)| {
                widest(
                    #[inline(always)]
                    || {
                        rms_norm_backward_row(
                            &mean[i * d..][..d],
                            &self.final_gain,
                            &grad_hidden[i * d..][..d],
                            g_mean,
                        );
                        for lane in lanes.chunks_mut(d) {
                            lane.iter_mut().zip(g_mean.iter()).for_each(|(l, g)| *l = g / n as f32);
                        }
                    },
                )
            },
        );

        for (l, layer) in self.layers.iter().enumerate().rev() {
            let mut factor_grads: [Option<FactorGrads>; 5] = Default::default();
            let proj = &layer.block.attention.proj;
            for (slot, (factor, linear)) in factor_grads.iter_mut().zip(lora[l].iter().zip(proj)) {
                if let Some(factor) = factor {
                    let entry = grads.entry((linear.path.clone(), linear.layer));
                    let (ga, gb) = entry.or_insert_with(|| (vec![0.0; factor.a.len()], vec![0.0; factor.b.len()]));
                    *slot = Some((std::mem::take(ga), std::mem::take(gb)));
                }
            }
            let Workspace { lanes, kept, work, grad_in, grad_out, .. } = &mut *ws;
            let kept = if recompute {
                let (input, output) = lane_pair(lanes, l);
                layer.forward(&pass, &lora[l], input, &mut kept[0], work, output, &[])?;
                &kept[0]
            } else {
                &kept[l]
            };
            layer.backward(&pass, &lora[l], &lanes[l], kept, work, grad_in, grad_out, &mut factor_grads, l > 0)?;
            std::mem::swap(grad_in, grad_out);
            for (factor, linear) in factor_grads.into_iter().zip(proj) {
                if let Some(values) = factor {
                    grads.insert((linear.path.clone(), linear.layer), values);
                }
            }
        }
        Ok(loss as f32)
    }
}

impl Workspace {
    pub(super) fn resize(&mut self, dims: &Dims, layers: usize, backward: bool, recompute: bool) {
        let t = dims.tokens;
        let lanes = dims.lanes * dims.d;
        self.lanes.resize_with(if backward { layers + 1 } else { 2 }, Vec::new);
        self.lanes.iter_mut().for_each(|l| resize_zeroed(l, t * lanes));
        let kept = if backward && !recompute { layers } else { 1 };
        self.kept.resize_with(kept, Kept::default);
        self.kept.iter_mut().for_each(|k| k.resize(dims));
        self.work.resize(dims, backward);
        for (buf, width) in [(&mut self.mean, dims.d), (&mut self.hidden, dims.d), (&mut self.grad_hidden, dims.d)] {
            resize_zeroed(buf, t * width);
        }
        if backward {
            resize_zeroed(&mut self.grad_in, t * lanes);
            resize_zeroed(&mut self.grad_out, t * lanes);
        }
    }
}

/// Each token's row (written by `lookup(id, row)`), scaled by `√d`, into every lane of `lanes`.
fn spread_rows(ids: &[u32], dims: &Dims, lanes: &mut [f32], lookup: impl Fn(u32, &mut [f32]) + Sync) {
    let (d, scale) = (dims.d, (dims.d as f32).sqrt());
    lanes.par_chunks_mut(dims.lanes * d).zip(ids.par_iter()).for_each(|(row, &id)| {
        let (first, rest) = row.split_at_mut(d);
        lookup(id, first);
        first.iter_mut().for_each(|v| *v *= scale);
        rest.chunks_mut(d).for_each(|lane| lane.copy_from_slice(first));
    });
}

/// The mean of a token's lanes (`[n·d]`, `n` lanes of `mean`'s width) into `mean`.
fn lane_mean(lanes: &[f32], mean: &mut [f32]) {
    let n = lanes.len() / mean.len();
    mean.fill(0.0);
    lanes.chunks(mean.len()).for_each(|lane| mean.iter_mut().zip(lane).for_each(|(m, l)| *m += l));
    mean.iter_mut().for_each(|m| *m /= n as f32);
}

/// `CQ(W + s·A·B)` of a stored kernel `W` `[in, out]` and its factors, as QAT computes with an
/// adapted kernel (see [`crate::model::linear::Linear::forward`]), in the kernel's layout (CQ's
/// groups run down its columns).
fn merged_through_cq(stored: &Tensor, a: &[f32], b: &[f32], scale: f32) -> Result<Vec<f32>> {
    let (d_in, d_out) = stored.dims2()?;
    let r = a.len() / d_in;
    // `W + (A·B)·s` in the candle path's order of operations: the quantizer turns a last-bit
    // difference into a whole level now and then.
    let mut merged = vec![0f32; d_in * d_out];
    matmul(
        MatMut::new(&mut merged, d_in, d_out),
        Mat::new(a, d_in, r),
        Mat::new(b, r, d_out),
        1.0,
        false,
        Threads::All,
    );
    let stored = host(stored)?;
    merged.par_chunks_mut(d_out).zip(stored.par_chunks(d_out)).for_each(|(merged, w)| {
        merged.iter_mut().zip(w).for_each(|(m, w)| *m = w + *m * scale);
    });
    cq_round_trip_columns(&mut merged, d_in, d_out, QAT_WEIGHT_BITS);
    Ok(merged)
}

/// Whether this path computes `generation`'s network (both so far: a new generation's parts must be
/// written here before it can say yes).
const fn computes(generation: Generation) -> bool {
    match generation {
        Generation::Needle2 | Generation::Needle3 => true,
    }
}

pub(super) fn dims_of(cfg: &ModelConfig, rank: usize, tokens: usize) -> Dims {
    Dims {
        tokens,
        lanes: cfg.mhc_lanes,
        d: cfg.d_model,
        heads: cfg.num_heads,
        kv_heads: cfg.num_kv_heads,
        qk: cfg.qk_head_dim(),
        v: cfg.v_head_dim(),
        rank,
        conv: cfg.qkv_conv_taps > 0,
        mlp_kept: block::Mlp::kept_width(cfg),
    }
}

/// Logits `[vocab]` of each of `rows` hidden rows (of `d`) under W4A8: the rows quantized once,
/// multiplied by the embedding's CQ codes `head` `[embedding rows, d]` on the integer kernels, and
/// cut to the `vocab` rows the output head has.
pub(super) fn integer_logits(
    head: &CqMatrix,
    hidden: &[f32],
    rows: usize,
    d: usize,
    vocab: usize,
) -> Result<Vec<Vec<f32>>> {
    let wrong = |what: String| ModelError::Unsupported { what };
    if head.out() < vocab || head.in_dim() != d {
        let shape = [head.out(), head.in_dim()];
        return Err(wrong(format!("a W4A8 output head of shape {shape:?} for {vocab} logits of width {d}")));
    }
    let x = Activations::quantize(hidden, rows, d).map_err(|e| wrong(e.to_string()))?;
    let logits = head.product(&x).map_err(|e| wrong(e.to_string()))?;
    Ok(logits.chunks_exact(head.out()).map(|row| row[..vocab].to_vec()).collect())
}
