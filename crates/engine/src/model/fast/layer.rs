//! One layer of the stack — the mHC lane mix around a block — forward and backward by hand.
//!
//! The forward keeps, per token: the lane-gate logits before their scale (`Z = X·Φ`) and the
//! lanes' inverse RMS, the four attention projections, the LoRA down-projections, the attention
//! output and its log-sum-exp, and the attention branch's output. Everything else a backward needs
//! — the block's input `u`, the engram injection, the norms, the MLP's pre-activation, the rotated
//! queries and keys — is recomputed from those per token, which costs a few vector passes and
//! saves storing them. The layer's input lanes are the previous layer's output, kept by the caller.

use candle_core::Result;
use rayon::prelude::*;

use super::flash::{self, Heads};
use super::mat::{matmul, Mat, MatMut, Threads};
use super::{host, Dims, Pass, ProjectionLora};
use crate::model::kernels::{
    dot, inverse_rms, logistic, rms_norm_backward_row, rms_norm_row, sinkhorn_backward_row, sinkhorn_row, widest,
    HadamardMlp,
};
use crate::model::linear::Linear;
use crate::model::san::block::Mlp;
use crate::model::san::stack::{Layer, SINKHORN_ITERS};

/// Tokens per rayon task in the per-token passes: enough to amortise the hand-off.
const TOKENS_PER_TASK: usize = 8;

/// The out projection's index among a block's projections: q, k, v and gate come first, in the
/// order their outputs sit in [`Kept::proj`].
const O: usize = 4;

/// A layer's parameters: the small ones copied to the host once, the kernels shared with the
/// network (read in place for each pass).
#[derive(Debug, Clone)]
pub(super) struct HostLayer {
    /// `Φ_pre` `[n·d, n]`, `Φ_post` `[n·d, n]`, `Φ_res` `[n·d, n²]`.
    phi: [candle_core::Tensor; 3],
    /// `a_pre`, `a_post`, `a_res`.
    a: [f32; 3],
    bias_pre: Vec<f32>,
    bias_post: Vec<f32>,
    b_res: Vec<f32>,
    gain_in: Vec<f32>,
    gain_post: Vec<f32>,
    gain_hada: Vec<f32>,
    q_gain: Vec<f32>,
    k_gain: Vec<f32>,
    /// σ(attn_gate).
    attn_gate: f32,
    /// q, k, v, gate and out projections.
    pub(super) proj: [Linear; 5],
    mlp: HadamardMlp,
    /// The engram sites injected here.
    sites: Vec<usize>,
}

impl HostLayer {
    pub(super) fn new(layer: &Layer) -> crate::model::Result<Self> {
        let (mix, block) = (&layer.mix, &layer.block);
        let attn = &block.self_attn;
        let scalar = |t: &candle_core::Tensor| t.to_scalar::<f32>();
        Ok(Self {
            phi: [mix.phi_pre.clone(), mix.phi_post.clone(), mix.phi_res.clone()],
            a: [scalar(&mix.a_pre)?, scalar(&mix.a_post)?, scalar(&mix.a_res)?],
            bias_pre: mix.bias_pre.to_vec1()?,
            bias_post: mix.bias_post.to_vec1()?,
            b_res: mix.b_res.flatten_all()?.to_vec1()?,
            gain_in: block.input_norm.gain()?,
            gain_post: block.post_attn_norm.gain()?,
            gain_hada: block.pre_hada_norm.gain()?,
            q_gain: attn.q_norm.gain()?,
            k_gain: attn.k_norm.gain()?,
            attn_gate: scalar(&block.attn_gate)?,
            proj: [
                attn.q_proj.clone(),
                attn.k_proj.clone(),
                attn.v_proj.clone(),
                attn.gate_proj.clone(),
                attn.out_proj.clone(),
            ],
            mlp: match &block.mlp {
                Mlp::Hadamard(mlp) => mlp.rows()?,
                Mlp::Monarch(_) => {
                    let what = "the hand-written CPU path for Needle 3's Monarch MLP".into();
                    return Err(crate::model::ModelError::Unsupported { what });
                }
            },
            sites: layer.engram_sites.clone(),
        })
    }
}

