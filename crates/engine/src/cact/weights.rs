//! A `.cact` read back into the network's parameters: every tensor dequantized and laid out under
//! its checkpoint path again, so `needle run` and `needle eval` can try exactly what ships.
//!
//! The inverse of the writer's layout: CQ kernels are `[out, in]` and go back to `[in, out]`, the
//! per-layer tensors are stacked on a leading layer axis again, the mHC phi rows are regrouped per
//! lane, and the engram tables regain their `[tables, slots, sub_dim]` shape. The confidence head
//! a file carries is read back the same way ([`CactFile::confidence_head`]).

use std::collections::BTreeMap;

use candle_core::{Device, Tensor};

use super::layout::{
    engram_name, layer_name, HeadSource, LayerStore, ENGRAM_TENSORS, FINAL_NORM, MHC_FP16_TENSORS, MHC_PHI_TENSORS,
};
use crate::cact::reader::CactFile;
use crate::confidence::head::{ConfidenceHead, KEY};
use crate::config::ModelConfig;
use crate::model::{ModelError, Params};

/// Why a `.cact`'s weights could not be read back.
#[derive(Debug, thiserror::Error)]
pub enum WeightsError {
    #[error("the .cact has no tensor `{0}`; it is not a complete export (rebuild it with `needle build`)")]
    Missing(String),
    #[error("tensor `{name}`: {problem}")]
    Tensor { name: String, problem: String },
    #[error(transparent)]
    Model(#[from] ModelError),
}

impl CactFile {
    /// The model config the header describes (the fields a forward pass reads).
    pub fn model_config(&self) -> ModelConfig {
        super::geometry::model_config(&self.header)
    }

