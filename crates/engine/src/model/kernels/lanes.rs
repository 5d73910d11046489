//! The residual lanes of the mHC stack: reading a mixture, mixing them, spreading an update.

use candle_core::{bail, CpuStorage, CustomOp2, Layout, Result, Shape, Tensor, D};

use super::rows::{f32s, fill_rows, fused};
use crate::simd::dot;

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

struct LaneRead;

impl CustomOp2 for LaneRead {
    fn name(&self) -> &'static str {
        "lane-read"
    }

    fn cpu_fwd(&self, xs: &CpuStorage, xl: &Layout, hs: &CpuStorage, hl: &Layout) -> Result<(CpuStorage, Shape)> {
        let (positions, n, d) = lane_dims(xl)?;
        let (x, h) = (f32s(xs, xl)?, f32s(hs, hl)?);
        let out = fill_rows(positions, d, |p, o| {
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
        let out = fill_rows(positions, n * d, |p, o| {
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
        let out = fill_rows(positions, n, |p, o| {
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
        let out = fill_rows(positions, n * d, |p, o| {
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
        let out = fill_rows(positions, n * n, |p, o| {
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

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;
    use candle_core::Var;

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
        // Each case: its name, the two inputs, the gradient's probe, the fused op, the composite one.
        type Case = (
            &'static str,
            Tensor,
            Tensor,
            Tensor,
            fn(&Tensor, &Tensor) -> Result<Tensor>,
            fn(&Tensor, &Tensor) -> Tensor,
        );
        let cases: [Case; 3] = [
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
}
