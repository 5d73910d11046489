//! The weights source: every parameter as an f32 tensor under its checkpoint path.
//!
//! Paths are the checkpoint's flattened `/`-joined names. Parameters under `stack/layers/` carry the
//! layer index as their leading axis (the reference scans one block over them); [`ParamPath::layer`]
//! selects one layer's slice so that a layer's code can ask for the per-layer shape.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};

use candle_core::{Device, Tensor};
use rayon::prelude::*;

use super::linear::Linear;
use super::qat::{cq_along, Qat};
use super::{ModelError, Result};
use crate::checkpoint::Checkpoint;
use crate::config::{ModelConfig, Recipe, ACT_BITS};

/// Named f32 tensors on one device, with a record of which ones the network consumed.
#[derive(Debug)]
pub struct Params {
    tensors: RefCell<BTreeMap<String, Tensor>>,
    used: RefCell<BTreeSet<String>>,
    device: Device,
    missing: Missing,
    /// Set by [`Params::for_qat`]: the network built on these weights fake-quantizes as it computes.
    qat: Option<Qat>,
    /// Under QAT, the kernels still held as stored: each goes through CQ when it is first read
    /// ([`ParamPath::get`]); a projection ([`ParamPath::linear`]) keeps its kernel as stored, for an
    /// adapter to merge into, and quantizes it only if it is multiplied by without one.
    deferred: RefCell<BTreeSet<String>>,
}

/// What a parameter the network asks for but the source lacks becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Missing {
    /// An error naming it: a checkpoint must hold every parameter.
    Refused,
    /// Noise of std 0.02 ([`weight_noise`]): a random-init network of any geometry, for benchmarks and tests.
    Random,
    /// Zeros that take no memory (one value broadcast to the shape): enough to build a network
    /// and so learn its parameter tree ([`Params::shapes`]).
    Placeholder,
}

impl Params {
    /// Takes ownership of already-built tensors (converted to f32 on `device`).
    pub fn from_tensors(tensors: BTreeMap<String, Tensor>, device: &Device) -> Result<Self> {
        let tensors = tensors
            .into_iter()
            .map(|(path, t)| Ok((path, t.to_dtype(candle_core::DType::F32)?.to_device(device)?)))
            .collect::<Result<_>>()?;
        Ok(Self::with(tensors, device, Missing::Refused))
    }

    /// Every checkpoint param widened to f32 (float16 storage included) on `device`.
    pub fn from_checkpoint(checkpoint: &Checkpoint, device: &Device) -> Result<Self> {
        let tensors = checkpoint
            .params
            .iter()
            .map(|(path, array)| Ok((path.clone(), Tensor::from_vec(array.to_f32(), array.shape.as_slice(), device)?)))
            .collect::<Result<_>>()?;
        Ok(Self::with(tensors, device, Missing::Refused))
    }

    /// A source that invents any parameter asked for (noise of std 0.02, [`weight_noise`]).
    pub fn random_init(device: &Device) -> Self {
        Self::with(BTreeMap::new(), device, Missing::Random)
    }

    /// A source that hands out a memoryless placeholder for any parameter asked for: a network
    /// built on it records its parameter tree without holding any weights.
    pub fn placeholders() -> Self {
        Self::with(BTreeMap::new(), &Device::Cpu, Missing::Placeholder)
    }

    fn with(tensors: BTreeMap<String, Tensor>, device: &Device, missing: Missing) -> Self {
        Self {
            tensors: RefCell::new(tensors),
            used: RefCell::new(BTreeSet::new()),
            device: device.clone(),
            missing,
            qat: None,
            deferred: RefCell::default(),
        }
    }

    /// The weights a `.cact` ships (the reference's `cq_ste_params`): every kernel, embedding and
    /// mHC projection through CQ at [`QAT_WEIGHT_BITS`] and back along the axis it reduces. What
    /// the end of a Needle 3 run scores.
    pub fn through_cq(self) -> Result<Self> {
        self.quantized(false)
    }

