//! Grouped-query self-attention with per-head q/k norms, half-split RoPE, a causal mask and a
//! sigmoid output gate (the reference's `MultiHeadAttention`).

use candle_core::{Device, Tensor};

use std::sync::Arc;

use super::kernels::{causal_softmax, rope, sigmoid, RopeTables};
use super::linear::{Linear, LowRank};
use super::norm::ZcRmsNorm;
use super::params::ParamPath;
use super::Result;
use crate::config::ModelConfig;

/// Rotary position tables for one sequence length: `cos`/`sin` of shape `[T, head_dim/2]`.
#[derive(Debug, Clone)]
pub struct Rope {
    cos: Tensor,
    sin: Tensor,
    /// The same tables on the host, for the fused CPU kernel.
    tables: Option<Arc<RopeTables>>,
}

impl Rope {
    /// Angles `t · θ^(-2i/head_dim)`, computed as the reference does: frequencies and products in
    /// f32 (the f32 rounding of a large angle changes its cosine visibly), trig of that f32 angle.
    pub fn new(head_dim: usize, seq_len: usize, theta: f64, device: &Device) -> Result<Self> {
        let freqs: Vec<f32> =
            (0..head_dim).step_by(2).map(|i| (1.0 / theta.powf(i as f64 / head_dim as f64)) as f32).collect();
        let angles: Vec<f32> = (0..seq_len).flat_map(|t| freqs.iter().map(move |f| t as f32 * f)).collect();
        let table = |trig: fn(f64) -> f64| -> Vec<f32> { angles.iter().map(|&a| trig(a as f64) as f32).collect() };
        let (cos, sin) = (table(f64::cos), table(f64::sin));
        let shape = (seq_len, freqs.len());
        Ok(Self {
            cos: Tensor::from_slice(&cos, shape, device)?,
            sin: Tensor::from_slice(&sin, shape, device)?,
            tables: device.is_cpu().then(|| Arc::new(RopeTables { cos, sin })),
        })
    }

    /// The tables of positions `start..start + len` (a decoding step's new tokens).
    pub fn at(&self, start: usize, len: usize) -> Result<Self> {
        let (cos, sin) = (self.cos.narrow(0, start, len)?, self.sin.narrow(0, start, len)?);
        let tables = match self.tables {
            Some(_) => {
                Some(Arc::new(RopeTables { cos: cos.flatten_all()?.to_vec1()?, sin: sin.flatten_all()?.to_vec1()? }))
            }
            None => None,
        };
        Ok(Self { cos, sin, tables })
    }

    /// Rotates `x` `[B, H, T, head_dim]`: halves `(x1, x2)` become `(x1·cos − x2·sin, x2·cos + x1·sin)`.
    pub fn apply(&self, x: &Tensor) -> Result<Tensor> {
        Ok(rope(x, &self.cos, &self.sin, self.tables.as_ref())?)
    }
}

/// `[1, 1, T, T]` additive mask: 0 on and below the diagonal, −∞ above. Every row keeps its
/// diagonal, so no softmax row is all −∞.
pub fn causal_bias(seq_len: usize, device: &Device) -> Result<Tensor> {
    causal_bias_after(0, seq_len, device)
}

/// `[1, 1, T, past + T]`: the mask of `T` new queries after `past` cached positions; query q sees
/// keys up to `past + q`.
pub fn causal_bias_after(past: usize, new: usize, device: &Device) -> Result<Tensor> {
    let keys = past + new;
    let bias: Vec<f32> =
        (0..new).flat_map(|q| (0..keys).map(move |k| if k <= past + q { 0.0 } else { f32::NEG_INFINITY })).collect();
    Ok(Tensor::from_vec(bias, (1, 1, new, keys), device)?)
}

/// One layer's keys and values of the positions decoded so far, `[B, kv_heads, T, head_dim]`
/// (normed and rotated, before the query groups share them).
#[derive(Debug, Clone, Default)]
pub struct LayerKv {
    keys: Option<(Tensor, Tensor)>,
}

