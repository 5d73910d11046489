//! A Needle 2 checkpoint's tensors in the order its `.cact` stores them, and the checks that the
//! checkpoint holds what the export reads.

use rayon::prelude::*;

use super::{
    engram_name, layer_name, FINAL_NORM, HEADS_MANIFEST, HEAD_CODES, LAYER_TENSORS, MHC_FP16_TENSORS, MHC_PHI_TENSORS,
};
use crate::cact::bits::BitsChoice;
use crate::cact::geometry::Geometry;
use crate::cact::writer::{bad_shape, cq_tensor, fp16_tensor, BuildError, BuildProblem, Param, Tensor};
use crate::checkpoint::Checkpoint;
use crate::model::Network;

/// The stacked per-layer block every layer's tensors are sliced from.
const BLOCK: &str = "stack/layers/block";

fn layer_tensors(ckpt: &Checkpoint, bits: &BitsChoice, out: &mut Vec<Tensor>) -> Result<(), BuildProblem> {
    let stacked: Vec<Param> =
        LAYER_TENSORS.iter().map(|t| Param::load(ckpt, &format!("{BLOCK}/{}", t.path))).collect::<Result<_, _>>()?;
    // Layers are independent: slicing and transposing them in parallel keeps both cores busy
    // between the row-parallel quantizations.
    let layers: Vec<Vec<Tensor>> = (0..ckpt.config.num_layers)
        .into_par_iter()
        .map(|layer| one_layer(layer, &stacked, bits))
        .collect::<Result<_, _>>()?;
    out.extend(layers.into_iter().flatten());
    Ok(())
}

fn one_layer(layer: usize, stacked: &[Param], bits: &BitsChoice) -> Result<Vec<Tensor>, BuildProblem> {
    LAYER_TENSORS
        .iter()
        .zip(stacked)
        .map(|(spec, param)| {
            let name = layer_name(layer, spec.name);
            let slice = param.layer(layer)?;
            if spec.kernel {
                cq_tensor(name, &slice.transposed()?, bits)
            } else if spec.name == "attn_gate" {
                // A per-layer scalar, stored as a 1-element vector.
                Ok(fp16_tensor(name, &slice.reshaped(vec![1])?))
            } else {
                Ok(fp16_tensor(name, &slice))
            }
        })
        .collect()
}

fn mhc_tensors(ckpt: &Checkpoint, bits: &BitsChoice, out: &mut Vec<Tensor>) -> Result<(), BuildProblem> {
    for name in MHC_FP16_TENSORS {
        out.push(fp16_tensor(name, &Param::load(ckpt, &format!("stack/{name}"))?));
    }
    for name in MHC_PHI_TENSORS {
        out.push(cq_tensor(name, &phi_rows(&Param::load(ckpt, &format!("stack/{name}"))?)?, bits)?);
    }
    Ok(())
}

fn engram_tensors(
    ckpt: &Checkpoint,
    geo: &Geometry,
    bits: &BitsChoice,
    out: &mut Vec<Tensor>,
) -> Result<(), BuildProblem> {
    for site in 0..geo.sites.len() {
        let prefix = format!("engrams_{site}");
        let tables = Param::load(ckpt, &format!("{prefix}/embedding"))?
            .reshaped(vec![geo.engram.tables * ckpt.config.engram_slots, geo.engram.sub_dim])?;
        let key = Param::load(ckpt, &format!("{prefix}/key_proj/kernel"))?.transposed()?;
        let value = Param::load(ckpt, &format!("{prefix}/value_proj/kernel"))?.transposed()?;
        out.push(cq_tensor(engram_name(site, "tables"), &tables, bits)?);
        out.push(cq_tensor(engram_name(site, "key_proj"), &key, bits)?);
        out.push(cq_tensor(engram_name(site, "value_proj"), &value, bits)?);
        out.push(fp16_tensor(engram_name(site, "taps"), &Param::load(ckpt, &format!("{prefix}/taps"))?));
    }
    Ok(())
}

/// The optional probe heads: a manifest of head codes, then `probes, proj (transposed), bias` per head,
/// all FP16. A head without a bias gets zeros, as the reference writes.
fn head_tensors(ckpt: &Checkpoint, out: &mut Vec<Tensor>) -> Result<(), BuildProblem> {
    let present: Vec<(&str, u16)> = HEAD_CODES.iter().copied().filter(|(key, _)| has_head(ckpt, key)).collect();
    if present.is_empty() {
        return Ok(());
    }
    let codes: Vec<f32> = present.iter().map(|&(_, c)| f32::from(c)).collect();
    let manifest = Param { path: HEADS_MANIFEST.into(), shape: vec![codes.len()], values: codes };
    out.push(fp16_tensor(HEADS_MANIFEST, &manifest));
    for (key, _) in present {
        let probes = Param::load(ckpt, &format!("{key}/probes"))?;
        let kernel = Param::load(ckpt, &format!("{key}/proj/kernel"))?.transposed()?;
        let bias_path = format!("{key}/proj/bias");
        let bias = if ckpt.params.contains_key(&bias_path) {
            Param::load(ckpt, &bias_path)?
        } else {
            Param { path: bias_path, shape: vec![kernel.shape[0]], values: vec![0.0; kernel.shape[0]] }
        };
        out.push(fp16_tensor(format!("{key}.probes"), &probes));
        out.push(fp16_tensor(format!("{key}.proj"), &kernel));
        out.push(fp16_tensor(format!("{key}.bias"), &bias));
    }
    Ok(())
}