    /// Every weight the network reads, dequantized to f32 under its checkpoint path, on `device`.
    pub fn params(&self, device: &Device) -> Result<Params, WeightsError> {
        let by_name: BTreeMap<&str, usize> =
            self.records.iter().enumerate().map(|(i, r)| (r.name.as_str(), i)).collect();
        let tensor = |name: &str| -> Result<Tensor, WeightsError> {
            let &index = by_name.get(name).ok_or_else(|| WeightsError::Missing(name.into()))?;
            self.decoded(index, device)
        };
        let h = &self.header;
        let mut params = BTreeMap::new();
        params.insert("embedding/embedding".to_string(), tensor("embedding")?);

        for spec in super::format::layout(h.generation).layer_tensors(h.qkv_conv_taps > 0) {
            let layers = (0..h.num_layers as usize)
                .map(|layer| {
                    let name = layer_name(layer, spec.name);
                    let t = tensor(&name)?;
                    match spec.store {
                        LayerStore::Kernel => shaped(&name, t.t()),
                        LayerStore::Scalar => shaped(&name, t.squeeze(0)),
                        LayerStore::Fp16 | LayerStore::ConvTap => Ok(t),
                    }
                })
                .collect::<Result<Vec<_>, _>>()?;
            let stacked = shaped(spec.name, Tensor::stack(&layers, 0))?;
            params.insert(format!("stack/layers/block/{}", spec.path), stacked);
        }
        for name in MHC_FP16_TENSORS {
            params.insert(format!("stack/{name}"), tensor(name)?);
        }
        let layers = h.num_layers as usize;
        for name in MHC_PHI_TENSORS {
            // Rows `[L·k, nC]` back to `[L, nC, k]` (k is lanes, or lanes² for `phi_res`).
            let rows = tensor(name)?;
            let (count, n_c) = shaped(name, rows.dims2())?;
            let phi = rows.reshape((layers, count / layers.max(1), n_c)).and_then(|t| t.transpose(1, 2));
            params.insert(format!("stack/{name}"), shaped(name, phi)?);
        }
        // The header's table geometry, checked against each site's tensor before it shapes one: the
        // product of three u32s can overflow, and a reshape would trust it.
        let table_shape = [h.num_engram_tables, h.engram_slots, h.engram_sub_dim].map(|d| d as usize);
        let table_elements = table_shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d));
        for site in 0..h.engram_layers.len() {
            let [tables_name, key_name, value_name, taps_name] = ENGRAM_TENSORS.map(|t| engram_name(site, t));
            let tables = tensor(&tables_name)?;
            if table_elements != Some(tables.elem_count()) {
                return Err(WeightsError::Tensor {
                    name: tables_name,
                    problem: format!(
                        "holds {} values, but the header's num_engram_tables × engram_slots × engram_sub_dim is {table_shape:?}",
                        tables.elem_count()
                    ),
                });
            }
            let tables = tables.reshape(table_shape.as_slice());
            let prefix = format!("engrams_{site}");
            params.insert(format!("{prefix}/embedding"), shaped(&tables_name, tables)?);
            params.insert(format!("{prefix}/key_proj/kernel"), shaped(&key_name, tensor(&key_name)?.t())?);
            params.insert(format!("{prefix}/value_proj/kernel"), shaped(&value_name, tensor(&value_name)?.t())?);
            params.insert(format!("{prefix}/taps"), tensor(&taps_name)?);
        }
        params.insert("stack/final_norm/scale".to_string(), tensor(FINAL_NORM)?);
        let contiguous = params
            .into_iter()
            .map(|(path, t)| Ok((path.clone(), shaped(&path, t.contiguous())?)))
            .collect::<Result<BTreeMap<_, _>, WeightsError>>()?;
        Ok(Params::from_tensors(contiguous, device)?)
    }

    /// The confidence head the file carries (the manifest lists code 2), or `None` when it carries
    /// none (3.2.8's build of an adapter drops it): its tensors as the file stores them — Needle 3's
    /// probes, queries and projection decoded from their CQ-4 codes, the rest (and all of a Needle 2
    /// head) widened from FP16 — laid out under the checkpoint's names again and checked against
    /// the model the header describes. The file records no calibration and no reading: a head built
    /// by `needle build` from a trained one has its calibration folded into the projection.
    pub fn confidence_head(&self, device: &Device) -> Result<Option<ConfidenceHead>, WeightsError> {
        let layout = super::format::layout(self.header.generation);
        let Some(head) = layout.heads.iter().find(|head| head.key == KEY) else { return Ok(None) };
        let found = |name: &str| self.records.iter().position(|r| r.name == format!("{KEY}.{name}"));
        if found("probes").is_none() {
            return Ok(None);
        }
        let config = self.model_config();
        let mut params = BTreeMap::new();
        for spec in layout.tensors_of(Some(head)) {
            let name = format!("{KEY}.{}", spec.name);
            let index = found(spec.name).ok_or_else(|| WeightsError::Missing(name.clone()))?;
            let stored = self.decoded(index, device)?;
            let (path, tensor) = match spec.source {
                HeadSource::Kernel => ("proj/kernel".to_string(), shaped(&name, stored.t())?),
                HeadSource::Bias => ("proj/bias".to_string(), stored),
                // Needle 3's probes are stored as CQ rows `[R·k, d]`, one depth row's k after another.
                HeadSource::Param if spec.cq && spec.name == "probes" => {
                    let (rows, d, depths) = (stored.dim(0).unwrap_or(0), config.d_model, config.num_layers + 1);
                    if rows % depths != 0 {
                        return Err(WeightsError::Tensor {
                            name,
                            problem: format!(
                                "{rows} probe rows are not a whole number of probes for {depths} depth rows"
                            ),
                        });
                    }
                    (spec.name.to_string(), shaped(&name, stored.reshape((depths, rows / depths, d)))?)
                }
                HeadSource::Param | HeadSource::Calibration(_) => (spec.name.to_string(), stored),
            };
            params.insert(format!("{KEY}/{path}"), shaped(&name, tensor.contiguous())?);
        }
        let params = Params::from_tensors(params, device)?;
        ConfidenceHead::load(&config, &params).map_err(|e| WeightsError::Tensor {
            name: KEY.into(),
            problem: format!(
                "it does not fit the model the header describes ({e}); rebuild the file with `needle build`"
            ),
        })
    }

    /// Tensor `index` as f32 in its stored shape (CQ decoded), on `device`.
    fn decoded(&self, index: usize, device: &Device) -> Result<Tensor, WeightsError> {
        let name = &self.records[index].name;
        let problem = |problem: String| WeightsError::Tensor { name: name.clone(), problem };
        let values = self
            .values(index)
            .ok_or_else(|| problem("it holds raw bytes".into()))?
            .map_err(|e| problem(e.to_string()))?;
        let shape: Vec<usize> = self.records[index].shape.iter().map(|&d| d as usize).collect();
        Tensor::from_vec(values, shape, device).map_err(|e| problem(e.to_string()))
    }
}

/// A reshaping's error as the tensor's.
fn shaped<T>(name: &str, result: candle_core::Result<T>) -> Result<T, WeightsError> {
    result.map_err(|e| WeightsError::Tensor { name: name.into(), problem: e.to_string() })
}

