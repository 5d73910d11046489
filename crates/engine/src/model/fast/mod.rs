//! The CPU training path: the same network as the candle modules, computed without candle's
//! autograd. Each layer's forward keeps the few tensors its own backward needs ([`layer`]), the
//! backward is written out by hand, attention is flash-style ([`flash`]), every matrix product is
//! one `gemm` call on host slices ([`mat`]) and the per-token work runs on rayon's pool. Nothing is
//! kept per operation, no gradient is formed for a frozen weight, and the buffers live in a
//! [`Workspace`] reused from step to step.
//!
//! The kernels are read in place from the network's tensors (no copy of the base model); the
//! small parameters (gains, gate scalars, the MLP's diagonals and factors, the lane gates'
//! projections) are copied once. The candle path
//! stays the reference for what is computed: the parity tests check this one against it and
//! against the reference's goldens. CUDA and Metal run the candle path.

mod attention;
mod block;
mod conv;
mod decode;
mod engram;
mod flash;
mod kv_cache;
mod lanes;
mod layer;
mod mat;
mod mlp;
mod monarch;
#[cfg(test)]
mod parity_tests;

pub use decode::CpuDecode;

use std::collections::HashMap;
use std::ops::Deref;
use std::sync::Arc;

use candle_core::{bail, CpuStorage, Storage, Tensor};
use rayon::prelude::*;

use self::attention::FactorGrads;
use self::conv::Reads;
use self::engram::Site;
use self::layer::{HostLayer, Kept, Work};
use self::mat::{matmul, Mat, MatMut, Threads};
use super::kernels::{exp, fake_quant_row, log_sum_exp, rms_norm_backward_row, rms_norm_row, widest, RopeTables};
use super::linear::LowRank;
use super::packing::{Family, Packing, Segment};
use super::params::QAT_WEIGHT_BITS;
use super::Network;
use super::Result;
use crate::cact::quant::cq_round_trip_columns;

/// Scored positions projected to the vocabulary at a time: bounds the logits buffer.
const LOGIT_ROWS: usize = 512;

/// A CPU f32 tensor's elements, read in place while the view (and its read guard) lives.
pub(super) struct HostView<G> {
    guard: G,
    start: usize,
    end: usize,
}

impl<G: Deref<Target = Storage>> Deref for HostView<G> {
    type Target = [f32];

    fn deref(&self) -> &[f32] {
        match &*self.guard {
            Storage::Cpu(CpuStorage::F32(values)) => &values[self.start..self.end],
            // `host` admits nothing else.
            _ => &[],
        }
    }
}

/// The elements of `tensor`, which must be a contiguous f32 tensor on the CPU.
pub(super) fn host(tensor: &Tensor) -> candle_core::Result<HostView<impl Deref<Target = Storage> + '_>> {
    let (guard, layout) = tensor.storage_and_layout();
    let Some((start, end)) = layout.contiguous_offsets() else { bail!("the CPU path reads contiguous tensors") };
    if !matches!(&*guard, Storage::Cpu(CpuStorage::F32(_))) {
        bail!("the CPU path reads f32 tensors on the CPU, got {:?}", tensor.dtype());
    }
    Ok(HostView { guard, start, end })
}

/// The sizes of one pass.
#[derive(Debug, Clone, Copy)]
struct Dims {
    tokens: usize,
    lanes: usize,
    d: usize,
    heads: usize,
    kv_heads: usize,
    /// The width of a query or key head, and of a value head.
    qk: usize,
    v: usize,
    rank: usize,
    /// Whether the layers convolve Q, K and V (Needle 3).
    conv: bool,
    /// Floats per token the MLP keeps for its backward ([`block::Mlp::kept_width`]).
    mlp_kept: usize,
}

impl Dims {
    /// `Z` (pre, post, res gate logits) and the inverse RMS, per token.
    fn mix_width(&self) -> usize {
        2 * self.lanes + self.lanes * self.lanes + 1
    }

    fn q_width(&self) -> usize {
        self.heads * self.qk
    }

    fn k_width(&self) -> usize {
        self.kv_heads * self.qk
    }

    fn v_width(&self) -> usize {
        self.kv_heads * self.v
    }

    /// The width of the attention's output: its gate, and the output projection's input.
    fn o_width(&self) -> usize {
        self.heads * self.v
    }

    /// The width of the q, k and v projections together: what the convolution reads.
    fn qkv_width(&self) -> usize {
        self.q_width() + self.k_width() + self.v_width()
    }

