//! Grouped-query self-attention with per-head q/k norms, half-split RoPE, a causal mask and a
//! sigmoid output gate (the reference's `MultiHeadAttention`). Needle 3 adds q/k heads narrower
//! than the v heads, a causal convolution on Q, K and V, and windowed layers that see only the
//! last `sliding_window` positions.

use std::ops::Range;
use std::sync::Arc;

use candle_core::{Device, Tensor};

use super::conv::CausalTaps;
use crate::config::ModelConfig;
use crate::model::kernels::{causal_bias_after, causal_softmax, fake_quant_rows, rope, sigmoid, RopeTables};
use crate::model::linear::LowRank;
use crate::model::packing::Packing;
use crate::model::qat::Qat;
use crate::model::weights::attention::Attention;
use crate::model::{ModelError, Result};

/// Rotary position tables for one sequence length: `cos`/`sin` of shape `[T, head_dim/2]`.
#[derive(Debug, Clone)]
pub struct Rope {
    cos: Tensor,
    sin: Tensor,
    /// The same tables on the host, for the fused CPU kernel.
    tables: Option<Arc<RopeTables>>,
}

impl Rope {
    /// The tables of positions `0..seq_len` (see [`RopeTables::new`]).
    pub fn new(head_dim: usize, seq_len: usize, theta: f64, device: &Device) -> Result<Self> {
        let tables = RopeTables::new(head_dim, seq_len, theta);
        let shape = (seq_len, head_dim / 2);
        Ok(Self {
            cos: Tensor::from_slice(&tables.cos, shape, device)?,
            sin: Tensor::from_slice(&tables.sin, shape, device)?,
            tables: device.is_cpu().then(|| Arc::new(tables)),
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

/// The masks of one block of queries: every key before them, and (Needle 3's windowed layers)
/// only the last `sliding_window` of them.
#[derive(Debug, Clone)]
struct Masks {
    whole: Tensor,
    windowed: Tensor,
}

impl Masks {
    fn new(past: usize, new: usize, window: Option<usize>, device: &Device) -> Result<Self> {
        let whole = causal_bias_after(past, new, None, device)?;
        let windowed = match window {
            Some(_) => causal_bias_after(past, new, window, device)?,
            None => whole.clone(),
        };
        Ok(Self { whole, windowed })
    }

    fn get(&self, windowed: bool) -> &Tensor {
        if windowed {
            &self.windowed
        } else {
            &self.whole
        }
    }
}

/// One layer's keys and values of the positions decoded so far, `[B, kv_heads, T, head_dim]`
/// (normed and rotated, before the query groups share them), and, for Needle 3's Q/K/V
/// convolution, the last projections before it (`[taps − 1, width]` each at most).
#[derive(Debug, Clone, Default)]
pub struct LayerKv {
    keys: Option<(Tensor, Tensor)>,
    recent: Option<[Tensor; 3]>,
}

impl LayerKv {
    /// The new positions' projections convolved with `taps` after the cached recent ones, which
    /// they then join (the last `taps − 1` kept).
    fn convolve(&mut self, new: [Tensor; 3], taps: &[Tensor; 3]) -> Result<[Tensor; 3]> {
        let (fresh, count) = (new[0].dim(0)?, taps[0].dim(0)?);
        let rows = match self.recent.take() {
            Some(recent) => {
                let [q, k, v] = [0, 1, 2].map(|i| Tensor::cat(&[&recent[i], &new[i]], 0));
                [q?, k?, v?]
            }
            None => new,
        };
        // The recent positions reach back `taps − 1`, or to the row's start, so zeros before them
        // are what the whole row's convolution would read.
        let len = rows[0].dim(0)?;
        let conv = CausalTaps::row(len, count, 1, rows[0].device())?;
        let keep = len.min(count.saturating_sub(1));
        let [q, k, v] =
            [0, 1, 2].map(|i| -> Result<Tensor> { Ok(conv.apply(&rows[i], &taps[i])?.narrow(0, len - fresh, fresh)?) });
        let [recent_q, recent_k, recent_v] = [0, 1, 2].map(|i| rows[i].narrow(0, len - keep, keep));
        self.recent = Some([recent_q?, recent_k?, recent_v?]);
        Ok([q?, k?, v?])
    }

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

/// How attention reads a packed batch ([`Packing`]) on a device: groups of rows that attend to one
/// shared prefix, each group's tails gathered into a padded `[rows, len]` block.
#[derive(Debug, Clone)]
pub struct AttentionLayout {
    groups: Vec<Group>,
    /// Needle 3's Q/K/V convolution over the packed rows (`None` when decoding).
    conv: Option<CausalTaps>,
}

/// One prefix and the tails continuing it, or (with no prefix) the rows that share nothing.
#[derive(Debug, Clone)]
struct Group {
    /// The prefix's packed range, its rotary tables and its masks.
    prefix: Option<(Range<usize>, Rope, Masks)>,
    tails: Tails,
    rows: usize,
    /// The longest tail: every tail is padded to it (padding sits after its row's real tokens).
    len: usize,
    /// The tails' rotary tables and masks (their positions follow the prefix's).
    rope: Rope,
    masks: Masks,
}

/// Where a group's tails are among the packed tokens.
#[derive(Debug, Clone)]
enum Tails {
    /// Tails of one length, one after another from this packed index: already the block.
    Block(usize),
    /// `gather`: the packed index of each padded position (`[rows · len]`); `scatter`: the padded
    /// position of each real tail token, in packed order.
    Padded { gather: Tensor, scatter: Tensor },
}

impl AttentionLayout {
    /// The layout of `packing` for a model of `cfg` on `device`, with rotary tables from `rope`
    /// (positions from 0).
    pub fn new(packing: &Packing, cfg: &ModelConfig, rope: &Rope, device: &Device) -> Result<Self> {
        let window = cfg.window();
        let mut groups = Vec::new();
        let mut unshared = Vec::new();
        for family in packing.families() {
            match family.prefix() {
                Some(prefix) => groups.push(Group::new(packing, Some(prefix), &family.tails, rope, window, device)?),
                None => unshared.push(family.head),
            }
        }
        if !unshared.is_empty() {
            groups.push(Group::new(packing, None, &unshared, rope, window, device)?);
        }
        let conv = match cfg.qkv_conv_taps {
            0 => None,
            taps => Some(CausalTaps::new(packing, taps, 1, device)?),
        };
        Ok(Self { groups, conv })
    }

    /// One row of `len` new tokens after `past` cached positions (a decoding step).
    pub fn decode(past: usize, len: usize, cfg: &ModelConfig, rope: &Rope, device: &Device) -> Result<Self> {
        let window = cfg.window();
        let group = Group {
            prefix: None,
            tails: Tails::Block(0),
            rows: 1,
            len,
            rope: rope.at(past, len)?,
            masks: Masks::new(past, len, window, device)?,
        };
        Ok(Self { groups: vec![group], conv: None })
    }
}

impl Group {
    fn new(
        packing: &Packing,
        prefix: Option<usize>,
        members: &[usize],
        rope: &Rope,
        window: Option<usize>,
        device: &Device,
    ) -> Result<Self> {
        let segments = packing.segments();
        let len = members.iter().map(|&t| segments[t].len).max().unwrap_or(0);
        let start = segments[members[0]].start;
        let consecutive = members.iter().enumerate().all(|(r, &t)| segments[t].start == start + r * len);
        let tails = if consecutive && members.iter().all(|&t| segments[t].len == len) {
            Tails::Block(start)
        } else {
            let mut gather = Vec::with_capacity(members.len() * len);
            let mut scatter = Vec::new();
            for (r, &t) in members.iter().enumerate() {
                let tail = segments[t];
                // Padding repeats the row's last token: its outputs are never read.
                gather.extend((0..len).map(|j| (tail.start + j.min(tail.len - 1)) as u32));
                scatter.extend((0..tail.len).map(|j| (r * len + j) as u32));
            }
            let (gathered, scattered) = (gather.len(), scatter.len());
            Tails::Padded {
                gather: Tensor::from_vec(gather, gathered, device)?,
                scatter: Tensor::from_vec(scatter, scattered, device)?,
            }
        };
        let first = prefix.map_or(0, |p| segments[p].len);
        let prefix = match prefix.map(|p| segments[p]) {
            Some(seg) => Some((seg.range(), rope.at(0, seg.len)?, Masks::new(0, seg.len, window, device)?)),
            None => None,
        };
        Ok(Self {
            prefix,
            tails,
            rows: members.len(),
            len,
            rope: rope.at(first, len)?,
            masks: Masks::new(first, len, window, device)?,
        })
    }
}

impl Attention {
    /// The projections of `x`, through the Q/K/V convolution where the model has one.
    /// A decoding step's `cache` holds the projections before it that the convolution reads.
    fn projections(
        &self,
        x: &Tensor,
        layout: &AttentionLayout,
        low_rank: Option<&LowRank>,
        cache: Option<&mut LayerKv>,
    ) -> Result<[Tensor; 3]> {
        let projected = [&self.q_proj, &self.k_proj, &self.v_proj].map(|p| p.forward(x, low_rank));
        let [q, k, v] = projected;
        let (q, k, v) = (q?, k?, v?);
        match (&self.conv_taps, &layout.conv, cache) {
            (None, _, _) => Ok([q, k, v]),
            (Some([qt, kt, vt]), Some(conv), _) => Ok([conv.apply(&q, qt)?, conv.apply(&k, kt)?, conv.apply(&v, vt)?]),
            (Some(taps), None, Some(cache)) => cache.convolve([q, k, v], taps),
            (Some(_), None, None) => {
                Err(ModelError::Unsupported { what: "a decoding step with Q/K/V convolution taps but no cache".into() })
            }
        }
    }

    /// Packed tokens `x` `[N, d_model]` → `[N, d_model]`, attending as `layout` says; `low_rank`
    /// adapts the projections. With a `cache` (one decoding row), the new keys join the cached
    /// ones and the queries attend to all of them.
    pub fn forward(
        &self,
        x: &Tensor,
        layout: &AttentionLayout,
        low_rank: Option<&LowRank>,
        mut cache: Option<&mut LayerKv>,
    ) -> Result<Tensor> {
        let n = x.dim(0)?;
        let x = &self.activations(x)?;
        let [q, k, v] = self.projections(x, layout, low_rank, cache.as_deref_mut())?;
        let q = self.q_norm.forward(&q.reshape((n, self.num_heads, self.qk_dim))?)?;
        let k = self.k_norm.forward(&k.reshape((n, self.num_kv_heads, self.qk_dim))?)?;
        let v = v.reshape((n, self.num_kv_heads, self.v_dim))?;
        let mut outs = Vec::with_capacity(2 * layout.groups.len());
        for group in &layout.groups {
            let shared = match &group.prefix {
                Some((range, rope, masks)) => {
                    let heads = |t: &Tensor| self.rows_to_heads(&t.narrow(0, range.start, range.len())?.unsqueeze(0)?);
                    let (q, k, v) = (rope.apply(&heads(&q)?)?, rope.apply(&heads(&k)?)?, heads(&v)?);
                    let (q, k, v) = (self.query(&q)?, self.keys(&k)?, self.keys(&v)?);
                    outs.push(self.heads_to_rows(&self.attend(&q, &k, &v, masks.get(self.window.is_some()))?)?);
                    Some((k, v))
                }
                None => None,
            };
            let heads = |t: &Tensor| -> Result<Tensor> {
                let block = match &group.tails {
                    Tails::Block(start) => t.narrow(0, *start, group.rows * group.len)?,
                    Tails::Padded { gather, .. } => t.index_select(gather, 0)?,
                };
                self.rows_to_heads(&block.reshape((group.rows, group.len, t.dim(1)?, t.dim(2)?))?)
            };
            let q = self.query(&group.rope.apply(&heads(&q)?)?)?;
            let (mut k, mut v) = (self.keys(&group.rope.apply(&heads(&k)?)?)?, self.keys(&heads(&v)?)?);
            if let Some((shared_k, shared_v)) = shared {
                let wide = |t: &Tensor| t.broadcast_as((group.rows, t.dim(1)?, t.dim(2)?, t.dim(3)?));
                k = Tensor::cat(&[&wide(&shared_k)?, &k], 2)?;
                v = Tensor::cat(&[&wide(&shared_v)?, &v], 2)?;
            }
            if let Some(cache) = cache.as_deref_mut() {
                (k, v) = cache.extend(k, v)?;
            }
            let out = self.heads_to_rows(&self.attend(&q, &k, &v, group.masks.get(self.window.is_some()))?)?;
            outs.push(match &group.tails {
                Tails::Block(_) => out,
                Tails::Padded { scatter, .. } => out.index_select(scatter, 0)?,
            });
        }
        let out = if outs.len() == 1 { outs.remove(0) } else { Tensor::cat(&outs, 0)? };
        let gated = (out * sigmoid(&self.gate_proj.forward(x, low_rank)?)?)?;
        self.out_proj.forward(&self.activations(&gated)?, low_rank)
    }

    /// Under QAT, a projection's input as the runtime's int8 activations see it.
    fn activations(&self, x: &Tensor) -> Result<Tensor> {
        match self.qat {
            Some(qat) => Ok(fake_quant_rows(x, qat.act_bits)?),
            None => Ok(x.clone()),
        }
    }

    /// Under QAT, the queries as the runtime's int8 attention kernel reads them, per head and position.
    fn query(&self, q: &Tensor) -> Result<Tensor> {
        match self.qat {
            Some(_) => Ok(fake_quant_rows(q, 8)?),
            None => Ok(q.clone()),
        }
    }

    /// Under QAT with an int8 KV cache, keys or values as the cache holds them.
    fn keys(&self, k: &Tensor) -> Result<Tensor> {
        match self.qat {
            Some(Qat { kv_bits: 8, .. }) => Ok(fake_quant_rows(k, 8)?),
            _ => Ok(k.clone()),
        }
    }

    /// `softmax(q·kᵀ/√qk + mask)·v` over `[B, H, T, qk]` queries, `[B, kv_heads, S, qk]` keys and
    /// `[B, kv_heads, S, v]` values.
    fn attend(&self, q: &Tensor, k: &Tensor, v: &Tensor, mask: &Tensor) -> Result<Tensor> {
        let (k, v) = (self.share_kv(k)?, self.share_kv(v)?);
        let weights = causal_softmax(&q.matmul(&k.t()?)?, 1.0 / (self.qk_dim as f64).sqrt(), mask, self.window)?;
        Ok(weights.matmul(&v)?)
    }

    /// `[B, T, n, head_dim]` → `[B, n, T, head_dim]`.
    fn rows_to_heads(&self, x: &Tensor) -> Result<Tensor> {
        Ok(x.transpose(1, 2)?.contiguous()?)
    }

    /// `[B, H, T, head_dim]` → `[B·T, H·head_dim]`.
    fn heads_to_rows(&self, x: &Tensor) -> Result<Tensor> {
        let (b, h, t, hd) = x.dims4()?;
        Ok(x.transpose(1, 2)?.reshape((b * t, h * hd))?)
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