    /// The weights as quantization-aware training computes with them: [`Params::through_cq`], the
    /// kernels' round trips put off until each is read (a projection's kernel stays as stored for
    /// an adapter to merge into, and goes through CQ only if it is multiplied by without one), and
    /// the network built on them fake-quantizes its activations, queries, keys and values.
    pub fn for_qat(self, cfg: &ModelConfig) -> Result<Self> {
        self.quantized(true)?.fake_quantizing(cfg)
    }

    /// The weights as they are, and the network built on them fake-quantizes its activations,
    /// queries, keys and values as `cfg` deploys them: with weights already through CQ (a
    /// `.cact`'s, or [`Params::through_cq`]'s), the forward the `.cact` runtime computes.
    pub fn fake_quantizing(mut self, cfg: &ModelConfig) -> Result<Self> {
        if !matches!(cfg.kv_bits, 0 | 8) || !ACT_BITS.contains(&cfg.act_bits) {
            let what = format!(
                "fake quantization at act_bits {} and kv_bits {} (8 and 8, or kv_bits 0)",
                cfg.act_bits, cfg.kv_bits
            );
            return Err(ModelError::Unsupported { what });
        }
        self.qat = Some(Qat { act_bits: cfg.act_bits, kv_bits: cfg.kv_bits });
        Ok(self)
    }

    /// The weights a model of `cfg` trains on: quantization-aware ([`Params::for_qat`]) where its
    /// generation's package trains so (Needle 3) or `qat` asks (`--qat`), else as stored (Needle 2's
    /// 2.0.8 recipe).
    pub fn for_training(self, cfg: &ModelConfig, qat: bool) -> Result<Self> {
        if qat || Recipe::of(cfg.generation).quantization_aware {
            self.for_qat(cfg)
        } else {
            Ok(self)
        }
    }

    fn quantized(mut self, defer_kernels: bool) -> Result<Self> {
        let tensors = std::mem::take(self.tensors.get_mut());
        let deferred = self.deferred.get_mut();
        if defer_kernels {
            let kernels = tensors.iter().filter(|(path, t)| path.ends_with("/kernel") && t.rank() >= 2);
            deferred.extend(kernels.map(|(path, _)| path.clone()));
        }
        // Tensors side by side: the copies around each round trip run on one core.
        let quantized = tensors
            .into_par_iter()
            .map(|(path, tensor)| match quantized_axis(&path, tensor.rank()) {
                Some(second_last) if !deferred.contains(&path) => Ok((cq_along(&tensor, second_last)?, path)),
                _ => Ok((tensor, path)),
            })
            .collect::<Result<Vec<_>>>()?;
        self.tensors.get_mut().extend(quantized.into_iter().map(|(tensor, path)| (path, tensor)));
        Ok(self)
    }

    /// Whether the network built on these weights fake-quantizes ([`Params::for_qat`]).
    pub fn qat(&self) -> Option<Qat> {
        self.qat
    }

    /// Every parameter path with its (stacked) shape, in path order.
    pub fn shapes(&self) -> Vec<(String, Vec<usize>)> {
        self.tensors.borrow().iter().map(|(path, t)| (path.clone(), t.dims().to_vec())).collect()
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The tensor stored at `path`, if any (shape unchecked); under QAT a kernel that nothing has
    /// read yet is the kernel as stored (see [`Params::for_qat`]).
    pub fn get(&self, path: &str) -> Option<Tensor> {
        self.tensors.borrow().get(path).cloned()
    }

    /// Puts `tensors` in place of the parameters at their paths (an adapter merged into the
    /// weights, say: [`crate::lora::merge_into_params`]).
    pub fn replace(&mut self, tensors: impl IntoIterator<Item = (String, Tensor)>) {
        let deferred = self.deferred.get_mut();
        self.tensors.get_mut().extend(tensors.into_iter().inspect(|(path, _)| {
            deferred.remove(path);
        }));
    }

    /// Whether any parameter lives under `prefix/`.
    pub fn has_prefix(&self, prefix: &str) -> bool {
        let dir = format!("{prefix}/");
        self.tensors.borrow().keys().any(|k| k.starts_with(&dir))
    }

    /// Number of scalars over every parameter.
    pub fn parameter_count(&self) -> usize {
        self.tensors.borrow().values().map(Tensor::elem_count).sum()
    }

    /// All parameter paths, in order.
    pub fn paths(&self) -> Vec<String> {
        self.tensors.borrow().keys().cloned().collect()
    }

    /// The root of the parameter tree.
    pub fn root(&self) -> ParamPath<'_> {
        ParamPath { params: self, prefix: String::new(), layer: None }
    }