impl LayerKv {
    /// Appends the new positions' keys and values and returns all of them.
    fn extend(&mut self, k: Tensor, v: Tensor) -> Result<(Tensor, Tensor)> {
        let all = match self.keys.take() {
            None => (k, v),
            Some((past_k, past_v)) => (Tensor::cat(&[&past_k, &k], 2)?, Tensor::cat(&[&past_v, &v], 2)?),
        };
        self.keys = Some(all.clone());
        Ok(all)
    }
}

/// The reference's `self_attn` module.
#[derive(Debug, Clone)]
pub struct Attention {
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    gate_proj: Linear,
    out_proj: Linear,
    q_norm: ZcRmsNorm,
    k_norm: ZcRmsNorm,
    num_heads: usize,
    num_kv_heads: usize,
    head_dim: usize,
}

impl Attention {
    pub fn new(cfg: &ModelConfig, vb: ParamPath) -> Result<Self> {
        let (d, attn_dim, kv_dim, head_dim) = (cfg.d_model, cfg.resolved_attn_dim(), cfg.kv_dim(), cfg.head_dim());
        Ok(Self {
            q_proj: vb.pp("q_proj").linear(d, attn_dim, "kernel")?,
            k_proj: vb.pp("k_proj").linear(d, kv_dim, "kernel")?,
            v_proj: vb.pp("v_proj").linear(d, kv_dim, "kernel")?,
            gate_proj: vb.pp("gate_proj").linear(d, attn_dim, "kernel")?,
            out_proj: vb.pp("out_proj").linear(attn_dim, d, "kernel")?,
            q_norm: ZcRmsNorm::new(head_dim, vb.pp("q_norm"))?,
            k_norm: ZcRmsNorm::new(head_dim, vb.pp("k_norm"))?,
            num_heads: cfg.num_heads,
            num_kv_heads: cfg.num_kv_heads,
            head_dim,
        })
    }

    /// `x` `[B, T, d_model]` → `[B, T, d_model]`; `low_rank` adapts the projections. With a
    /// `cache`, `x` holds new positions only: their keys join the cache and the queries attend to
    /// all of it (`rope` and `causal` then describe the new positions after the cached ones).
    pub fn forward(
        &self,
        x: &Tensor,
        rope: &Rope,
        causal: &Tensor,
        low_rank: Option<&LowRank>,
        cache: Option<&mut LayerKv>,
    ) -> Result<Tensor> {
        let (b, t, _) = x.dims3()?;
        let q = self.heads(&self.q_proj.forward(x, low_rank)?, self.num_heads)?;
        let k = self.heads(&self.k_proj.forward(x, low_rank)?, self.num_kv_heads)?;
        let v = self.heads(&self.v_proj.forward(x, low_rank)?, self.num_kv_heads)?;
        let q = rope.apply(&self.q_norm.forward(&q)?)?;
        let k = rope.apply(&self.k_norm.forward(&k)?)?;
        let (k, v) = match cache {
            Some(cache) => cache.extend(k, v)?,
            None => (k, v),
        };
        let (k, v) = (self.share_kv(&k)?, self.share_kv(&v)?);

        let weights = causal_softmax(&q.matmul(&k.t()?)?, 1.0 / (self.head_dim as f64).sqrt(), causal)?;
        let out = weights.matmul(&v)?.transpose(1, 2)?.reshape((b, t, self.num_heads * self.head_dim))?;

        let gated = (out * sigmoid(&self.gate_proj.forward(x, low_rank)?)?)?;
        self.out_proj.forward(&gated, low_rank)
    }

    /// `[B, T, n·head_dim]` → `[B, n, T, head_dim]`.
    fn heads(&self, x: &Tensor, n: usize) -> Result<Tensor> {
        let (b, t, _) = x.dims3()?;
        Ok(x.reshape((b, t, n, self.head_dim))?.transpose(1, 2)?.contiguous()?)
    }

    /// Repeats each kv head for its group of query heads (query head h reads kv head h / group).
    fn share_kv(&self, x: &Tensor) -> Result<Tensor> {
        let group = self.num_heads / self.num_kv_heads;
        if group == 1 {
            return Ok(x.clone());
        }
        let (b, kv, t, hd) = x.dims4()?;
        Ok(x.unsqueeze(2)?.broadcast_as((b, kv, group, t, hd))?.reshape((b, kv * group, t, hd))?)
    }
}