/// What one layer's forward keeps for its backward (see the module comment), token-major unless
/// said otherwise.
#[derive(Debug, Default)]
pub(super) struct Kept {
    /// `[N, 2n + n² + 1]`: `Z = X·Φ` (pre, post, res), then the lanes' inverse RMS.
    mix: Vec<f32>,
    /// `[N, 2·attn + 2·kv]`: q, k, v and gate projections (LoRA included).
    proj: Vec<f32>,
    /// `[N, 4r]`: `h·A` of the q, k, v and gate factors.
    lora_in: Vec<f32>,
    /// `[heads, N, hd]`: the attention output, and `[heads, N]` its log-sum-exp.
    out: Vec<f32>,
    lse: Vec<f32>,
    /// `[N, d]`: the attention branch after the output projection.
    attn: Vec<f32>,
    /// `[N, r]`: `gated·A` of the out factor.
    lora_out: Vec<f32>,
}

impl Kept {
    /// Every buffer with its width per token.
    fn buffers(&mut self, dims: &Dims) -> [(&mut Vec<f32>, usize); 7] {
        [
            (&mut self.mix, dims.mix_width()),
            (&mut self.proj, dims.proj_width()),
            (&mut self.lora_in, 4 * dims.rank),
            (&mut self.out, dims.attn),
            (&mut self.lse, dims.heads),
            (&mut self.attn, dims.d),
            (&mut self.lora_out, dims.rank),
        ]
    }

    pub(super) fn resize(&mut self, dims: &Dims) {
        self.buffers(dims).into_iter().for_each(|(buf, width)| buf.resize(dims.tokens * width, 0.0));
    }

    /// Bytes per token.
    pub(super) fn bytes_per_token(dims: &Dims) -> usize {
        4 * Self::default().buffers(dims).iter().map(|(_, width)| width).sum::<usize>()
    }
}

/// Buffers a layer's passes write and read within the layer, reused by every layer.
#[derive(Debug, Default)]
pub(super) struct Work {
    u: Vec<f32>,
    x1: Vec<f32>,
    h1: Vec<f32>,
    /// Head-major rotated queries and keys, and values.
    qh: Vec<f32>,
    kh: Vec<f32>,
    vh: Vec<f32>,
    gated: Vec<f32>,
    // Backward only.
    da: Vec<f32>,
    dx1: Vec<f32>,
    dupd: Vec<f32>,
    /// `[N, 2n + n²]`: the lane logits' gradient, then `Z`'s.
    dl: Vec<f32>,
    dgated: Vec<f32>,
    dout: Vec<f32>,
    dqh: Vec<f32>,
    dkh: Vec<f32>,
    dvh: Vec<f32>,
    dproj: Vec<f32>,
    dh1: Vec<f32>,
    /// `[N, r]`: a factor's `dY·Bᵀ`.
    low: Vec<f32>,
}

impl Work {
    /// The pass's rotated keys and values, head-major `[kv_heads, N, hd]`, as the last forward
    /// left them: what a decoding step adds to its cache.
    pub(super) fn keys_and_values(&self) -> (&[f32], &[f32]) {
        (&self.kh, &self.vh)
    }

    /// Every buffer a pass uses with its width per token: the forward's, then (with `backward`)
    /// the backward's.
    fn buffers(&mut self, dims: &Dims, backward: bool) -> Vec<(&mut Vec<f32>, usize)> {
        let (d, a, kv) = (dims.d, dims.attn, dims.kv);
        let mut buffers = vec![
            (&mut self.u, d),
            (&mut self.x1, d),
            (&mut self.h1, d),
            (&mut self.qh, a),
            (&mut self.kh, kv),
            (&mut self.vh, kv),
            (&mut self.gated, a),
        ];
        if backward {
            buffers.extend([
                (&mut self.da, d),
                (&mut self.dx1, d),
                (&mut self.dupd, d),
                (&mut self.dl, dims.mix_width() - 1),
                (&mut self.dgated, a),
                (&mut self.dout, a),
                (&mut self.dqh, a),
                (&mut self.dkh, kv),
                (&mut self.dvh, kv),
                (&mut self.dproj, dims.proj_width()),
                (&mut self.dh1, d),
                (&mut self.low, dims.rank),
            ]);
        }
        buffers
    }

    pub(super) fn resize(&mut self, dims: &Dims, backward: bool) {
        self.buffers(dims, backward).into_iter().for_each(|(buf, width)| buf.resize(dims.tokens * width, 0.0));
    }

