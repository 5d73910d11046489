//! A checkpoint's tensors in the order its generation's `.cact` stores them ([`Layout`]), and the
//! checks that the checkpoint holds what the export reads.

use rayon::prelude::*;

use super::layout::{
    engram_name, layer_name, HeadSource, HeadTensor, LayerStore, Layout, ENGRAM_TENSORS, FINAL_NORM, HADA_PERMS,
    HEADS_MANIFEST, MHC_FP16_TENSORS, MHC_PHI_TENSORS,
};
use crate::cact::bits::BitsChoice;
use crate::cact::encode::{bad_shape, cq_tensor, fp16_tensor, fp32_tensor, BuildError, BuildProblem, Param, Tensor};
use crate::cact::geometry::Geometry;
use crate::checkpoint::Checkpoint;
use crate::model::weights::monarch;
use crate::model::Network;
use crate::quant::HEAD_BITS;

/// The stacked per-layer block every layer's tensors are sliced from.
const BLOCK: &str = "stack/layers/block";

fn layer_tensors(
    ckpt: &Checkpoint,
    layout: &Layout,
    bits: &BitsChoice,
    out: &mut Vec<Tensor>,
) -> Result<(), BuildProblem> {
    let specs: Vec<_> = layout.layer_tensors(ckpt.config.qkv_conv_taps > 0).collect();
    let stacked: Vec<Param> =
        specs.iter().map(|t| Param::load(ckpt, &format!("{BLOCK}/{}", t.path))).collect::<Result<_, _>>()?;
    // Layers are independent: slicing and transposing them in parallel keeps both cores busy
    // between the row-parallel quantizations.
    let layers: Vec<Vec<Tensor>> = (0..ckpt.config.num_layers)
        .into_par_iter()
        .map(|layer| {
            specs
                .iter()
                .zip(&stacked)
                .map(|(spec, param)| {
                    let name = layer_name(layer, spec.name);
                    let slice = param.layer(layer)?;
                    match spec.store {
                        LayerStore::Kernel => cq_tensor(name, &slice.transposed()?, bits),
                        LayerStore::Scalar => Ok(fp16_tensor(name, &slice.reshaped(vec![1])?)),
                        LayerStore::Fp16 | LayerStore::ConvTap => Ok(fp16_tensor(name, &slice)),
                    }
                })
                .collect::<Result<Vec<_>, _>>()
        })
        .collect::<Result<_, _>>()?;
    out.extend(layers.into_iter().flatten());
    Ok(())
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

/// Needle 3's Monarch permutations as the network draws them, FP32.
fn hada_perm_tensors(ckpt: &Checkpoint, geo: &Geometry, out: &mut Vec<Tensor>) {
    for (name, perm) in HADA_PERMS.iter().zip(monarch::permutations(&ckpt.config)) {
        let values = perm.into_iter().map(|i| i as f32).collect();
        out.push(fp32_tensor(*name, &Param { path: (*name).into(), shape: vec![geo.hada_n], values }));
    }
}

fn engram_tensors(
    ckpt: &Checkpoint,
    geo: &Geometry,
    bits: &BitsChoice,
    out: &mut Vec<Tensor>,
) -> Result<(), BuildProblem> {
    for site in 0..ckpt.config.engram_layers.len() {
        let prefix = format!("engrams_{site}");
        let tables = Param::load(ckpt, &format!("{prefix}/embedding"))?
            .reshaped(vec![geo.engram.tables * ckpt.config.engram_slots, geo.engram.sub_dim])?;
        let key = Param::load(ckpt, &format!("{prefix}/key_proj/kernel"))?.transposed()?;
        let value = Param::load(ckpt, &format!("{prefix}/value_proj/kernel"))?.transposed()?;
        out.push(cq_tensor(engram_name(site, ENGRAM_TENSORS[0]), &tables, bits)?);
        out.push(cq_tensor(engram_name(site, ENGRAM_TENSORS[1]), &key, bits)?);
        out.push(cq_tensor(engram_name(site, ENGRAM_TENSORS[2]), &value, bits)?);
        out.push(fp16_tensor(engram_name(site, ENGRAM_TENSORS[3]), &Param::load(ckpt, &format!("{prefix}/taps"))?));
    }
    Ok(())
}

/// The optional probe heads: a manifest of head codes, then each present head's tensors.
fn head_tensors(ckpt: &Checkpoint, layout: &Layout, out: &mut Vec<Tensor>) -> Result<(), BuildProblem> {
    let present: Vec<_> = layout.heads.iter().filter(|head| has_head(ckpt, head.key)).collect();
    if present.is_empty() {
        return Ok(());
    }
    let codes: Vec<f32> = present.iter().map(|head| f32::from(head.code)).collect();
    let manifest = Param { path: HEADS_MANIFEST.into(), shape: vec![codes.len()], values: codes };
    out.push(fp16_tensor(HEADS_MANIFEST, &manifest));
    for head in present {
        for spec in layout.tensors_of(Some(head)) {
            out.push(head_tensor(ckpt, head.key, spec)?);
        }
    }
    Ok(())
}

fn head_tensor(ckpt: &Checkpoint, key: &str, spec: &HeadTensor) -> Result<Tensor, BuildProblem> {
    let path = format!("{key}/{}", spec.name);
    let param = match spec.source {
        HeadSource::Param => Param::load(ckpt, &path)?,
        HeadSource::Kernel => Param::load(ckpt, &format!("{key}/proj/kernel"))?.transposed()?,
        HeadSource::Bias => {
            let bias = format!("{key}/proj/bias");
            if ckpt.params.contains_key(&bias) {
                Param::load(ckpt, &bias)?
            } else {
                // As wide as the projection's output; `check_shapes` made sure it has one.
                let out = param_shape(ckpt, &format!("{key}/proj/kernel"))?.last().copied().unwrap_or(0);
                Param { path: bias, shape: vec![out], values: vec![0.0; out] }
            }
        }
        HeadSource::Calibration(initial) if !ckpt.params.contains_key(&path) => {
            Param { path: path.clone(), shape: vec![initial.len()], values: initial.to_vec() }
        }
        HeadSource::Calibration(_) => Param::load(ckpt, &path)?,
    };
    let name = format!("{key}.{}", spec.name);
    if !spec.cq {
        return Ok(fp16_tensor(name, &param));
    }
    // A matrix's rows along its last axis, whatever the leading axes (3.x's `reshape(-1, last)`).
    let last = param.shape.last().copied().filter(|&n| n > 0).ok_or_else(|| param.bad_shape("a last axis"))?;
    let rows = param.values.len() / last;
    cq_tensor(name, &param.reshaped(vec![rows, last])?, &BitsChoice::Uniform(HEAD_BITS))
}

/// Whether the checkpoint has the probe head `key` (any parameter under `key/`).
fn has_head(ckpt: &Checkpoint, key: &str) -> bool {
    let dir = format!("{key}/");
    ckpt.params.keys().any(|p| p.starts_with(&dir))
}

/// Checks every parameter the export reads against the shape a network of the config reads
/// ([`Network::param_shapes`], the one parameter tree), and each probe head against what the
/// format stores (its rows `d_model` wide, its projection reading as many rows as it pools, a bias
/// as wide as the projection's output), before anything is sliced, transposed, merged or allocated
/// from a parameter's dimensions. After it, the header (written from the config) and the tensors
/// (from the params) agree, and every size the export derives is backed by data in the file.
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
    let layout = super::format::layout(ckpt.config.generation);
    for head in layout.heads.iter().filter(|head| has_head(ckpt, head.key)) {
        let key = head.key;
        // The rows the head pools with are its own count; their width is the config's d_model.
        let pooled_path = format!("{key}/{}", layout.pooled_by);
        let pooled = param_shape(ckpt, &pooled_path)?;
        let rows = match pooled.split_last() {
            Some((&width, lead)) if width == d && lead.iter().all(|&n| n > 0) => {
                lead.iter().try_fold(d, |acc, &n| acc.checked_mul(n))
            }
            _ => None,
        }
        .ok_or_else(|| bad_shape(&pooled_path, pooled, format!("[…, {d}] (rows d_model {d} wide)")))?;
        let kernel_path = format!("{key}/proj/kernel");
        let kernel = param_shape(ckpt, &kernel_path)?;
        let out = match *kernel {
            [r, out] if r == rows && out > 0 => out,
            _ => {
                let expected = format!("[{rows}, out ≥ 1] ({} rows × d_model)", layout.pooled_by);
                return Err(bad_shape(&kernel_path, kernel, expected));
            }
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
    let layout = super::format::layout(ckpt.config.generation);
    let embedding = Param::load(ckpt, "embedding/embedding")?;
    let mut out = vec![cq_tensor("embedding", &embedding, bits)?];
    layer_tensors(ckpt, layout, bits, &mut out)?;
    mhc_tensors(ckpt, bits, &mut out)?;
    if layout.hada_perms {
        hada_perm_tensors(ckpt, geo, &mut out);
    }
    engram_tensors(ckpt, geo, bits, &mut out)?;
    out.push(fp16_tensor(FINAL_NORM, &Param::load(ckpt, "stack/final_norm/scale")?));
    head_tensors(ckpt, layout, &mut out)?;
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