    /// Fails on the first parameter no part of the network asked for: such a param means the
    /// config describes a different (smaller) network than the one that was saved.
    pub fn ensure_all_used(&self) -> Result<()> {
        let used = self.used.borrow();
        let tensors = self.tensors.borrow();
        let mut unused = tensors.keys().filter(|k| !used.contains(*k));
        match unused.next() {
            None => Ok(()),
            Some(first) => Err(ModelError::UnexpectedParam { path: first.clone(), count: 1 + unused.count() }),
        }
    }

    /// Stores an invented parameter, so that every layer of a stack reads the same one.
    fn invent(&self, path: &str, tensor: Tensor) -> Tensor {
        self.tensors.borrow_mut().insert(path.to_string(), tensor.clone());
        tensor
    }

    /// The full tensor at `path`, checked against `expected`; a deferred kernel goes through CQ
    /// now unless `as_stored`.
    fn fetch(&self, path: &str, expected: &[usize], as_stored: bool) -> Result<Tensor> {
        self.used.borrow_mut().insert(path.to_string());
        let found = self.tensors.borrow().get(path).cloned();
        let tensor = match (found, self.missing) {
            (Some(t), _) if !as_stored && self.deferred.borrow_mut().remove(path) => {
                let quantized = cq_along(&t, true)?;
                self.tensors.borrow_mut().insert(path.to_string(), quantized.clone());
                quantized
            }
            (Some(t), _) => t,
            (None, Missing::Refused) => {
                return Err(ModelError::MissingParam { path: path.into(), expected: expected.into() })
            }
            (None, Missing::Random) => {
                let seed = self.tensors.borrow().len() as u64;
                let noise =
                    Tensor::from_vec(weight_noise(expected.iter().product(), 0.02, seed), expected, &self.device)?;
                self.invent(path, noise)
            }
            (None, Missing::Placeholder) => {
                let zero = Tensor::zeros((), candle_core::DType::F32, &self.device)?;
                self.invent(path, zero.broadcast_as(expected)?)
            }
        };
        if tensor.dims() != expected {
            return Err(ModelError::ParamShape {
                path: path.into(),
                expected: expected.into(),
                actual: tensor.dims().into(),
            });
        }
        Ok(tensor)
    }
}

/// `len` draws of noise of mean 0 and std `std`, the same for the same `seed`: each the sum of
/// the four 16-bit quarters of one 64-bit draw, scaled (Irwin–Hall, nearly normal: a random model
/// needs weights of the right scale, not a normal's far tails). Filled in parallel, each block of
/// values from its own generator: a random-init Needle 3 is 127 M values, which a ziggurat normal
/// drew in 0.39–0.41 s of a benchmark's first step on a 2-core Zen 4 and this in 0.20–0.22 s.
fn weight_noise(len: usize, std: f32, seed: u64) -> Vec<f32> {
    use rand::{Rng, SeedableRng};
    const BLOCK: usize = 1 << 16;
    // Four uniforms on [0, 1) sum to mean 2 and variance 4/12.
    let scale = std * 3f32.sqrt() / 65536.0;
    let mut values = vec![0f32; len];
    values.par_chunks_mut(BLOCK).enumerate().for_each(|(block, values)| {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ block as u64);
        for v in values.iter_mut() {
            let draw: u64 = rng.random();
            let quarters: u64 = (0..4).map(|q| (draw >> (16 * q)) & 0xFFFF).sum();
            // Each quarter read at its 1/65536 step's midpoint, so the mean is 0.
            *v = (quarters as f32 + 2.0 - 2.0 * 65536.0) * scale;
        }
    });
    values
}