    /// Bytes per token of the buffers of a pass with (or without) a backward.
    pub(super) fn bytes_per_token(dims: &Dims, backward: bool) -> usize {
        4 * Self::default().buffers(dims, backward).iter().map(|(_, width)| width).sum::<usize>()
    }
}

/// A LoRA factor's gradients, `dA` `[in, r]` and `dB` `[r, out]`, summed over passes.
pub(super) type FactorGrads = (Vec<f32>, Vec<f32>);

/// Per-token scratch rows of the passes that run the MLP and the lane gates.
struct Scratch {
    x2: Vec<f32>,
    h2: Vec<f32>,
    c: Vec<f32>,
    z: Vec<f32>,
    upd: Vec<f32>,
    tmp: Vec<f32>,
    gates: Vec<f32>,
    hres: Vec<f32>,
    dres: Vec<f32>,
    /// The Sinkhorn iterations' matrices.
    sinkhorn: Vec<f32>,
}

impl Scratch {
    fn new(dims: &Dims, mlp: &HadamardMlp) -> Self {
        let (d, n) = (dims.d, dims.lanes);
        Self {
            x2: vec![0.0; d],
            h2: vec![0.0; d],
            c: vec![0.0; mlp.width()],
            z: vec![0.0; mlp.width()],
            upd: vec![0.0; d],
            tmp: vec![0.0; d.max(dims.head_dim)],
            gates: vec![0.0; 2 * n + n * n],
            hres: vec![0.0; n * n],
            dres: vec![0.0; n * n],
            sinkhorn: Vec::new(),
        }
    }
}

/// The lane gates of one token from `Z` and the inverse RMS `r`: `h_pre = σ(a·r·Z + b)`,
/// `h_post = 2σ(…)`, and the res logits (before Sinkhorn), into `gates` (pre, post, res).
#[inline(always)]
fn lane_gates(layer: &HostLayer, n: usize, z: &[f32], r: f32, gates: &mut [f32]) {
    let [a_pre, a_post, a_res] = layer.a;
    for i in 0..n {
        gates[i] = logistic(a_pre * r * z[i] + layer.bias_pre[i]);
        gates[n + i] = 2.0 * logistic(a_post * r * z[n + i] + layer.bias_post[i]);
    }
    for k in 0..n * n {
        gates[2 * n + k] = a_res * r * z[2 * n + k] + layer.b_res[k];
    }
}

/// The block's input `u = Σᵢ h_pre[i]·Xᵢ` of one token.
#[inline(always)]
fn block_input(x: &[f32], h_pre: &[f32], u: &mut [f32]) {
    let d = u.len();
    u.fill(0.0);
    for (lane, &w) in x.chunks(d).zip(h_pre) {
        u.iter_mut().zip(lane).for_each(|(u, x)| *u += w * x);
    }
}

impl HostLayer {
    /// `u`, `x1 = u + injection(u)` and `h1 = norm(x1)` of every token into `work` (the forward's
    /// first pass, and the backward's recomputation), from `x` and the gate logits `mix`.
    fn block_inputs(&self, pass: &Pass, x: &[f32], mix: &[f32], work: &mut Work) {
        let dims = &pass.dims;
        let (nd, d, n, mw) = (dims.lanes * dims.d, dims.d, dims.lanes, dims.mix_width());
        let scale = 1.0 / (d as f32).sqrt();
        (work.u.par_chunks_mut(d), work.x1.par_chunks_mut(d), work.h1.par_chunks_mut(d))
            .into_par_iter()
            .enumerate()
            .with_min_len(TOKENS_PER_TASK)
            .for_each_init(
                || vec![0f32; 2 * n + n * n],
                |gates, (t, (u, x1, h1))| {
                    widest(
                        #[inline(always)]
                        || {
                            let m = &mix[t * mw..][..mw];
                            lane_gates(self, n, m, m[mw - 1], gates);
                            block_input(&x[t * nd..][..nd], &gates[..n], u);
                            x1.copy_from_slice(u);
                            let r_u = inverse_rms(u);
                            for &s in &self.sites {
                                let site = &pass.sites[s];
                                let (key, value) = (&site.key_unit[t * d..][..d], &site.value[t * d..][..d]);
                                let gate = logistic(r_u * dot(u, key) * scale);
                                x1.iter_mut().zip(value).for_each(|(x, v)| *x += gate * v);
                            }
                            rms_norm_row(x1, &self.gain_in, h1);
                        },
                    )
                },
            );
    }

