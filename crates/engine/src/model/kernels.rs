//! Fused operations with hand-written backward passes, for the training path.
//!
//! candle's autograd keeps every intermediate of a composite op and computes a gradient for every
//! operand, frozen or not: `x·W` with a frozen `W` still forms `xᵀ·dY` (a dense weight gradient),
//! and `x ⊙ gain` still reduces a gradient for the gain. The ops here keep only their input and
//! return a gradient for it alone, so the frozen base model costs no backward work of its own.
//!
//! [`frozen_matmul`] runs on every backend (it calls the backend's own matmul). The others have a
//! CPU kernel; on CUDA and Metal they fall back to the composite candle ops they replace, which
//! their tests compare them with on the CPU.

use candle_core::backend::BackendStorage;
use candle_core::{
    bail, CpuStorage, CudaStorage, CustomOp1, CustomOp2, DType, Layout, MetalStorage, Result, Shape, Storage, Tensor, D,
};
use rayon::prelude::*;
use std::sync::Arc;

/// RMSNorm's ε, as the reference's `ZCRMSNorm` and `rms_unit` use it.
pub const RMS_EPSILON: f32 = 1e-6;

/// Rows of this many elements or fewer are processed on one thread: rayon's hand-off costs more.
const PARALLEL_MIN: usize = 1 << 14;

/// The contiguous f32 elements of a CPU tensor.
fn f32s<'a>(storage: &'a CpuStorage, layout: &Layout) -> Result<&'a [f32]> {
    let CpuStorage::F32(values) = storage else { bail!("fused ops take f32 tensors, got {:?}", storage.dtype()) };
    match layout.contiguous_offsets() {
        Some((start, end)) => Ok(&values[start..end]),
        None => bail!("fused ops take contiguous tensors"),
    }
}

/// Applies `f(row_in, row_out)` to every `width`-wide row, in parallel when the work is large.
fn map_rows(input: &[f32], width: usize, f: impl Fn(usize, &[f32], &mut [f32]) + Sync) -> Vec<f32> {
    let mut out = vec![0f32; input.len()];
    if input.len() <= PARALLEL_MIN {
        out.chunks_mut(width).zip(input.chunks(width)).enumerate().for_each(|(i, (o, x))| f(i, x, o));
    } else {
        out.par_chunks_mut(width).zip(input.par_chunks(width)).enumerate().for_each(|(i, (o, x))| f(i, x, o));
    }
    out
}

/// Like [`map_rows`] over two inputs of the same shape (a forward input and a gradient).
fn map_row_pairs(a: &[f32], b: &[f32], width: usize, f: impl Fn(usize, &[f32], &[f32], &mut [f32]) + Sync) -> Vec<f32> {
    let mut out = vec![0f32; a.len()];
    if a.len() <= PARALLEL_MIN {
        out.chunks_mut(width)
            .zip(a.chunks(width).zip(b.chunks(width)))
            .enumerate()
            .for_each(|(i, (o, (x, g)))| f(i, x, g, o));
    } else {
        out.par_chunks_mut(width)
            .zip(a.par_chunks(width).zip(b.par_chunks(width)))
            .enumerate()
            .for_each(|(i, (o, (x, g)))| f(i, x, g, o));
    }
    out
}

/// Whether the fused CPU kernels serve `x` (else the composite ops do).
fn fused(x: &Tensor) -> bool {
    x.device().is_cpu() && x.dtype() == DType::F32
}

// ---------------------------------------------------------------------------------------------
// x·W with W frozen

/// `x·W` for a frozen `W` `[k, n]` (any strides, e.g. a transposed view): the backward returns
/// `dY·Wᵀ` for `x` and nothing else. `x` is `[…, k]`.
pub fn frozen_matmul(x: &Tensor, weight: &Tensor) -> Result<Tensor> {
    x.contiguous()?.apply_op1(FrozenMatmul { weight: weight.clone() })
}

struct FrozenMatmul {
    weight: Tensor,
}

impl FrozenMatmul {
    fn forward<S: BackendStorage>(&self, x: &S, x_layout: &Layout, w: &S, w_layout: &Layout) -> Result<(S, Shape)> {
        let dims = x_layout.dims();
        let k = *dims.last().unwrap_or(&0);
        let (w_k, n) = w_layout.shape().dims2()?;
        if k != w_k {
            bail!("frozen matmul: input width {k} but the weight is {w_k}×{n}");
        }
        let m = x_layout.shape().elem_count() / k.max(1);
        let rows = Layout::contiguous_with_offset((m, k), x_layout.start_offset());
        let out = x.matmul(w, (1, m, n, k), &rows, w_layout)?;
        let mut shape = dims.to_vec();
        *shape.last_mut().expect("x has a last axis") = n;
        Ok((out, Shape::from(shape)))
    }
}