/// Whether QAT quantizes the weight at `path` (of `rank` axes), and if so whether along its
/// second-last axis (kernels and mHC projections reduce it) rather than its last (embeddings).
fn quantized_axis(path: &str, rank: usize) -> Option<bool> {
    let key = path.rsplit('/').next().unwrap_or(path);
    let second_last = key == "kernel" || key.starts_with("mhc_phi");
    (rank >= 2 && (second_last || key == "embedding")).then_some(second_last)
}

/// A position in the parameter tree, optionally restricted to one layer of a stacked group.
#[derive(Debug, Clone)]
pub struct ParamPath<'a> {
    params: &'a Params,
    prefix: String,
    /// `(index, count)`: params here have a leading axis of `count` layers, and `index` is taken.
    layer: Option<(usize, usize)>,
}

impl<'a> ParamPath<'a> {
    /// The child node `name` (`pp("self_attn").pp("q_proj")` is `…/self_attn/q_proj`).
    pub fn pp(&self, name: &str) -> Self {
        let prefix = if self.prefix.is_empty() { name.to_string() } else { format!("{}/{name}", self.prefix) };
        Self { params: self.params, prefix, layer: self.layer }
    }

    /// The same node seen as layer `index` of `count` stacked layers.
    pub fn layer(&self, index: usize, count: usize) -> Self {
        Self { params: self.params, prefix: self.prefix.clone(), layer: Some((index, count)) }
    }

    pub fn device(&self) -> &Device {
        self.params.device()
    }

    /// Whether the network fake-quantizes ([`Params::for_qat`]).
    pub fn qat(&self) -> Option<Qat> {
        self.params.qat
    }

    /// The kernel `name` here (per-layer shape `[in, out]`) as a frozen projection that a
    /// [`LowRank`](super::LowRank) update can adapt.
    pub fn linear(&self, in_dim: usize, out_dim: usize, name: &str) -> Result<Linear> {
        let (path, layer) = (self.pp(name).prefix, self.layer.map_or(0, |(index, _)| index));
        if self.params.deferred.borrow().contains(&path) {
            return Ok(Linear::through_cq(self.read(&[in_dim, out_dim], name, true)?, path, layer));
        }
        Ok(Linear::new(self.get(&[in_dim, out_dim], name)?, path, layer))
    }

    /// The stored shape of the parameter `name` here, if there is one (it is not marked as read:
    /// a [`ParamPath::get`] of the shape it should have does that).
    pub fn dims(&self, name: &str) -> Option<Vec<usize>> {
        self.params.tensors.borrow().get(&self.pp(name).prefix).map(|t| t.dims().to_vec())
    }

    /// The parameter `name` here with the (per-layer) shape `shape`.
    pub fn get(&self, shape: &[usize], name: &str) -> Result<Tensor> {
        self.read(shape, name, false)
    }