    /// Head-major rotated queries and keys, and values, from the kept projections.
    fn heads(&self, pass: &Pass, proj: &[f32], work: &mut Work) {
        let dims = &pass.dims;
        let (hd, pw, t) = (dims.head_dim, dims.proj_width(), dims.tokens);
        let (k_col, v_col) = (dims.attn, dims.attn + dims.kv);
        let rows = |buf: &mut Vec<f32>, col: usize, gain: Option<&Vec<f32>>| {
            buf.par_chunks_mut(t * hd).enumerate().for_each_init(
                || vec![0f32; hd],
                |tmp, (h, slab)| {
                    widest(
                        #[inline(always)]
                        || {
                            for (i, out) in slab.chunks_mut(hd).enumerate() {
                                let x = &proj[i * pw + col + h * hd..][..hd];
                                match gain {
                                    Some(gain) => {
                                        rms_norm_row(x, gain, tmp);
                                        pass.rope.rotate(pass.positions[i] as usize, tmp, out, false);
                                    }
                                    None => out.copy_from_slice(x),
                                }
                            }
                        },
                    )
                },
            )
        };
        rows(&mut work.qh, 0, Some(&self.q_gain));
        rows(&mut work.kh, k_col, Some(&self.k_gain));
        rows(&mut work.vh, v_col, None);
    }

    /// `gated = out ⊙ σ(gate projection)`, token-major, from the head-major output.
    fn gated(&self, pass: &Pass, kept: &Kept, gated: &mut [f32]) {
        let dims = &pass.dims;
        let (hd, a, pw, t) = (dims.head_dim, dims.attn, dims.proj_width(), dims.tokens);
        let g_col = dims.attn + 2 * dims.kv;
        gated.par_chunks_mut(a).enumerate().with_min_len(TOKENS_PER_TASK).for_each(|(i, row)| {
            widest(
                #[inline(always)]
                || {
                    let gate = &kept.proj[i * pw + g_col..][..a];
                    for (h, part) in row.chunks_mut(hd).enumerate() {
                        let out = &kept.out[(h * t + i) * hd..][..hd];
                        part.iter_mut()
                            .zip(out.iter().zip(&gate[h * hd..]))
                            .for_each(|(g, (o, z))| *g = o * logistic(*z));
                    }
                },
            )
        });
    }