    fn proj_width(&self) -> usize {
        self.qkv_width() + self.o_width()
    }

    /// (first column, width) of the q, k, v and gate projections in a projection row.
    fn proj_columns(&self) -> [(usize, usize); 4] {
        let (q, k, v, o) = (self.q_width(), self.k_width(), self.v_width(), self.o_width());
        [(0, q), (q, k), (q + k, v), (q + k + v, o)]
    }
}

/// What every layer of a pass reads besides its lanes.
struct Pass {
    dims: Dims,
    positions: Vec<u32>,
    segments: Vec<Segment>,
    families: Vec<Family>,
    rope: Arc<RopeTables>,
    sites: Vec<Site>,
    /// The tokens Needle 3's Q/K/V convolution reads.
    conv: Option<Reads>,
    lora_scale: f32,
    /// A unit gain, for the RMS normalisations that have none.
    ones: Vec<f32>,
}

/// A LoRA factor of one projection on the host: `A` `[in, r]`, `B` `[r, out]`, and under QAT the
/// kernel it adapts merged with it and through CQ, `CQ(W + s·A·B)` `[in, out]` (what the pass
/// multiplies by instead of `W`).
struct ProjectionLora {
    a: Vec<f32>,
    b: Vec<f32>,
    merged: Option<Vec<f32>>,
}

/// An adapter's factors on the host for every layer's projections (see [`CpuNetwork::factors`]).
pub struct HostFactors {
    layers: Vec<[Option<ProjectionLora>; 5]>,
    rank: usize,
    scale: f32,
}

/// Gradients of the factors of a [`LowRank`], by kernel path and layer: `(dA, dB)` flattened, in
/// the factors' shapes.
pub type HostGrads = HashMap<(String, usize), (Vec<f32>, Vec<f32>)>;

/// The network's parameters as the CPU path reads them.
#[derive(Debug, Clone)]
pub struct CpuNetwork {
    network: Network,
    layers: Vec<HostLayer>,
    final_gain: Vec<f32>,
}

/// Buffers of the CPU path's passes, kept from step to step.
#[derive(Debug, Default)]
pub struct Workspace {
    /// The lanes entering each layer, and the last layer's output; a forward-only pass keeps two,
    /// each layer reading one and writing the other.
    lanes: Vec<Vec<f32>>,
    /// One per layer, or a single one that every layer reuses (recomputing, or no backward).
    kept: Vec<Kept>,
    work: Work,
    /// The lanes' gradient entering and leaving a layer's backward.
    grad_in: Vec<f32>,
    grad_out: Vec<f32>,
    /// The mean of the last lanes `[N, d]`, the final hidden states, and their gradient.
    mean: Vec<f32>,
    hidden: Vec<f32>,
    grad_hidden: Vec<f32>,
    logits: Vec<f32>,
}

impl CpuNetwork {
    /// Whether the CPU path can run `network`: its weights are f32 tensors on the CPU (of either
    /// generation).
    pub fn supports(network: &Network) -> bool {
        network.device().is_cpu()
            && network.embedding.dtype() == candle_core::DType::F32
            && network.config().generation.profile().cpu_path
    }