    /// [`ParamPath::get`], a deferred kernel as stored when `as_stored`.
    fn read(&self, shape: &[usize], name: &str, as_stored: bool) -> Result<Tensor> {
        let path = self.pp(name).prefix;
        match self.layer {
            None => self.params.fetch(&path, shape, as_stored),
            Some((index, count)) => {
                let stacked: Vec<usize> = std::iter::once(count).chain(shape.iter().copied()).collect();
                Ok(self.params.fetch(&path, &stacked, as_stored)?.narrow(0, index, 1)?.squeeze(0)?)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(entries: &[(&str, &[usize])]) -> Params {
        let map = entries
            .iter()
            .map(|(k, shape)| (k.to_string(), Tensor::zeros(*shape, candle_core::DType::F32, &Device::Cpu).unwrap()))
            .collect();
        Params::from_tensors(map, &Device::Cpu).unwrap()
    }

    #[test]
    fn stacked_layer_slices_the_leading_axis_and_checks_the_full_shape() {
        let p = params(&[("stack/layers/block/attn_gate", &[3]), ("stack/layers/block/w", &[3, 2, 5])]);
        let block = p.root().pp("stack").pp("layers").pp("block");
        assert_eq!(block.layer(1, 3).get(&[2, 5], "w").unwrap().dims(), &[2, 5]);
        assert_eq!(block.layer(2, 3).get(&[], "attn_gate").unwrap().dims(), &[] as &[usize]);
        let err = block.layer(0, 4).get(&[2, 5], "w").unwrap_err();
        assert!(
            matches!(&err, ModelError::ParamShape { path, expected, actual }
            if path == "stack/layers/block/w" && expected == &[4, 2, 5] && actual == &[3, 2, 5]),
            "{err}"
        );
    }

    /// Under QAT a projection keeps its kernel as stored, and goes through CQ only when something
    /// multiplies by it as it is, to the values the eager round trip gives; a kernel read plainly
    /// goes through CQ when it is read.
    #[test]
    fn qat_kernels_go_through_cq_when_first_read() {
        let (q, other) = ("stack/layers/attn/q_proj/kernel", "engram/key_proj/kernel");
        let values = |n: usize, seed: u32| -> Vec<f32> {
            (0..n as u32)
                .map(|i| (i.wrapping_mul(2_654_435_761).wrapping_add(seed) % 997) as f32 / 500.0 - 1.0)
                .collect()
        };
        let build = || {
            let map = [
                (q.to_string(), Tensor::from_vec(values(2 * 256 * 3, 1), (2, 256, 3), &Device::Cpu).unwrap()),
                (other.to_string(), Tensor::from_vec(values(128 * 5, 2), (128, 5), &Device::Cpu).unwrap()),
            ];
            Params::from_tensors(map.into_iter().collect(), &Device::Cpu).unwrap()
        };
        let eager = build().through_cq().unwrap();
        let qat = build().for_qat(&ModelConfig::default()).unwrap();
        let raw = build().get(q).unwrap();
        assert_eq!(qat.get(q).unwrap().to_vec3::<f32>().unwrap(), raw.to_vec3::<f32>().unwrap());

        let linear = qat.root().pp("stack").pp("layers").pp("attn").pp("q_proj").layer(1, 2).linear(256, 3, "kernel");
        let linear = linear.unwrap();
        let layer = |t: &Tensor| t.narrow(0, 1, 1).unwrap().squeeze(0).unwrap().to_vec2::<f32>().unwrap();
        assert_eq!(linear.stored().unwrap().to_vec2::<f32>().unwrap(), layer(&raw));
        assert_eq!(linear.weight().unwrap().to_vec2::<f32>().unwrap(), layer(&eager.get(q).unwrap()));
        assert_ne!(layer(&eager.get(q).unwrap()), layer(&raw), "the round trip changes the values");
        // Building the projection left the stack as stored; a plain read quantizes.
        assert_eq!(qat.get(q).unwrap().to_vec3::<f32>().unwrap(), raw.to_vec3::<f32>().unwrap());
        let read = qat.root().pp("engram").pp("key_proj").get(&[128, 5], "kernel").unwrap();
        assert_eq!(read.to_vec2::<f32>().unwrap(), eager.get(other).unwrap().to_vec2::<f32>().unwrap());
        assert_eq!(qat.get(other).unwrap().to_vec2::<f32>().unwrap(), read.to_vec2::<f32>().unwrap());
    }

    #[test]
    fn missing_and_unused_params_are_named() {
        let p = params(&[("a/kernel", &[2, 2]), ("b/extra", &[1])]);
        let err = p.root().pp("a").get(&[2, 2], "bias").unwrap_err();
        assert!(err.to_string().contains("`a/bias` is missing"), "{err}");
        p.root().pp("a").get(&[2, 2], "kernel").unwrap();
        let err = p.ensure_all_used().unwrap_err();
        assert!(matches!(&err, ModelError::UnexpectedParam { path, count: 1 } if path == "b/extra"), "{err}");
    }

    #[test]
    fn weight_noise_has_the_scale_asked_for_and_repeats_with_its_seed() {
        let noise = weight_noise(1 << 18, 0.02, 7);
        let n = noise.len() as f64;
        let mean = noise.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
        let std = (noise.iter().map(|&v| (f64::from(v) - mean).powi(2)).sum::<f64>() / n).sqrt();
        assert!(mean.abs() < 1e-4 && (std - 0.02).abs() < 2e-4, "mean {mean}, std {std}");
        assert_eq!(noise, weight_noise(1 << 18, 0.02, 7));
        assert_ne!(noise, weight_noise(1 << 18, 0.02, 8));
    }
}