/// Whether the checkpoint has the probe head `key` (any parameter under `key/`).
fn has_head(ckpt: &Checkpoint, key: &str) -> bool {
    let dir = format!("{key}/");
    ckpt.params.keys().any(|p| p.starts_with(&dir))
}

/// Checks every parameter the export reads against the shape a network of the config reads
/// ([`Network::param_shapes`], the one parameter tree), and each probe head against the layout the
/// format stores (`probes [P, d_model]`, `proj/kernel [P·d_model, out]`, `proj/bias [out]`), before
/// anything is sliced, transposed, merged or allocated from a parameter's dimensions. After it, the
/// header (written from the config) and the tensors (from the params) agree, and every size the
/// export derives is backed by data in the file.
pub fn check_params(ckpt: &Checkpoint) -> Result<(), BuildError> {
    check_shapes(ckpt).map_err(|problem| BuildError { checkpoint: ckpt.source.clone(), problem })
}

pub(in crate::cact) fn check_shapes(ckpt: &Checkpoint) -> Result<(), BuildProblem> {
    Geometry::of(&ckpt.config)?;
    let tree = Network::param_shapes(&ckpt.config).map_err(|e| BuildProblem::Model(Box::new(e)))?;
    for (path, expected) in tree {
        expect_shape(ckpt, &path, &expected, || format!("{expected:?}"))?;
    }
    let d = ckpt.config.d_model;
    for (key, _) in HEAD_CODES.iter().filter(|(key, _)| has_head(ckpt, key)) {
        // The probe count P and the output width are the head's own; d_model is the config's.
        let probes_path = format!("{key}/probes");
        let probes = param_shape(ckpt, &probes_path)?;
        let rows = match *probes {
            [p, width] if p > 0 && width == d => p.checked_mul(d),
            _ => None,
        }
        .ok_or_else(|| bad_shape(&probes_path, probes, format!("[P ≥ 1, {d}] (d_model {d})")))?;
        let kernel_path = format!("{key}/proj/kernel");
        let kernel = param_shape(ckpt, &kernel_path)?;
        let out = match *kernel {
            [r, out] if r == rows && out > 0 => out,
            _ => return Err(bad_shape(&kernel_path, kernel, format!("[{rows}, out ≥ 1] (P × d_model rows)"))),
        };
        let bias_path = format!("{key}/proj/bias");
        if ckpt.params.contains_key(&bias_path) {
            expect_shape(ckpt, &bias_path, &[out], || format!("[{out}] (proj/kernel's output width)"))?;
        }
    }
    Ok(())
}

fn param_shape<'c>(ckpt: &'c Checkpoint, path: &str) -> Result<&'c [usize], BuildProblem> {
    ckpt.params.get(path).map(|a| a.shape.as_slice()).ok_or_else(|| BuildProblem::MissingParam { path: path.into() })
}

fn expect_shape(
    ckpt: &Checkpoint,
    path: &str,
    expected: &[usize],
    describe: impl FnOnce() -> String,
) -> Result<(), BuildProblem> {
    let found = param_shape(ckpt, path)?;
    if found == expected {
        Ok(())
    } else {
        Err(bad_shape(path, found, describe()))
    }
}

/// Every tensor of the export in canonical order (the tokenizer is appended by the caller).
pub(in crate::cact) fn tensors(
    ckpt: &Checkpoint,
    geo: &Geometry,
    bits: &BitsChoice,
) -> Result<Vec<Tensor>, BuildProblem> {
    let embedding = Param::load(ckpt, "embedding/embedding")?;
    let mut out = vec![cq_tensor("embedding", &embedding, bits)?];
    layer_tensors(ckpt, bits, &mut out)?;
    mhc_tensors(ckpt, bits, &mut out)?;
    engram_tensors(ckpt, geo, bits, &mut out)?;
    out.push(fp16_tensor(FINAL_NORM, &Param::load(ckpt, "stack/final_norm/scale")?));
    head_tensors(ckpt, &mut out)?;
    Ok(out)
}

/// The mHC phi stack `[L, nC, lanes]` as `[L*lanes, nC]`: `phi.transpose(0, 2, 1).reshape(...)`.
fn phi_rows(phi: &Param) -> Result<Param, BuildProblem> {
    let &[layers, n_c, lanes] = phi.shape.as_slice() else {
        return Err(phi.bad_shape("a 3-D [layers, nC, lanes] array"));
    };
    let mut values = Vec::with_capacity(phi.values.len());
    for l in 0..layers {
        let block = &phi.values[l * n_c * lanes..(l + 1) * n_c * lanes];
        for lane in 0..lanes {
            values.extend((0..n_c).map(|c| block[c * lanes + lane]));
        }
    }
    Ok(Param { path: phi.path.clone(), shape: vec![layers * lanes, n_c], values })
}