impl CustomOp1 for FrozenMatmul {
    fn name(&self) -> &'static str {
        "frozen-matmul"
    }

    fn cpu_fwd(&self, x: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let (storage, w_layout) = self.weight.storage_and_layout();
        let Storage::Cpu(w) = &*storage else { bail!("frozen matmul: the weight is on another device") };
        self.forward(x, layout, w, w_layout)
    }

    fn cuda_fwd(&self, x: &CudaStorage, layout: &Layout) -> Result<(CudaStorage, Shape)> {
        let (storage, w_layout) = self.weight.storage_and_layout();
        let Storage::Cuda(w) = &*storage else { bail!("frozen matmul: the weight is on another device") };
        self.forward(x, layout, w, w_layout)
    }

    fn metal_fwd(&self, x: &MetalStorage, layout: &Layout) -> Result<(MetalStorage, Shape)> {
        let (storage, w_layout) = self.weight.storage_and_layout();
        let Storage::Metal(w) = &*storage else { bail!("frozen matmul: the weight is on another device") };
        self.forward(x, layout, w, w_layout)
    }

    fn bwd(&self, _x: &Tensor, _y: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(frozen_matmul(grad, &self.weight.t()?)?))
    }
}

// ---------------------------------------------------------------------------------------------
// The Hadamard MLP

/// The Hadamard MLP over the last axis: `(d3 ⊙ H(silu(d2 ⊙ H(d1 ⊙ pad(x)))))[..d]`, with `H`
/// Sylvester's Hadamard matrix scaled by `1/√n` and `pad` zero-padding to its width `n`. On the
/// CPU one op: `H` as an O(n log n) butterfly, nothing kept but the input (the backward recomputes
/// the two transforms) and no gradient for the frozen diagonals. Elsewhere the composite ops with
/// `walsh_matrix` (the dense `H`, which those devices must provide).
pub fn hadamard_mlp(x: &Tensor, diagonals: [&Tensor; 3], walsh_matrix: Option<&Tensor>) -> Result<Tensor> {
    if fused(x) {
        let [d1, d2, d3] = diagonals.map(|d| d.to_vec1::<f32>());
        return x.contiguous()?.apply_op1(HadamardMlp { d1: d1?, d2: d2?, d3: d3? });
    }
    match walsh_matrix {
        Some(matrix) => hadamard_mlp_composite(x, diagonals, matrix),
        None => bail!("hadamard mlp: {:?} needs the dense Walsh matrix", x.device().location()),
    }
}

fn hadamard_mlp_composite(x: &Tensor, [d1, d2, d3]: [&Tensor; 3], walsh_matrix: &Tensor) -> Result<Tensor> {
    let d = x.dim(D::Minus1)?;
    let z = x.pad_with_zeros(D::Minus1, 0, walsh_matrix.dim(0)? - d)?;
    let z = frozen_matmul(&z.broadcast_mul(d1)?, walsh_matrix)?;
    let z = frozen_matmul(&z.broadcast_mul(d2)?.silu()?, walsh_matrix)?;
    z.broadcast_mul(d3)?.narrow(D::Minus1, 0, d)
}

/// The orthonormal Walsh–Hadamard transform of one row, in place, natural (Sylvester) order.
fn walsh_row(row: &mut [f32]) {
    let n = row.len();
    let mut h = 1;
    while h < n {
        for block in row.chunks_mut(2 * h) {
            let (lo, hi) = block.split_at_mut(h);
            for (a, b) in lo.iter_mut().zip(hi.iter_mut()) {
                let (x, y) = (*a, *b);
                *a = x + y;
                *b = x - y;
            }
        }
        h *= 2;
    }
    let unit = 1.0 / (n as f32).sqrt();
    row.iter_mut().for_each(|v| *v *= unit);
}

fn logistic(x: f32) -> f32 {
    // Split by sign so that exp never overflows.
    if x >= 0.0 {
        1.0 / (1.0 + (-x).exp())
    } else {
        let e = x.exp();
        e / (1.0 + e)
    }
}

struct HadamardMlp {
    d1: Vec<f32>,
    d2: Vec<f32>,
    d3: Vec<f32>,
}

impl HadamardMlp {
    /// `c = d2 ⊙ H(d1 ⊙ pad(x))`, the pre-activation, into `c` (the padded width).
    fn pre_activation(&self, x: &[f32], c: &mut [f32]) {
        c.fill(0.0);
        c[..x.len()].iter_mut().zip(x.iter().zip(&self.d1)).for_each(|(c, (x, d))| *c = x * d);
        walsh_row(c);
        c.iter_mut().zip(&self.d2).for_each(|(c, d)| *c *= d);
    }

    fn check(&self, layout: &Layout) -> Result<usize> {
        let d = layout.dims().last().copied().unwrap_or(0);
        let n = self.d1.len();
        if !n.is_power_of_two() || d > n || self.d2.len() != n || self.d3.len() != n {
            bail!("hadamard mlp: width {d} does not fit diagonals of {n}");
        }
        Ok(d)
    }
}

impl CustomOp1 for HadamardMlp {
    fn name(&self) -> &'static str {
        "hadamard-mlp"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let d = self.check(layout)?;
        let out = map_rows(f32s(storage, layout)?, d, |_, x, y| {
            let mut z = vec![0f32; self.d1.len()];
            self.pre_activation(x, &mut z);
            z.iter_mut().for_each(|c| *c *= logistic(*c));
            walsh_row(&mut z);
            y.iter_mut().zip(z.iter().zip(&self.d3)).for_each(|(y, (z, d))| *y = z * d);
        });
        Ok((CpuStorage::F32(out), layout.shape().clone()))
    }

    fn bwd(&self, x: &Tensor, _y: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        let backward =
            HadamardMlpBackward(HadamardMlp { d1: self.d1.clone(), d2: self.d2.clone(), d3: self.d3.clone() });
        Ok(Some(x.apply_op2_no_bwd(&grad.contiguous()?, &backward)?))
    }
}