    /// The layer's forward over lanes `x` `[N, n·d]` into `next`, keeping what the backward needs;
    /// attention also reads the `cached` keys of earlier positions when decoding.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn forward(
        &self,
        pass: &Pass,
        lora: &[Option<ProjectionLora>; 5],
        x: &[f32],
        kept: &mut Kept,
        work: &mut Work,
        next: &mut [f32],
        cached: Option<flash::Cached>,
    ) -> Result<()> {
        let dims = &pass.dims;
        let (t, n, d, nd) = (dims.tokens, dims.lanes, dims.d, dims.lanes * dims.d);
        let mw = dims.mix_width();
        // Z = X·Φ for the three gate families, then each token's inverse RMS.
        for (phi, (col, width)) in self.phi.iter().zip(dims.gate_columns()) {
            let phi = host(phi)?;
            let dst = MatMut::strided(&mut kept.mix[col..], t, width, mw);
            matmul(dst, Mat::new(x, t, nd), Mat::new(&phi, nd, width), 1.0, false, Threads::All);
        }
        kept.mix.par_chunks_mut(mw).zip(x.par_chunks(nd)).for_each(|(m, x)| m[mw - 1] = widest(|| inverse_rms(x)));
        self.block_inputs(pass, x, &kept.mix, work);

        // The q, k, v and gate projections of h1, with their low-rank updates.
        let (pw, r) = (dims.proj_width(), dims.rank);
        for (p, (col, width)) in dims.proj_columns().into_iter().enumerate() {
            let weight = host(&self.proj[p].weight)?;
            let h1 = Mat::new(&work.h1, t, d);
            matmul(
                MatMut::strided(&mut kept.proj[col..], t, width, pw),
                h1,
                Mat::new(&weight, d, width),
                1.0,
                false,
                Threads::All,
            );
            if let Some(factor) = &lora[p] {
                let low = MatMut::strided(&mut kept.lora_in[p * r..], t, r, 4 * r);
                matmul(low, h1, Mat::new(&factor.a, d, r), 1.0, false, Threads::All);
                let low = Mat::strided(&kept.lora_in[p * r..], t, r, 4 * r);
                let dst = MatMut::strided(&mut kept.proj[col..], t, width, pw);
                matmul(dst, low, Mat::new(&factor.b, r, width), pass.lora_scale, true, Threads::All);
            }
        }

        self.heads(pass, &kept.proj, work);
        flash::forward(
            pass.heads(),
            &pass.segments,
            &work.qh,
            &work.kh,
            &work.vh,
            cached,
            &mut kept.out,
            &mut kept.lse,
        );
        self.gated(pass, kept, &mut work.gated);

        // The output projection, with its low-rank update.
        let a = dims.attn;
        let weight = host(&self.proj[O].weight)?;
        let gated = Mat::new(&work.gated, t, a);
        matmul(MatMut::new(&mut kept.attn, t, d), gated, Mat::new(&weight, a, d), 1.0, false, Threads::All);
        if let Some(factor) = &lora[O] {
            matmul(MatMut::new(&mut kept.lora_out, t, r), gated, Mat::new(&factor.a, a, r), 1.0, false, Threads::All);
            let low = Mat::new(&kept.lora_out, t, r);
            matmul(
                MatMut::new(&mut kept.attn, t, d),
                low,
                Mat::new(&factor.b, r, d),
                pass.lora_scale,
                true,
                Threads::All,
            );
        }

        // The rest of the block, and the lanes mixed with its update added.
        let (kept, work) = (&*kept, &*work);
        next.par_chunks_mut(nd).enumerate().with_min_len(TOKENS_PER_TASK).for_each_init(
            || Scratch::new(dims, &self.mlp),
            |s, (i, next)| {
                widest(
                    #[inline(always)]
                    || {
                        let m = &kept.mix[i * mw..][..mw];
                        self.update(i, dims, kept, &work.u, &work.x1, s);
                        lane_gates(self, n, m, m[mw - 1], &mut s.gates);
                        sinkhorn_row(&s.gates[2 * n..], n, SINKHORN_ITERS, &mut s.hres, &mut s.sinkhorn);
                        let x = &x[i * nd..][..nd];
                        for (lane, out) in next.chunks_mut(d).enumerate() {
                            let h_post = s.gates[n + lane];
                            out.iter_mut().zip(&s.upd).for_each(|(o, u)| *o = h_post * u);
                            for (j, x_j) in x.chunks(d).enumerate() {
                                let w = s.hres[lane * n + j];
                                out.iter_mut().zip(x_j).for_each(|(o, x)| *o += w * x);
                            }
                        }
                    },
                )
            },
        );
        Ok(())
    }

    /// The layer's backward: `dx` `[N, n·d]` (overwritten) from the output's gradient `dnext`,
    /// with the forward's `kept` (and its input `x`); the LoRA factors' gradients are added to
    /// `grads`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn backward(
        &self,
        pass: &Pass,
        lora: &[Option<ProjectionLora>; 5],
        x: &[f32],
        kept: &Kept,
        work: &mut Work,
        dnext: &[f32],
        dx: &mut [f32],
        grads: &mut [Option<FactorGrads>; 5],
    ) -> Result<()> {
        let dims = &pass.dims;
        let (t, n, d, nd) = (dims.tokens, dims.lanes, dims.d, dims.lanes * dims.d);
        let (mw, lw, a, r) = (dims.mix_width(), dims.mix_width() - 1, dims.attn, dims.rank);
        self.block_inputs(pass, x, &kept.mix, work);

        // Through the lane mix, the MLP and the post-attention norm, token by token.
        {
            let Work { u, x1, da, dx1, dupd, dl, .. } = &mut *work;
            let (u, x1) = (&*u, &*x1);
            (
                dx.par_chunks_mut(nd),
                da.par_chunks_mut(d),
                dx1.par_chunks_mut(d),
                dupd.par_chunks_mut(d),
                dl.par_chunks_mut(lw),
            )
                .into_par_iter()
                .enumerate()
                .with_min_len(TOKENS_PER_TASK)
                .for_each_init(
                    || Scratch::new(dims, &self.mlp),
                    |s, (i, (dx, da, dx1, dupd, dl))| {
                        widest(
                            #[inline(always)]
                            || {
                                let m = &kept.mix[i * mw..][..mw];
                                let (x, g) = (&x[i * nd..][..nd], &dnext[i * nd..][..nd]);
                                self.update(i, dims, kept, u, x1, s);
                                lane_gates(self, n, m, m[mw - 1], &mut s.gates);
                                let logits_res = &s.gates[2 * n..];
                                sinkhorn_row(logits_res, n, SINKHORN_ITERS, &mut s.hres, &mut s.sinkhorn);
                                // upd's gradient, the gates' gradients, and the mix's share of dx.
                                dupd.fill(0.0);
                                dx.fill(0.0);
                                for (lane, g_i) in g.chunks(d).enumerate() {
                                    let h_post = s.gates[n + lane];
                                    dupd.iter_mut().zip(g_i).for_each(|(du, g)| *du += h_post * g);
                                    dl[n + lane] = dot(g_i, &s.upd) * h_post * (1.0 - h_post / 2.0);
                                    for (j, x_j) in x.chunks(d).enumerate() {
                                        s.dres[lane * n + j] = dot(g_i, x_j);
                                        let w = s.hres[lane * n + j];
                                        dx[j * d..][..d].iter_mut().zip(g_i).for_each(|(dx, g)| *dx += w * g);
                                    }
                                }
                                sinkhorn_backward_row(
                                    logits_res,
                                    &s.dres,
                                    n,
                                    SINKHORN_ITERS,
                                    &mut dl[2 * n..],
                                    &mut s.sinkhorn,
                                );
                                // y = x2 + mlp(norm(x2)): dx2 = dy + norm'(mlp'(dy)), with dy = dupd.
                                self.mlp.backward(&s.c, dupd, &mut s.z, &mut s.h2);
                                rms_norm_backward_row(&s.x2, &self.gain_hada, &s.h2, dx1);
                                dx1.iter_mut().zip(dupd.iter()).for_each(|(dx1, dy)| *dx1 += dy);
                                // x2 = x1 + σ(gate)·norm(attn).
                                s.tmp[..d].iter_mut().zip(dx1.iter()).for_each(|(t, g)| *t = self.attn_gate * g);
                                rms_norm_backward_row(&kept.attn[i * d..][..d], &self.gain_post, &s.tmp[..d], da);
                            },
                        )
                    },
                );
        }

        // The output projection: dgated = da·Woᵀ, and its factor's gradients.
        self.gated(pass, kept, &mut work.gated);
        let weight = host(&self.proj[O].weight)?;
        let da = Mat::new(&work.da, t, d);
        matmul(MatMut::new(&mut work.dgated, t, a), da, Mat::new(&weight, a, d).t(), 1.0, false, Threads::All);
        if let (Some(factor), Some((grad_a, grad_b))) = (&lora[O], &mut grads[O]) {
            matmul(MatMut::new(&mut work.low, t, r), da, Mat::new(&factor.b, r, d).t(), 1.0, false, Threads::All);
            let low = Mat::new(&work.low, t, r);
            let s = pass.lora_scale;
            matmul(MatMut::new(&mut work.dgated, t, a), low, Mat::new(&factor.a, a, r).t(), s, true, Threads::All);
            matmul(MatMut::new(grad_b, r, d), Mat::new(&kept.lora_out, t, r).t(), da, s, true, Threads::All);
            matmul(MatMut::new(grad_a, a, r), Mat::new(&work.gated, t, a).t(), low, s, true, Threads::All);
        }

        // Attention: the gradient of its output, then the flash backward.
        let (hd, pw) = (dims.head_dim, dims.proj_width());
        let g_col = dims.attn + 2 * dims.kv;
        {
            let (dgated, proj) = (&work.dgated, &kept.proj);
            work.dout.par_chunks_mut(t * hd).enumerate().for_each(|(h, slab)| {
                widest(
                    #[inline(always)]
                    || {
                        for (i, out) in slab.chunks_mut(hd).enumerate() {
                            let (g, z) = (&dgated[i * a + h * hd..][..hd], &proj[i * pw + g_col + h * hd..][..hd]);
                            out.iter_mut().zip(g.iter().zip(z)).for_each(|(o, (g, z))| *o = g * logistic(*z));
                        }
                    },
                )
            });
        }
        self.heads(pass, &kept.proj, work);
        let saved = flash::Saved { q: &work.qh, k: &work.kh, v: &work.vh, out: &kept.out, lse: &kept.lse };
        flash::backward(
            pass.heads(),
            &pass.segments,
            &pass.families,
            &saved,
            &work.dout,
            &mut work.dqh,
            &mut work.dkh,
            &mut work.dvh,
        );

        // The projections' gradients, token by token: through the rotation and the head norms.
        {
            let Work { dgated, dqh, dkh, dvh, dproj, .. } = &mut *work;
            let (dgated, dqh, dkh, dvh) = (&*dgated, &*dqh, &*dkh, &*dvh);
            let (kv_heads, heads) = (dims.kv_heads, dims.heads);
            dproj.par_chunks_mut(pw).enumerate().with_min_len(TOKENS_PER_TASK).for_each_init(
                || vec![0f32; hd],
                |tmp, (i, row)| {
                    widest(
                        #[inline(always)]
                        || {
                            let position = pass.positions[i] as usize;
                            let p = &kept.proj[i * pw..][..pw];
                            for (col, count, grads, gain) in
                                [(0, heads, dqh, &self.q_gain), (dims.attn, kv_heads, dkh, &self.k_gain)]
                            {
                                for h in 0..count {
                                    pass.rope.rotate(position, &grads[(h * t + i) * hd..][..hd], tmp, true);
                                    let at = col + h * hd;
                                    rms_norm_backward_row(&p[at..at + hd], gain, tmp, &mut row[at..at + hd]);
                                }
                            }
                            for h in 0..kv_heads {
                                let at = dims.attn + dims.kv + h * hd;
                                row[at..at + hd].copy_from_slice(&dvh[(h * t + i) * hd..][..hd]);
                            }
                            let (g, z) = (&dgated[i * a..][..a], &p[g_col..g_col + a]);
                            for (c, (g, z)) in g.iter().zip(z).enumerate() {
                                let s = logistic(*z);
                                let o = kept.out[((c / hd) * t + i) * hd + c % hd];
                                row[g_col + c] = g * o * s * (1.0 - s);
                            }
                        },
                    )
                },
            );
        }

        // dh1 = Σ dP·Wᵀ over q, k, v and gate, and their factors' gradients.
        for (p, (col, width)) in dims.proj_columns().into_iter().enumerate() {
            let weight = host(&self.proj[p].weight)?;
            let dp = Mat::strided(&work.dproj[col..], t, width, pw);
            matmul(MatMut::new(&mut work.dh1, t, d), dp, Mat::new(&weight, d, width).t(), 1.0, p > 0, Threads::All);
            if let (Some(factor), Some((grad_a, grad_b))) = (&lora[p], &mut grads[p]) {
                let s = pass.lora_scale;
                matmul(
                    MatMut::new(&mut work.low, t, r),
                    dp,
                    Mat::new(&factor.b, r, width).t(),
                    1.0,
                    false,
                    Threads::All,
                );
                let low = Mat::new(&work.low, t, r);
                matmul(MatMut::new(&mut work.dh1, t, d), low, Mat::new(&factor.a, d, r).t(), s, true, Threads::All);
                let lora_in = Mat::strided(&kept.lora_in[p * r..], t, r, 4 * r);
                matmul(MatMut::new(grad_b, r, width), lora_in.t(), dp, s, true, Threads::All);
                matmul(MatMut::new(grad_a, d, r), Mat::new(&work.h1, t, d).t(), low, s, true, Threads::All);
            }
        }

        // Back through the input norm, the engram injection, u and the lane gates.
        {
            let Work { u, x1, dh1, dx1, dupd, dl, .. } = &mut *work;
            let (u, x1, dh1, dx1, dupd) = (&*u, &*x1, &*dh1, &*dx1, &*dupd);
            let scale = 1.0 / (d as f32).sqrt();
            let [a_pre, a_post, a_res] = self.a;
            (dx.par_chunks_mut(nd), dl.par_chunks_mut(lw))
                .into_par_iter()
                .enumerate()
                .with_min_len(TOKENS_PER_TASK)
                .for_each_init(
                    || (vec![0f32; d], vec![0f32; d], vec![0f32; d], vec![0f32; d], vec![0f32; 2 * n + n * n]),
                    |(du, tmp, part, engram, gates), (i, (dx, dl))| {
                        widest(
                            #[inline(always)]
                            || {
                                let m = &kept.mix[i * mw..][..mw];
                                let r_x = m[mw - 1];
                                let (x, u) = (&x[i * nd..][..nd], &u[i * d..][..d]);
                                rms_norm_backward_row(&x1[i * d..][..d], &self.gain_in, &dh1[i * d..][..d], du);
                                du.iter_mut().zip(&dx1[i * d..][..d]).for_each(|(du, g)| *du += g);
                                // x1 = u + Σₛ σ(cₛ)·vₛ with cₛ = ⟨unit(u), k̂ₛ⟩/√d: every site's gate reads u.
                                let r_u = inverse_rms(u);
                                engram.fill(0.0);
                                for &site in &self.sites {
                                    let site = &pass.sites[site];
                                    let (key, value) = (&site.key_unit[i * d..][..d], &site.value[i * d..][..d]);
                                    let gate = logistic(r_u * dot(u, key) * scale);
                                    let coef = dot(du, value) * gate * (1.0 - gate) * scale;
                                    tmp.iter_mut().zip(key).for_each(|(t, k)| *t = coef * k);
                                    rms_norm_backward_row(u, &pass.ones, tmp, part);
                                    engram.iter_mut().zip(part.iter()).for_each(|(e, p)| *e += p);
                                }
                                du.iter_mut().zip(engram.iter()).for_each(|(du, e)| *du += e);
                                // upd = … − u.
                                du.iter_mut().zip(&dupd[i * d..][..d]).for_each(|(du, g)| *du -= g);
                                lane_gates(self, n, m, r_x, gates);
                                for (lane, x_l) in x.chunks(d).enumerate() {
                                    let h_pre = gates[lane];
                                    dl[lane] = dot(du, x_l) * h_pre * (1.0 - h_pre);
                                    dx[lane * d..][..d]
                                        .iter_mut()
                                        .zip(du.iter())
                                        .for_each(|(dx, du)| *dx += h_pre * du);
                                }
                                // logits = a·r·Z + b: dZ = a·r·dlogits, and r's own gradient.
                                let mut dr = 0f32;
                                for (k, dl) in dl.iter_mut().enumerate() {
                                    let a = if k < n {
                                        a_pre
                                    } else if k < 2 * n {
                                        a_post
                                    } else {
                                        a_res
                                    };
                                    dr += a * *dl * m[k];
                                    *dl *= a * r_x;
                                }
                                let coef = -dr * r_x * r_x * r_x / nd as f32;
                                dx.iter_mut().zip(x).for_each(|(dx, x)| *dx += coef * x);
                            },
                        )
                    },
                );
        }
        for (phi, (col, width)) in self.phi.iter().zip(dims.gate_columns()) {
            let phi = host(phi)?;
            let dz = Mat::strided(&work.dl[col..], t, width, lw);
            matmul(MatMut::new(dx, t, nd), dz, Mat::new(&phi, nd, width).t(), 1.0, true, Threads::All);
        }
        Ok(())
    }

    /// Token `i`'s block output minus its input, `upd = x2 + mlp(norm(x2)) − u` with
    /// `x2 = x1 + σ(gate)·norm(attn)`, into `s.upd`, from the block inputs `u` and `x1`; leaves
    /// `x2` and the MLP's pre-activation in `s`.
    #[inline(always)]
    fn update(&self, i: usize, dims: &Dims, kept: &Kept, u: &[f32], x1: &[f32], s: &mut Scratch) {
        let d = dims.d;
        let (u, x1, attn) = (&u[i * d..][..d], &x1[i * d..][..d], &kept.attn[i * d..][..d]);
        rms_norm_row(attn, &self.gain_post, &mut s.tmp[..d]);
        s.x2.iter_mut().zip(x1.iter().zip(&s.tmp)).for_each(|(x2, (x1, a))| *x2 = x1 + self.attn_gate * a);
        rms_norm_row(&s.x2, &self.gain_hada, &mut s.h2);
        self.mlp.pre_activation(&s.h2, &mut s.c);
        self.mlp.output(&s.c, &mut s.z, &mut s.upd);
        s.upd.iter_mut().zip(s.x2.iter().zip(u)).for_each(|(m, (x2, u))| *m += x2 - u);
    }
}

impl Pass {
    /// The geometry of the pass's attention call.
    fn heads(&self) -> Heads {
        Heads {
            heads: self.dims.heads,
            kv_heads: self.dims.kv_heads,
            head_dim: self.dims.head_dim,
            tokens: self.dims.tokens,
        }
    }
}
