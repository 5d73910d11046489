//! Adapter files. `.safetensors` holds `path/A` and `path/B` (f32) with the scale, rank, alpha,
//! base and targets as metadata; a Needle 3 adapter is laid out as cactus-needle 3.x writes it
//! (`lora/path/A`, and its metadata — scale, base, rank, seed — as JSON text), so either package
//! reads it. `.pkl` is 2.x's pickle. The extension chooses, for reading and for writing; writes go
//! to a temporary file that is renamed into place, so a crash never leaves half an adapter.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use candle_core::Tensor;
use safetensors::tensor::{Dtype, SafeTensors, TensorView};

use super::Lora;
use crate::checkpoint::{CheckpointError, DType, LoraFactors, NdArray, PickledAdapter, RawLayout};
use crate::config::Generation;
use crate::generation::FileKind;

/// What can go wrong reading or writing an adapter.
#[derive(Debug, thiserror::Error)]
pub enum AdapterFileError {
    #[error("cannot write adapter {}: {source}; check that the directory exists and is writable", path.display())]
    Write { path: PathBuf, source: std::io::Error },
    #[error("cannot read adapter {}: {source}; check the path", path.display())]
    Read { path: PathBuf, source: std::io::Error },
    #[error("adapter {} is not a valid safetensors file: {reason}; pass an adapter written by `needle finetune`", path.display())]
    Safetensors { path: PathBuf, reason: String },
    #[error("adapter {}: metadata `{key}` {problem}; pass an adapter written by `needle finetune`", path.display())]
    Metadata { path: PathBuf, key: &'static str, problem: String },
    #[error("adapter {}: tensor `{name}` {problem}; every `p/A` needs a matching f32 `p/B`", path.display())]
    Tensor { path: PathBuf, name: String, problem: String },
    #[error("adapter {}: unknown extension; use `.safetensors` or `.pkl`", path.display())]
    Extension { path: PathBuf },
    #[error(transparent)]
    Pickle(#[from] CheckpointError),
    #[error("adapter tensor could not be copied off the device: {0}")]
    Candle(#[from] candle_core::Error),
}

/// What an adapter records besides its factors.
#[derive(Debug, Clone, PartialEq)]
pub struct AdapterMeta {
    /// The base checkpoint it was trained on.
    pub base: String,
    /// True when training stopped before the last step (cancelled).
    pub partial: bool,
    /// The base's generation, whose package's layout the file takes.
    pub generation: Generation,
    /// The run's seed (3.x records it).
    pub seed: u64,
}

/// Where a Needle 3 adapter's factors sit (3.x's `write_adapter`): `lora/<path>/A`.
const NEEDLE3_PREFIX: &str = "lora/";

/// The adapter format `path`'s extension names.
fn format_of(path: &Path) -> Result<FileKind, AdapterFileError> {
    let extension = path.extension().and_then(|e| e.to_str());
    FileKind::ALL
        .into_iter()
        .find(|kind| extension == Some(kind.extension()))
        .ok_or_else(|| AdapterFileError::Extension { path: path.into() })
}

/// Writes `lora` to `path` in the format its extension names, atomically.
pub fn save_adapter(path: &Path, lora: &Lora, meta: &AdapterMeta) -> Result<(), AdapterFileError> {
    let bytes = match format_of(path)? {
        FileKind::Safetensors => safetensors_bytes(path, lora, meta)?,
        FileKind::Pickle => crate::checkpoint::writer::adapter_pickle(&to_pickled(path, lora, meta)?),
    };
    write_atomically(path, &bytes)
}

/// Reads an adapter of either format into the reference's in-memory form (what `needle build` and
/// `needle eval` merge).
pub fn load_adapter(path: &Path) -> Result<PickledAdapter, AdapterFileError> {
    match format_of(path)? {
        FileKind::Pickle => Ok(PickledAdapter::load(path)?),
        FileKind::Safetensors => read_safetensors(path),
    }
}

/// `bytes` to `path` through a temporary file in the same directory and a rename.
pub(crate) fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), AdapterFileError> {
    crate::atomic::write_atomically(path, bytes).map_err(|source| AdapterFileError::Write { path: path.into(), source })
}

pub(crate) fn f32_bytes(tensor: &Tensor) -> Result<Vec<u8>, AdapterFileError> {
    Ok(tensor.flatten_all()?.to_vec1::<f32>()?.iter().flat_map(|v| v.to_le_bytes()).collect())
}

/// A named f32 tensor ready to serialize: `(name, shape, little-endian bytes)`.
pub(crate) type F32Buffer = (String, Vec<usize>, Vec<u8>);

/// Every factor's tensors, `A` before `B`.
pub(crate) fn factor_buffers(lora: &Lora) -> Result<Vec<F32Buffer>, AdapterFileError> {
    let mut out = Vec::new();
    for factor in &lora.factors {
        for (side, tensor) in [("A", factor.stacked_a()?), ("B", factor.stacked_b()?)] {
            out.push((format!("{}/{side}", factor.path), tensor.dims().to_vec(), f32_bytes(&tensor)?));
        }
    }
    Ok(out)
}

/// Serializes named f32 buffers with string metadata.
pub(crate) fn serialize_f32(
    path: &Path,
    buffers: &[F32Buffer],
    metadata: HashMap<String, String>,
) -> Result<Vec<u8>, AdapterFileError> {
    let invalid =
        |e: safetensors::SafeTensorError| AdapterFileError::Safetensors { path: path.into(), reason: e.to_string() };
    let views = buffers
        .iter()
        .map(|(name, shape, bytes)| {
            Ok((name.clone(), TensorView::new(Dtype::F32, shape.clone(), bytes).map_err(invalid)?))
        })
        .collect::<Result<Vec<_>, AdapterFileError>>()?;
    safetensors::serialize(views, &Some(metadata)).map_err(invalid)
}

fn safetensors_bytes(path: &Path, lora: &Lora, meta: &AdapterMeta) -> Result<Vec<u8>, AdapterFileError> {
    let targets: Vec<&str> = lora.factors.iter().map(|f| f.path.as_str()).collect();
    let mut buffers = factor_buffers(lora)?;
    // A generation whose package saves safetensors adapters gets its package's layout: 3.x reads its
    // own fields as JSON (a string quoted, `null` for none) and ignores the rest. Otherwise the
    // fields are plain text.
    let (scale, base, package_fields) = match meta.generation.profile().adapter {
        FileKind::Pickle => (lora.scale().to_string(), meta.base.clone(), vec![]),
        FileKind::Safetensors => {
            buffers.iter_mut().for_each(|(name, _, _)| *name = format!("{NEEDLE3_PREFIX}{name}"));
            let fields = [("seed", meta.seed.to_string()), ("pieces", "null".into()), ("languages", "null".into())];
            (
                crate::pyjson::python_float_repr(lora.scale()),
                serde_json::Value::from(meta.base.as_str()).to_string(),
                fields.map(|(key, value)| (key.to_string(), value)).to_vec(),
            )
        }
    };
    let mut metadata = HashMap::from([
        ("scale".to_string(), scale),
        ("rank".to_string(), lora.rank.to_string()),
        ("alpha".to_string(), lora.alpha.to_string()),
        ("base".to_string(), base),
        ("targets".to_string(), targets.join(",")),
        ("partial".to_string(), meta.partial.to_string()),
    ]);
    metadata.extend(package_fields);
    serialize_f32(path, &buffers, metadata)
}

fn to_pickled(path: &Path, lora: &Lora, meta: &AdapterMeta) -> Result<PickledAdapter, AdapterFileError> {
    let array = |shape: &[usize], data: Vec<u8>| NdArray { dtype: DType::F32, shape: shape.to_vec(), data };
    let lora_map = lora
        .factors
        .iter()
        .map(|f| {
            let (a, b) = (f.stacked_a()?, f.stacked_b()?);
            let (a, b) = (array(a.dims(), f32_bytes(&a)?), array(b.dims(), f32_bytes(&b)?));
            Ok((f.path.clone(), LoraFactors { a, b }))
        })
        .collect::<Result<BTreeMap<_, _>, AdapterFileError>>()?;
    Ok(PickledAdapter {
        source: path.into(),
        lora: lora_map,
        scale: lora.scale(),
        base: meta.base.clone(),
        rank: lora.rank,
    })
}

/// Reads a safetensors file whole: its bytes and its string metadata.
pub(crate) fn read_safetensors_file(path: &Path) -> Result<(Vec<u8>, HashMap<String, String>), AdapterFileError> {
    let bytes = std::fs::read(path).map_err(|source| AdapterFileError::Read { path: path.into(), source })?;
    let (_, header) = SafeTensors::read_metadata(&bytes)
        .map_err(|e| AdapterFileError::Safetensors { path: path.into(), reason: e.to_string() })?;
    let metadata = header.metadata().clone().unwrap_or_default();
    Ok((bytes, metadata))
}

/// The f32 tensor `name` of a parsed safetensors file as an array.
pub(crate) fn f32_array(path: &Path, tensors: &SafeTensors, name: &str) -> Result<NdArray, AdapterFileError> {
    let problem = |problem: String| AdapterFileError::Tensor { path: path.into(), name: name.into(), problem };
    let view = tensors.tensor(name).map_err(|e| problem(format!("is missing ({e})")))?;
    if view.dtype() != Dtype::F32 {
        return Err(problem(format!("is {:?}, not F32", view.dtype())));
    }
    NdArray::from_raw(DType::F32, view.shape().to_vec(), RawLayout { big_endian: false, fortran: false }, view.data())
        .map_err(|e| problem(e.to_string()))
}

pub(crate) fn metadata_value<T: std::str::FromStr>(
    path: &Path,
    metadata: &HashMap<String, String>,
    key: &'static str,
) -> Result<T, AdapterFileError> {
    let text = metadata.get(key).ok_or_else(|| AdapterFileError::Metadata {
        path: path.into(),
        key,
        problem: "is missing".into(),
    })?;
    text.parse().map_err(|_| AdapterFileError::Metadata {
        path: path.into(),
        key,
        problem: format!("`{text}` does not parse"),
    })
}

fn read_safetensors(path: &Path) -> Result<PickledAdapter, AdapterFileError> {
    let (bytes, metadata) = read_safetensors_file(path)?;
    let tensors = SafeTensors::deserialize(&bytes)
        .map_err(|e| AdapterFileError::Safetensors { path: path.into(), reason: e.to_string() })?;
    let mut lora = BTreeMap::new();
    let mut needle3 = false;
    for name in tensors.names() {
        if let Some(weight) = name.strip_suffix("/A") {
            let factors = LoraFactors {
                a: f32_array(path, &tensors, name)?,
                b: f32_array(path, &tensors, &format!("{weight}/B"))?,
            };
            let weight = match weight.strip_prefix(NEEDLE3_PREFIX) {
                Some(weight) => {
                    needle3 = true;
                    weight
                }
                None => weight,
            };
            lora.insert(weight.to_string(), factors);
        }
    }
    let base: String = metadata_value(path, &metadata, "base")?;
    // 3.x wrote its base as a JSON string.
    let base = match (needle3, serde_json::from_str::<serde_json::Value>(&base)) {
        (true, Ok(serde_json::Value::String(base))) => base,
        _ => base,
    };
    Ok(PickledAdapter {
        source: path.into(),
        lora,
        scale: metadata_value(path, &metadata, "scale")?,
        base,
        rank: metadata_value(path, &metadata, "rank")?,
    })
}