/// `dx = (d1 ⊙ H(d2 ⊙ silu'(c) ⊙ H(d3 ⊙ pad(dy))))[..d]`, with `c` recomputed from `x`.
struct HadamardMlpBackward(HadamardMlp);

impl CustomOp2 for HadamardMlpBackward {
    fn name(&self) -> &'static str {
        "hadamard-mlp-backward"
    }

    fn cpu_fwd(&self, xs: &CpuStorage, xl: &Layout, gs: &CpuStorage, gl: &Layout) -> Result<(CpuStorage, Shape)> {
        let mlp = &self.0;
        let d = mlp.check(xl)?;
        let out = map_row_pairs(f32s(xs, xl)?, f32s(gs, gl)?, d, |_, x, dy, dx| {
            let n = mlp.d1.len();
            let mut c = vec![0f32; n];
            mlp.pre_activation(x, &mut c);
            let mut g = vec![0f32; n];
            g[..d].iter_mut().zip(dy.iter().zip(&mlp.d3)).for_each(|(g, (dy, d3))| *g = dy * d3);
            walsh_row(&mut g);
            for ((g, c), d2) in g.iter_mut().zip(&c).zip(&mlp.d2) {
                let s = logistic(*c);
                *g *= (s + c * s * (1.0 - s)) * d2;
            }
            walsh_row(&mut g);
            dx.iter_mut().zip(g.iter().zip(&mlp.d1)).for_each(|(dx, (g, d1))| *dx = g * d1);
        });
        Ok((CpuStorage::F32(out), xl.shape().clone()))
    }
}

// ---------------------------------------------------------------------------------------------
// Residual lanes

/// `Σᵢ h[…, i] · lanes[…, i, :]`: one mixture of the lanes, `lanes` `[…, n, d]`, `h` `[…, n]`.
pub fn lane_read(lanes: &Tensor, h: &Tensor) -> Result<Tensor> {
    if fused(lanes) {
        return lanes.contiguous()?.apply_op2(&h.contiguous()?, LaneRead);
    }
    lanes.broadcast_mul(&h.unsqueeze(D::Minus1)?)?.sum(D::Minus2)
}

/// `h[…, i] · u[…, :]` for every lane i: `[…, n, d]` from `h` `[…, n]` and `u` `[…, d]`.
pub fn lane_spread(h: &Tensor, u: &Tensor) -> Result<Tensor> {
    if fused(u) {
        return h.contiguous()?.apply_op2(&u.contiguous()?, LaneSpread);
    }
    h.unsqueeze(D::Minus1)?.broadcast_mul(&u.unsqueeze(D::Minus2)?)
}

/// `Σⱼ m[…, i, j] · lanes[…, j, :]` for every lane i: the lanes mixed by `m` `[…, n, n]`.
pub fn lane_mix(m: &Tensor, lanes: &Tensor) -> Result<Tensor> {
    if fused(lanes) {
        return m.contiguous()?.apply_op2(&lanes.contiguous()?, LaneMix { transpose: false });
    }
    m.matmul(lanes)
}

/// Lane geometry of `[…, n, d]` lanes: (positions, n, d).
fn lane_dims(layout: &Layout) -> Result<(usize, usize, usize)> {
    let dims = layout.dims();
    if dims.len() < 2 {
        bail!("lane ops take [..., lanes, width] tensors, got {dims:?}");
    }
    let (n, d) = (dims[dims.len() - 2], dims[dims.len() - 1]);
    Ok((layout.shape().elem_count() / (n * d).max(1), n, d))
}

/// Applies `f(position, out)` over `[positions, out_width]`, in parallel when large.
fn per_position(positions: usize, out_width: usize, f: impl Fn(usize, &mut [f32]) + Sync) -> Vec<f32> {
    let mut out = vec![0f32; positions * out_width];
    if out.len() <= PARALLEL_MIN {
        out.chunks_mut(out_width.max(1)).enumerate().for_each(|(p, o)| f(p, o));
    } else {
        out.par_chunks_mut(out_width.max(1)).enumerate().for_each(|(p, o)| f(p, o));
    }
    out
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(a, b)| a * b).sum()
}

struct LaneRead;

impl CustomOp2 for LaneRead {
    fn name(&self) -> &'static str {
        "lane-read"
    }

    fn cpu_fwd(&self, xs: &CpuStorage, xl: &Layout, hs: &CpuStorage, hl: &Layout) -> Result<(CpuStorage, Shape)> {
        let (positions, n, d) = lane_dims(xl)?;
        let (x, h) = (f32s(xs, xl)?, f32s(hs, hl)?);
        let out = per_position(positions, d, |p, o| {
            for i in 0..n {
                let w = h[p * n + i];
                o.iter_mut().zip(&x[(p * n + i) * d..][..d]).for_each(|(o, x)| *o += w * x);
            }
        });
        let dims = xl.dims();
        let mut shape = dims[..dims.len() - 2].to_vec();
        shape.push(d);
        Ok((CpuStorage::F32(out), Shape::from(shape)))
    }

    fn bwd(&self, x: &Tensor, h: &Tensor, _u: &Tensor, grad: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let grad = grad.contiguous()?;
        Ok((Some(h.apply_op2_no_bwd(&grad, &LaneSpread)?), Some(x.apply_op2_no_bwd(&grad, &LaneDots)?)))
    }
}