#[cfg(test)]
mod tests {

    use candle_core::{DType, Device, Tensor};

    use super::*;
    use crate::checkpoint::Checkpoint;
    use crate::model::Network;

    use crate::fixtures::fixture;

    /// The tiny golden `.cact` with header fields (u32 index → value) replaced.
    fn golden_with_header(fields: &[(usize, u32)]) -> CactFile {
        let mut bytes = std::fs::read(fixture("golden/tiny_f32/w4.cact")).unwrap();
        for &(field, value) in fields {
            bytes[4 * field..4 * field + 4].copy_from_slice(&value.to_le_bytes());
        }
        CactFile::parse(bytes).expect("these header fields are not read while parsing")
    }

    #[test]
    fn a_header_whose_table_geometry_overflows_is_an_error_not_a_reshape() {
        // engram_slots, engram_sub_dim, num_engram_tables: their product overflows 64 bits.
        let cact = golden_with_header(&[(14, u32::MAX), (15, u32::MAX), (16, u32::MAX)]);
        let err = cact.params(&Device::Cpu).unwrap_err();
        assert!(matches!(&err, WeightsError::Tensor { name, .. } if name == "engram0.tables"), "{err}");
        assert!(err.to_string().contains("num_engram_tables × engram_slots × engram_sub_dim"), "{err}");
    }

    #[test]
    fn a_header_with_absurd_heads_is_refused_by_the_network() {
        // num_heads and head_dim: their product is far past any width, and must not wrap to a small one.
        let cact = golden_with_header(&[(7, u32::MAX), (10, u32::MAX)]);
        let config = cact.model_config();
        assert_eq!(config.attn_dim as u64, u64::from(u32::MAX) * u64::from(u32::MAX));
        let params = cact.params(&Device::Cpu).unwrap();
        assert!(Network::load(&config, &params).is_err());
    }

    #[test]
    fn a_built_cact_runs_as_the_network_it_was_built_from() {
        for (checkpoint, built) in [
            ("models/tiny_f32.pkl", "golden/tiny_f32/w4.cact"),
            ("models/pretrained.pkl", "golden/pretrained/w4.cact"),
            ("models/needle3_heads.safetensors", "golden/needle3_heads/base.cact"),
        ] {
            let checkpoint = Checkpoint::load(&fixture(checkpoint)).unwrap();
            let base = Network::from_checkpoint(&checkpoint, &Device::Cpu).unwrap();
            let cact = CactFile::open(&fixture(built)).unwrap();
            let config = cact.model_config();
            assert_eq!(config.generation, checkpoint.config.generation, "{built}");
            let shipped = Network::load(&config, &cact.params(&Device::Cpu).unwrap()).unwrap();
            // Longer than the Needle 3 fixture's window of 16, so its windowed layers drop keys.
            let ids: Vec<u32> = (0..40).map(|i| [2, 40, 41, 7, 300, 12, 99, 5][i % 8] + i as u32).collect();
            let ids = Tensor::new(ids.as_slice(), &Device::Cpu).unwrap().unsqueeze(0).unwrap();
            let (want, got) = (base.forward(&ids).unwrap(), shipped.forward(&ids).unwrap());
            // 4-bit weights move the logits a little, never the shape or the scale.
            let diff = (&want - &got).unwrap().abs().unwrap().mean_all().unwrap().to_scalar::<f32>().unwrap();
            let size = want.abs().unwrap().mean_all().unwrap().to_scalar::<f32>().unwrap();
            assert_eq!(want.dims(), got.dims());
            assert!(diff < 0.25 * size, "{built}: mean |Δ| {diff} against mean |logit| {size}");
            assert_eq!(got.dtype(), DType::F32);
        }
    }

    #[test]
    fn a_needle3_header_gives_back_the_config_it_was_written_from() {
        let checkpoint = Checkpoint::load(&fixture("models/needle3_heads.safetensors")).unwrap();
        let cact = CactFile::open(&fixture("golden/needle3_heads/base.cact")).unwrap();
        let (want, got) = (&checkpoint.config, cact.model_config());
        assert_eq!(
            (got.qk_head_dim(), got.v_head_dim(), got.sliding_window, &got.global_layers, got.qkv_conv_taps),
            (want.qk_head_dim(), want.v_head_dim(), want.sliding_window, &want.global_layers, want.qkv_conv_taps)
        );
        assert_eq!((got.out_vocab, got.engram_seed_heads, &got.engram_layers), (508, 2, &want.engram_layers));
    }
}