    pub fn new(network: &Network) -> Result<Self> {
        let cfg = network.config();
        let layers = (network.stack.layers.iter().enumerate())
            .map(|(l, layer)| HostLayer::new(layer, cfg.attention_window(l)))
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
    fn embed(&self, ids: &[u32], dims: &Dims, lanes: &mut [f32]) -> Result<()> {
        let table = host(&self.network.embedding)?;
        let (d, scale) = (dims.d, (dims.d as f32).sqrt());
        lanes.par_chunks_mut(dims.lanes * d).zip(ids.par_iter()).for_each(|(row, &id)| {
            let embedding = &table[id as usize * d..][..d];
            for lane in row.chunks_mut(d) {
                lane.iter_mut().zip(embedding).for_each(|(l, e)| *l = e * scale);
            }
        });
        Ok(())
    }

    /// The forward over every layer, keeping the lanes between layers (always) and each layer's
    /// internals (when `keep_all`; else the last layer's, in `kept[0]`).
    fn forward_layers(
        &self,
        pass: &Pass,
        lora: &[[Option<ProjectionLora>; 5]],
        ws: &mut Workspace,
        keep_all: bool,
    ) -> Result<()> {
        let Workspace { lanes, kept, work, .. } = ws;
        for (l, layer) in self.layers.iter().enumerate() {
            let kept = &mut kept[if keep_all { l } else { 0 }];
            let (input, output) = lane_pair(lanes, l);
            layer.forward(pass, &lora[l], input, kept, work, output, None)?;
        }
        Ok(())
    }

    /// The final hidden states `[N, d]` from the last lanes: the lane mean, normed.
    fn finish(&self, dims: &Dims, ws: &mut Workspace) {
        let (n, d) = (dims.lanes, dims.d);
        let last = &ws.lanes[self.layers.len() % ws.lanes.len()];
        (ws.mean.par_chunks_mut(d), ws.hidden.par_chunks_mut(d)).into_par_iter().zip(last.par_chunks(n * d)).for_each(
            |((mean, hidden), lanes)| {
                widest(
                    #[inline(always)]
                    || {
                        mean.fill(0.0);
                        lanes.chunks(d).for_each(|lane| mean.iter_mut().zip(lane).for_each(|(m, l)| *m += l));
                        mean.iter_mut().for_each(|m| *m /= n as f32);
                        rms_norm_row(mean, &self.final_gain, hidden);
                    },
                )
            },
        );
    }

    /// Hidden states (rows of `d`) as the output head reads them: under QAT as the runtime's int8
    /// activations (straight-through for the gradient).
    fn as_output_reads(&self, rows: &mut [f32], d: usize) {
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
        let table = host(&self.network.embedding)?;
        let vocab = self.network.output_rows();
        let embedding = Mat::new(&table[..vocab * d], vocab, d);
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
            self.as_output_reads(&mut gathered, d);
            resize_zeroed(&mut ws.logits, rows * vocab);
            matmul(
                MatMut::new(&mut ws.logits, rows, vocab),
                Mat::new(&gathered, rows, d),
                embedding.t(),
                1.0,
                false,
                Threads::All,
            );
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
            if gradient.is_some() {
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

    /// `(Σ ce·mask, Σ mask)` of a packed batch under its adapter's `factors`, forward only.
    pub fn masked_ce_sum(&self, packing: &Packing, factors: &HostFactors, ws: &mut Workspace) -> Result<(f64, f64)> {
        self.network.check_ids(packing)?;
        let pass = self.pass(packing, factors)?;
        ws.resize(&pass.dims, self.layers.len(), false, false);
        self.embed(&packing.ids, &pass.dims, &mut ws.lanes[0])?;
        self.forward_layers(&pass, &factors.layers, ws, false)?;
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
        self.network.check_ids(packing)?;
        let pass = self.pass(packing, factors)?;
        let lora = &factors.layers;
        let dims = pass.dims;
        ws.resize(&dims, self.layers.len(), true, recompute);
        self.embed(&packing.ids, &dims, &mut ws.lanes[0])?;
        self.forward_layers(&pass, lora, ws, !recompute)?;
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
                layer.forward(&pass, &lora[l], input, &mut kept[0], work, output, None)?;
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
    fn resize(&mut self, dims: &Dims, layers: usize, backward: bool, recompute: bool) {
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

/// `buf.resize(len, 0.0)`, with the new elements written on the pool. The first write to a fresh
/// page is the kernel's fault and zeroing, which a first step would otherwise wait for on one
/// thread: a 1024-token Needle 3 training pass's workspace took 0.38–0.45 s that way on a 2-core
/// Zen 4, 0.15–0.19 s on both cores.
fn resize_zeroed(buf: &mut Vec<f32>, len: usize) {
    match len.checked_sub(buf.len()) {
        Some(0) => {}
        Some(grow) => buf.par_extend(rayon::iter::repeat_n(0.0, grow)),
        None => buf.truncate(len),
    }
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

/// Layer `l`'s input lanes and the buffer its output goes to.
fn lane_pair(lanes: &mut [Vec<f32>], l: usize) -> (&[f32], &mut [f32]) {
    let count = lanes.len();
    let (input, output) = (l % count, (l + 1) % count);
    if input < output {
        let (before, after) = lanes.split_at_mut(output);
        (&before[input], &mut after[0])
    } else {
        let (before, after) = lanes.split_at_mut(input);
        (&after[0], &mut before[output])
    }
}

fn dims_of(cfg: &crate::config::ModelConfig, rank: usize, tokens: usize) -> Dims {
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