struct LaneSpread;

impl CustomOp2 for LaneSpread {
    fn name(&self) -> &'static str {
        "lane-spread"
    }

    fn cpu_fwd(&self, hs: &CpuStorage, hl: &Layout, us: &CpuStorage, ul: &Layout) -> Result<(CpuStorage, Shape)> {
        let n = hl.dims().last().copied().unwrap_or(1);
        let d = ul.dims().last().copied().unwrap_or(1);
        let positions = ul.shape().elem_count() / d.max(1);
        let (h, u) = (f32s(hs, hl)?, f32s(us, ul)?);
        let out = per_position(positions, n * d, |p, o| {
            for (i, lane) in o.chunks_mut(d).enumerate() {
                let w = h[p * n + i];
                lane.iter_mut().zip(&u[p * d..][..d]).for_each(|(o, u)| *o = w * u);
            }
        });
        let mut shape = hl.dims().to_vec();
        shape.push(d);
        Ok((CpuStorage::F32(out), Shape::from(shape)))
    }

    fn bwd(&self, h: &Tensor, u: &Tensor, _y: &Tensor, grad: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let grad = grad.contiguous()?;
        Ok((Some(grad.apply_op2_no_bwd(u, &LaneDots)?), Some(grad.apply_op2_no_bwd(h, &LaneRead)?)))
    }
}

/// `⟨lanes[…, i, :], u[…, :]⟩` per lane: `[…, n]`.
struct LaneDots;

impl CustomOp2 for LaneDots {
    fn name(&self) -> &'static str {
        "lane-dots"
    }

    fn cpu_fwd(&self, xs: &CpuStorage, xl: &Layout, us: &CpuStorage, ul: &Layout) -> Result<(CpuStorage, Shape)> {
        let (positions, n, d) = lane_dims(xl)?;
        let (x, u) = (f32s(xs, xl)?, f32s(us, ul)?);
        let out = per_position(positions, n, |p, o| {
            let u = &u[p * d..][..d];
            o.iter_mut().enumerate().for_each(|(i, o)| *o = dot(&x[(p * n + i) * d..][..d], u));
        });
        let dims = xl.dims();
        Ok((CpuStorage::F32(out), Shape::from(dims[..dims.len() - 1].to_vec())))
    }
}

/// `out[i] = Σⱼ m[i, j] · lanes[j]` (or `m[j, i]` when `transpose`), per position.
struct LaneMix {
    transpose: bool,
}

impl CustomOp2 for LaneMix {
    fn name(&self) -> &'static str {
        "lane-mix"
    }

    fn cpu_fwd(&self, ms: &CpuStorage, ml: &Layout, xs: &CpuStorage, xl: &Layout) -> Result<(CpuStorage, Shape)> {
        let (positions, n, d) = lane_dims(xl)?;
        let (m, x) = (f32s(ms, ml)?, f32s(xs, xl)?);
        let out = per_position(positions, n * d, |p, o| {
            let m = &m[p * n * n..][..n * n];
            for (i, lane) in o.chunks_mut(d).enumerate() {
                for j in 0..n {
                    let w = if self.transpose { m[j * n + i] } else { m[i * n + j] };
                    lane.iter_mut().zip(&x[(p * n + j) * d..][..d]).for_each(|(o, x)| *o += w * x);
                }
            }
        });
        Ok((CpuStorage::F32(out), xl.shape().clone()))
    }

    fn bwd(&self, m: &Tensor, x: &Tensor, _y: &Tensor, grad: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let grad = grad.contiguous()?;
        let dm = grad.apply_op2_no_bwd(x, &LaneOuter)?;
        let dx = m.apply_op2_no_bwd(&grad, &LaneMix { transpose: true })?;
        Ok((Some(dm), Some(dx)))
    }
}

/// `⟨a[…, i, :], b[…, j, :]⟩` for every pair of lanes: `[…, n, n]`.
struct LaneOuter;

impl CustomOp2 for LaneOuter {
    fn name(&self) -> &'static str {
        "lane-outer"
    }

    fn cpu_fwd(&self, as_: &CpuStorage, al: &Layout, bs: &CpuStorage, bl: &Layout) -> Result<(CpuStorage, Shape)> {
        let (positions, n, d) = lane_dims(al)?;
        let (a, b) = (f32s(as_, al)?, f32s(bs, bl)?);
        let out = per_position(positions, n * n, |p, o| {
            for i in 0..n {
                for j in 0..n {
                    o[i * n + j] = dot(&a[(p * n + i) * d..][..d], &b[(p * n + j) * d..][..d]);
                }
            }
        });
        let dims = al.dims();
        let mut shape = dims[..dims.len() - 1].to_vec();
        shape.push(n);
        Ok((CpuStorage::F32(out), Shape::from(shape)))
    }
}

// ---------------------------------------------------------------------------------------------
// RMS normalisation with an optional frozen gain

/// `gain · x / sqrt(mean(x²) + ε)` over the last axis; `gain` (`[width]`, frozen) may be absent.
pub fn rms_norm(x: &Tensor, gain: Option<&Tensor>) -> Result<Tensor> {
    if fused(x) {
        let gain = match gain {
            Some(g) => g.to_vec1::<f32>()?,
            None => vec![1.0; x.dim(D::Minus1)?],
        };
        return x.contiguous()?.apply_op1(RmsNorm { gain });
    }
    rms_norm_composite(x, gain)
}

fn rms_norm_composite(x: &Tensor, gain: Option<&Tensor>) -> Result<Tensor> {
    let rms = (x.sqr()?.mean_keepdim(D::Minus1)? + f64::from(RMS_EPSILON))?.sqrt()?;
    let unit = x.broadcast_div(&rms)?;
    match gain {
        Some(gain) => unit.broadcast_mul(gain),
        None => Ok(unit),
    }
}

struct RmsNorm {
    /// Ones when the norm has no gain.
    gain: Vec<f32>,
}

fn inverse_rms(x: &[f32]) -> f32 {
    let mean_square = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    1.0 / (mean_square + RMS_EPSILON).sqrt()
}

impl CustomOp1 for RmsNorm {
    fn name(&self) -> &'static str {
        "rms-norm"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let width = layout.dims().last().copied().unwrap_or(1);
        if self.gain.len() != width {
            bail!("rms norm: a gain of {} for rows of {width}", self.gain.len());
        }
        let out = map_rows(f32s(storage, layout)?, width, |_, x, o| {
            let r = inverse_rms(x);
            o.iter_mut().zip(x.iter().zip(&self.gain)).for_each(|(o, (x, g))| *o = x * r * g);
        });
        Ok((CpuStorage::F32(out), layout.shape().clone()))
    }

    fn bwd(&self, x: &Tensor, _y: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        let backward = RmsNormBackward { gain: self.gain.clone() };
        Ok(Some(x.apply_op2_no_bwd(&grad.contiguous()?, &backward)?))
    }
}

/// `dx = r·(g⊙dy − x̂·mean(g⊙dy⊙x̂))` with `x̂ = r·x`.
struct RmsNormBackward {
    gain: Vec<f32>,
}

impl CustomOp2 for RmsNormBackward {
    fn name(&self) -> &'static str {
        "rms-norm-backward"
    }

    fn cpu_fwd(&self, xs: &CpuStorage, xl: &Layout, gs: &CpuStorage, gl: &Layout) -> Result<(CpuStorage, Shape)> {
        let width = xl.dims().last().copied().unwrap_or(1);
        let out = map_row_pairs(f32s(xs, xl)?, f32s(gs, gl)?, width, |_, x, dy, dx| {
            let r = inverse_rms(x);
            dx.iter_mut().zip(dy.iter().zip(&self.gain)).for_each(|(dx, (dy, g))| *dx = dy * g);
            let scale = dot(dx, x) * r * r / width as f32;
            dx.iter_mut().zip(x).for_each(|(dx, x)| *dx = r * (*dx - x * scale));
        });
        Ok((CpuStorage::F32(out), xl.shape().clone()))
    }
}

// ---------------------------------------------------------------------------------------------
// Logistic function

/// `1 / (1 + e^{−x})`. The backward pass is `dy·y·(1 − y)` from the output, so an overflowed
/// `e^{−x}` never meets a zero gradient. The composite form is `½ + ½·tanh(x/2)` for the same
/// reason.
pub fn sigmoid(x: &Tensor) -> Result<Tensor> {
    if fused(x) {
        return x.contiguous()?.apply_op1(Sigmoid);
    }
    sigmoid_composite(x)
}

fn sigmoid_composite(x: &Tensor) -> Result<Tensor> {
    (x * 0.5)?.tanh()?.affine(0.5, 0.5)
}

struct Sigmoid;

impl CustomOp1 for Sigmoid {
    fn name(&self) -> &'static str {
        "sigmoid"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let width = layout.dims().last().copied().unwrap_or(1).max(1);
        let out =
            map_rows(f32s(storage, layout)?, width, |_, x, y| y.iter_mut().zip(x).for_each(|(y, x)| *y = logistic(*x)));
        Ok((CpuStorage::F32(out), layout.shape().clone()))
    }

    fn bwd(&self, _x: &Tensor, y: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(y.apply_op2_no_bwd(&grad.contiguous()?, &SigmoidBackward)?))
    }
}

struct SigmoidBackward;

impl CustomOp2 for SigmoidBackward {
    fn name(&self) -> &'static str {
        "sigmoid-backward"
    }

    fn cpu_fwd(&self, ys: &CpuStorage, yl: &Layout, gs: &CpuStorage, gl: &Layout) -> Result<(CpuStorage, Shape)> {
        let width = yl.dims().last().copied().unwrap_or(1).max(1);
        let out = map_row_pairs(f32s(ys, yl)?, f32s(gs, gl)?, width, |_, y, dy, dx| {
            dx.iter_mut().zip(y.iter().zip(dy)).for_each(|(dx, (y, dy))| *dx = dy * y * (1.0 - y));
        });
        Ok((CpuStorage::F32(out), yl.shape().clone()))
    }
}

// ---------------------------------------------------------------------------------------------
// Rotary position embedding

/// Rotates `x` `[B, H, T, head_dim]` by the angles whose `cos`/`sin` are `[T, head_dim/2]`: halves
/// `(x1, x2)` become `(x1·cos − x2·sin, x2·cos + x1·sin)`. The backward rotates the gradient back.
/// `tables` are the same tables on the host, for the CPU kernel.
pub fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor, tables: Option<&Arc<RopeTables>>) -> Result<Tensor> {
    match tables {
        Some(tables) if fused(x) => x.contiguous()?.apply_op1(Rope { tables: Arc::clone(tables), inverse: false }),
        _ => rope_composite(x, cos, sin),
    }
}

fn rope_composite(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let half = x.dim(3)? / 2;
    let (x1, x2) = (x.narrow(3, 0, half)?, x.narrow(3, half, half)?);
    let first = (x1.broadcast_mul(cos)? - x2.broadcast_mul(sin)?)?;
    let second = (x2.broadcast_mul(cos)? + x1.broadcast_mul(sin)?)?;
    Tensor::cat(&[first, second], 3)
}

/// `cos` and `sin` of every (position, frequency), row-major `[T, head_dim/2]`.
#[derive(Debug)]
pub struct RopeTables {
    pub cos: Vec<f32>,
    pub sin: Vec<f32>,
}

struct Rope {
    tables: Arc<RopeTables>,
    /// Rotate by the negated angles (the backward pass).
    inverse: bool,
}

impl CustomOp1 for Rope {
    fn name(&self) -> &'static str {
        "rope"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let (_, _, t, head_dim) = layout.shape().dims4()?;
        let half = head_dim / 2;
        if self.tables.cos.len() != t * half {
            bail!("rope: tables for {} angles, rows of {t} × {half}", self.tables.cos.len());
        }
        let sign = if self.inverse { -1.0 } else { 1.0 };
        let out = map_rows(f32s(storage, layout)?, head_dim, |row, x, y| {
            let at = row % t * half;
            let (cos, sin) = (&self.tables.cos[at..at + half], &self.tables.sin[at..at + half]);
            let (x1, x2) = x.split_at(half);
            let (y1, y2) = y.split_at_mut(half);
            for i in 0..half {
                let (c, s) = (cos[i], sign * sin[i]);
                y1[i] = x1[i] * c - x2[i] * s;
                y2[i] = x2[i] * c + x1[i] * s;
            }
        });
        Ok((CpuStorage::F32(out), layout.shape().clone()))
    }

    fn bwd(&self, _x: &Tensor, _y: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        let inverse = Rope { tables: Arc::clone(&self.tables), inverse: !self.inverse };
        Ok(Some(grad.contiguous()?.apply_op1_no_bwd(&inverse)?))
    }
}

// ---------------------------------------------------------------------------------------------
// Causal softmax

/// `softmax(scale · scores + causal)` over the last axis of `[…, T, T]` scores, the mask implicit:
/// query row q sees keys 0..=q. The composite form adds `causal` (`[1, 1, T, T]`, 0 / −∞).
pub fn causal_softmax(scores: &Tensor, scale: f64, causal: &Tensor) -> Result<Tensor> {
    if fused(scores) {
        return scores.contiguous()?.apply_op1(CausalSoftmax { scale: scale as f32 });
    }
    causal_softmax_composite(scores, scale, causal)
}

fn causal_softmax_composite(scores: &Tensor, scale: f64, causal: &Tensor) -> Result<Tensor> {
    let masked = (scores * scale)?.broadcast_add(causal)?;
    let last = masked.rank() - 1;
    let e = masked.broadcast_sub(&masked.max_keepdim(last)?.detach())?.exp()?;
    e.broadcast_div(&e.sum_keepdim(last)?)
}

struct CausalSoftmax {
    scale: f32,
}

impl CustomOp1 for CausalSoftmax {
    fn name(&self) -> &'static str {
        "causal-softmax"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let t = layout.dims().last().copied().unwrap_or(1);
        let out = map_rows(f32s(storage, layout)?, t, |row, x, o| {
            let seen = row % t + 1;
            let max = x[..seen].iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut sum = 0f32;
            for (o, x) in o[..seen].iter_mut().zip(x) {
                *o = ((x - max) * self.scale).exp();
                sum += *o;
            }
            o[..seen].iter_mut().for_each(|o| *o /= sum);
        });
        Ok((CpuStorage::F32(out), layout.shape().clone()))
    }

    fn bwd(&self, _x: &Tensor, y: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(y.apply_op2_no_bwd(&grad.contiguous()?, &SoftmaxBackward { scale: self.scale })?))
    }
}

/// `dx = scale · y ⊙ (dy − Σ y⊙dy)` per row.
struct SoftmaxBackward {
    scale: f32,
}

impl CustomOp2 for SoftmaxBackward {
    fn name(&self) -> &'static str {
        "softmax-backward"
    }

    fn cpu_fwd(&self, ys: &CpuStorage, yl: &Layout, gs: &CpuStorage, gl: &Layout) -> Result<(CpuStorage, Shape)> {
        let width = yl.dims().last().copied().unwrap_or(1);
        let out = map_row_pairs(f32s(ys, yl)?, f32s(gs, gl)?, width, |_, y, dy, dx| {
            let dot: f32 = y.iter().zip(dy).map(|(y, g)| y * g).sum();
            dx.iter_mut().zip(y.iter().zip(dy)).for_each(|(dx, (y, g))| *dx = self.scale * y * (g - dot));
        });
        Ok((CpuStorage::F32(out), yl.shape().clone()))
    }
}

// ---------------------------------------------------------------------------------------------
// Cross-entropy of selected rows

/// `−log softmax(logits)[target]` per row of `logits` `[N, V]`: `[N]`. The backward is
/// `(softmax − onehot)·dce`, formed without keeping a log-softmax of the whole matrix.
pub fn cross_entropy(logits: &Tensor, targets: &[u32]) -> Result<Tensor> {
    if fused(logits) {
        return logits.contiguous()?.apply_op1(CrossEntropy { targets: targets.to_vec() });
    }
    cross_entropy_composite(logits, targets)
}

fn cross_entropy_composite(logits: &Tensor, targets: &[u32]) -> Result<Tensor> {
    let targets = Tensor::from_slice(targets, targets.len(), logits.device())?.unsqueeze(1)?;
    let log_probs = logits.broadcast_sub(&logits.log_sum_exp(1)?.unsqueeze(1)?)?;
    log_probs.gather(&targets, 1)?.squeeze(1)?.neg()
}

struct CrossEntropy {
    targets: Vec<u32>,
}

fn log_sum_exp(x: &[f32]) -> f32 {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    max + x.iter().map(|v| (v - max).exp()).sum::<f32>().ln()
}

impl CustomOp1 for CrossEntropy {
    fn name(&self) -> &'static str {
        "cross-entropy"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let (n, v) = layout.shape().dims2()?;
        let logits = f32s(storage, layout)?;
        if self.targets.len() != n || self.targets.iter().any(|&t| t as usize >= v) {
            bail!("cross-entropy: {} targets for {n} rows of {v} classes", self.targets.len());
        }
        let ce = (0..n)
            .into_par_iter()
            .map(|i| {
                let row = &logits[i * v..(i + 1) * v];
                log_sum_exp(row) - row[self.targets[i] as usize]
            })
            .collect();
        Ok((CpuStorage::F32(ce), Shape::from(n)))
    }

    fn bwd(&self, logits: &Tensor, _ce: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        let backward = CrossEntropyBackward { targets: self.targets.clone() };
        Ok(Some(logits.apply_op2_no_bwd(&grad.contiguous()?, &backward)?))
    }
}

struct CrossEntropyBackward {
    targets: Vec<u32>,
}

impl CustomOp2 for CrossEntropyBackward {
    fn name(&self) -> &'static str {
        "cross-entropy-backward"
    }

    fn cpu_fwd(&self, ls: &CpuStorage, ll: &Layout, gs: &CpuStorage, gl: &Layout) -> Result<(CpuStorage, Shape)> {
        let (_, v) = ll.shape().dims2()?;
        let grad = f32s(gs, gl)?;
        let out = map_rows(f32s(ls, ll)?, v, |i, row, o| {
            let lse = log_sum_exp(row);
            o.iter_mut().zip(row).for_each(|(o, x)| *o = (x - lse).exp() * grad[i]);
            o[self.targets[i] as usize] -= grad[i];
        });
        Ok((CpuStorage::F32(out), ll.shape().clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    fn random(shape: &[usize], seed: u64) -> Tensor {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let n: usize = shape.iter().product();
        Tensor::from_vec((0..n).map(|_| rng.random_range(-2.0f32..2.0)).collect::<Vec<_>>(), shape, &Device::Cpu)
            .unwrap()
    }

    fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
        (a - b).unwrap().abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar().unwrap()
    }

    /// The value and input gradient of `op(x)·probe` summed, for a fused and a composite op.
    fn value_and_grad(x: &Tensor, probe: &Tensor, op: impl Fn(&Tensor) -> Tensor) -> (Tensor, Tensor) {
        let var = Var::from_tensor(x).unwrap();
        let y = op(var.as_tensor());
        let grads = (&y * probe).unwrap().sum_all().unwrap().backward().unwrap();
        (y, grads.get(var.as_tensor()).unwrap().clone())
    }

    fn assert_same(name: &str, fused: (Tensor, Tensor), composite: (Tensor, Tensor)) {
        let (value, grad) = (max_diff(&fused.0, &composite.0), max_diff(&fused.1, &composite.1));
        assert!(value < 1e-5 && grad < 1e-5, "{name}: value off by {value}, gradient by {grad}");
    }

    #[test]
    fn frozen_matmul_matches_matmul_and_passes_only_the_input_gradient() {
        let (x, w, probe) = (random(&[2, 3, 8], 1), random(&[8, 5], 2), random(&[2, 3, 5], 3));
        let fused = value_and_grad(&x, &probe, |x| frozen_matmul(x, &w).unwrap());
        let composite = value_and_grad(&x, &probe, |x| x.broadcast_matmul(&w).unwrap());
        assert_same("frozen matmul", fused, composite);
        let wt = random(&[5, 8], 4);
        let fused = value_and_grad(&x, &probe, |x| frozen_matmul(x, &wt.t().unwrap()).unwrap());
        let composite = value_and_grad(&x, &probe, |x| x.broadcast_matmul(&wt.t().unwrap()).unwrap());
        assert_same("frozen matmul by a transposed view", fused, composite);
    }

    #[test]
    fn fused_hadamard_mlp_matches_the_dense_walsh_matrix_composite() {
        let matrix = super::super::mlp::walsh_matrix(16, &Device::Cpu).unwrap();
        let (x, probe) = (random(&[2, 3, 12], 5), random(&[2, 3, 12], 6));
        let diagonals = [random(&[16], 14), random(&[16], 15), random(&[16], 16)];
        let diagonals = [&diagonals[0], &diagonals[1], &diagonals[2]];
        let fused = value_and_grad(&x, &probe, |x| hadamard_mlp(x, diagonals, None).unwrap());
        let composite = value_and_grad(&x, &probe, |x| hadamard_mlp_composite(x, diagonals, &matrix).unwrap());
        assert_same("hadamard mlp", fused, composite);
    }

    /// Values and the gradients of both inputs of a two-input op, against a probe.
    fn value_and_grads2(
        a: &Tensor,
        b: &Tensor,
        probe: &Tensor,
        op: impl Fn(&Tensor, &Tensor) -> Tensor,
    ) -> [Tensor; 3] {
        let (va, vb) = (Var::from_tensor(a).unwrap(), Var::from_tensor(b).unwrap());
        let y = op(va.as_tensor(), vb.as_tensor());
        let grads = (&y * probe).unwrap().sum_all().unwrap().backward().unwrap();
        [y, grads.get(va.as_tensor()).unwrap().clone(), grads.get(vb.as_tensor()).unwrap().clone()]
    }

    #[test]
    fn fused_lane_ops_match_the_composite_ops() {
        let lanes = random(&[2, 3, 4, 8], 20);
        let h = random(&[2, 3, 4], 21);
        let m = random(&[2, 3, 4, 4], 22);
        let u = random(&[2, 3, 8], 23);
        let cases: [(
            &str,
            Tensor,
            Tensor,
            Tensor,
            fn(&Tensor, &Tensor) -> Result<Tensor>,
            fn(&Tensor, &Tensor) -> Tensor,
        ); 3] = [
            ("read", lanes.clone(), h.clone(), random(&[2, 3, 8], 24), lane_read, |x, h| {
                x.broadcast_mul(&h.unsqueeze(3).unwrap()).unwrap().sum(2).unwrap()
            }),
            ("spread", h.clone(), u.clone(), random(&[2, 3, 4, 8], 25), lane_spread, |h, u| {
                h.unsqueeze(3).unwrap().broadcast_mul(&u.unsqueeze(2).unwrap()).unwrap()
            }),
            ("mix", m.clone(), lanes.clone(), random(&[2, 3, 4, 8], 26), lane_mix, |m, x| m.matmul(x).unwrap()),
        ];
        for (name, a, b, probe, fused, composite) in cases {
            let got = value_and_grads2(&a, &b, &probe, |a, b| fused(a, b).unwrap());
            let want = value_and_grads2(&a, &b, &probe, composite);
            for (part, (g, w)) in ["value", "grad a", "grad b"].iter().zip(got.iter().zip(&want)) {
                assert!(max_diff(g, w) < 1e-5, "lane {name}: {part} off by {}", max_diff(g, w));
            }
        }
    }

    #[test]
    fn fused_norm_rope_sigmoid_softmax_and_cross_entropy_match_the_composite_ops() {
        let (x, probe, gain) = (random(&[2, 4, 12], 7), random(&[2, 4, 12], 8), random(&[12], 9));
        for g in [None, Some(&gain)] {
            let fused = value_and_grad(&x, &probe, |x| rms_norm(x, g).unwrap());
            let composite = value_and_grad(&x, &probe, |x| rms_norm_composite(x, g).unwrap());
            assert_same("rms norm", fused, composite);
        }

        let (scores, probe) = (random(&[2, 3, 5, 5], 10), random(&[2, 3, 5, 5], 11));
        let causal = super::super::attention::causal_bias(5, &Device::Cpu).unwrap();
        let fused = value_and_grad(&scores, &probe, |s| causal_softmax(s, 0.7, &causal).unwrap());
        let composite = value_and_grad(&scores, &probe, |s| causal_softmax_composite(s, 0.7, &causal).unwrap());
        assert_same("causal softmax", fused, composite);

        let (x, probe) = (random(&[2, 3, 5, 8], 27), random(&[2, 3, 5, 8], 28));
        let (cos, sin) = (random(&[5, 4], 29), random(&[5, 4], 30));
        let tables = Arc::new(RopeTables {
            cos: cos.flatten_all().unwrap().to_vec1().unwrap(),
            sin: sin.flatten_all().unwrap().to_vec1().unwrap(),
        });
        let fused = value_and_grad(&x, &probe, |x| rope(x, &cos, &sin, Some(&tables)).unwrap());
        let composite = value_and_grad(&x, &probe, |x| rope_composite(x, &cos, &sin).unwrap());
        assert_same("rope", fused, composite);

        let (x, probe) = (random(&[3, 7], 17), random(&[3, 7], 18));
        let x = (x * 30.0).unwrap();
        let fused = value_and_grad(&x, &probe, |x| sigmoid(x).unwrap());
        let composite = value_and_grad(&x, &probe, |x| sigmoid_composite(x).unwrap());
        assert_same("sigmoid", fused, composite);

        let (logits, probe, targets) = (random(&[4, 9], 12), random(&[4], 13), [0u32, 8, 3, 3]);
        let fused = value_and_grad(&logits, &probe, |l| cross_entropy(l, &targets).unwrap());
        let composite = value_and_grad(&logits, &probe, |l| cross_entropy_composite(l, &targets).unwrap());
        assert_same("cross-entropy", fused, composite);
    }
}
