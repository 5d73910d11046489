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
use crate::checkpoint::safetensors_file::{self, SafetensorsProblem};
use crate::checkpoint::{CheckpointError, DType, FileKind, LoraFactors, NdArray, PickledAdapter, RawLayout};
use crate::generation::Generation;

/// What can go wrong reading or writing an adapter.
#[derive(Debug, thiserror::Error)]
pub enum AdapterFileError {
    #[error("cannot write adapter {}: {source}; check that the directory exists and is writable", path.display())]
    Write { path: PathBuf, source: std::io::Error },
    #[error("cannot read adapter {}: {source}; check the path", path.display())]
    Read { path: PathBuf, source: std::io::Error },
    #[error("adapter {} is not a readable safetensors file: {problem}; pass an adapter written by `needle finetune`", path.display())]
    Safetensors { path: PathBuf, problem: SafetensorsProblem },
    #[error("adapter {}: its tensors cannot be laid out as safetensors: {reason}", path.display())]
    Layout { path: PathBuf, reason: String },
    #[error("adapter {}: metadata `{key}` {problem}; pass an adapter written by `needle finetune`", path.display())]
    Metadata { path: PathBuf, key: &'static str, problem: String },
    #[error("adapter {}: tensor `{name}` {problem}", path.display())]
    Tensor { path: PathBuf, name: String, problem: String },
    #[error(
        "adapter {} holds no LoRA factors (no `p/A` and `p/B` tensors for any weight `p`), so it would change \
         nothing; pass the adapter `needle finetune` wrote, not an empty or stripped copy",
        path.display()
    )]
    NoFactors { path: PathBuf },
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
/// The file `generation`'s package saves an adapter as: the same kind as its checkpoints.
pub const fn adapter_kind(generation: Generation) -> FileKind {
    FileKind::of_checkpoint(generation)
}

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
/// `needle eval` merge). One without factors is refused: merged, it would pass the base off as
/// the fine-tuned model.
pub fn load_adapter(path: &Path) -> Result<PickledAdapter, AdapterFileError> {
    let adapter = match format_of(path)? {
        FileKind::Pickle => PickledAdapter::load(path)?,
        FileKind::Safetensors => read_safetensors(path)?,
    };
    if adapter.lora.is_empty() {
        return Err(AdapterFileError::NoFactors { path: path.into() });
    }
    Ok(adapter)
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
    let invalid = |e: safetensors::SafeTensorError| AdapterFileError::Layout {
        path: path.into(),
        reason: safetensors_file::describe(&e).to_string(),
    };
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
    let (scale, base, package_fields) = match adapter_kind(meta.generation) {
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

/// Reads a file whole (an adapter, a run's saved state).
pub(crate) fn read_file(path: &Path) -> Result<Vec<u8>, AdapterFileError> {
    std::fs::read(path).map_err(|source| AdapterFileError::Read { path: path.into(), source })
}

/// The tensors and the string metadata of a safetensors file's bytes.
pub(crate) fn parse_safetensors<'b>(
    path: &Path,
    bytes: &'b [u8],
) -> Result<(SafeTensors<'b>, HashMap<String, String>), AdapterFileError> {
    safetensors_file::parse(bytes).map_err(|problem| AdapterFileError::Safetensors { path: path.into(), problem })
}

/// The f32 tensor `name` of a parsed safetensors file as an array, every value finite.
pub(crate) fn f32_array(path: &Path, tensors: &SafeTensors, name: &str) -> Result<NdArray, AdapterFileError> {
    let problem = |problem: String| AdapterFileError::Tensor { path: path.into(), name: name.into(), problem };
    let view = tensors.tensor(name).map_err(|_| {
        problem(
            "is missing; every adapted weight `p` has the two factors `p/A` and `p/B`, and a run's state their \
                 moments `p/A/mu`, `p/A/nu`, `p/B/mu` and `p/B/nu`"
                .into(),
        )
    })?;
    if view.dtype() != Dtype::F32 {
        return Err(problem(format!("is {:?}; adapters hold float32 (F32) factors", view.dtype())));
    }
    let array = NdArray::from_raw(
        DType::F32,
        view.shape().to_vec(),
        RawLayout { big_endian: false, fortran: false },
        view.data(),
    )
    .map_err(|e| problem(e.to_string()))?;
    if let Some((place, value)) = array.first_non_finite() {
        return Err(problem(format!(
            "holds {value} at {place:?}; factors must be finite numbers, so the run that saved them diverged or \
             the file is damaged: train the adapter again"
        )));
    }
    Ok(array)
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
    let bytes = read_file(path)?;
    let (tensors, metadata) = parse_safetensors(path, &bytes)?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::fixture;

    /// The Needle 3 fixture adapter with factor `name`'s value 3 made `value`, written as `file_name`.
    fn adapter_with(value: f32, dir: &Path, file_name: &str) -> PathBuf {
        changed_adapter(dir, file_name, |adapter| {
            let factors = adapter.lora.values_mut().next().unwrap();
            factors.a.data[12..16].copy_from_slice(&value.to_le_bytes());
        })
    }

    /// The Needle 3 fixture adapter after `change`, written as `file_name` in `dir`.
    fn changed_adapter(dir: &Path, file_name: &str, change: impl FnOnce(&mut PickledAdapter)) -> PathBuf {
        let mut adapter = load_adapter(&fixture("golden/needle3_heads/adapter.safetensors")).unwrap();
        change(&mut adapter);
        let path = dir.join(file_name);
        let bytes = match format_of(&path).unwrap() {
            FileKind::Pickle => crate::checkpoint::writer::adapter_pickle(&adapter),
            FileKind::Safetensors => {
                let buffers: Vec<F32Buffer> = adapter
                    .lora
                    .iter()
                    .flat_map(|(p, f)| [(format!("{p}/A"), &f.a), (format!("{p}/B"), &f.b)])
                    .map(|(name, array)| (name, array.shape.clone(), array.data.clone()))
                    .collect();
                let metadata = HashMap::from([
                    ("base".to_string(), adapter.base.clone()),
                    ("scale".to_string(), adapter.scale.to_string()),
                    ("rank".to_string(), adapter.rank.to_string()),
                ]);
                serialize_f32(&path, &buffers, metadata).unwrap()
            }
        };
        std::fs::write(&path, bytes).unwrap();
        path
    }

    #[test]
    fn a_non_finite_factor_is_refused_by_name_in_either_format() {
        let dir = tempfile::tempdir().unwrap();
        let path = adapter_with(f32::NAN, dir.path(), "nan.safetensors");
        let message = load_adapter(&path).unwrap_err().to_string();
        assert!(message.contains("/A` holds NaN at [0, 0, 3]; factors must be finite numbers"), "{message}");
        let path = adapter_with(f32::NEG_INFINITY, dir.path(), "inf.pkl");
        let message = load_adapter(&path).unwrap_err().to_string();
        assert!(message.contains("/A` holds -inf at [0, 0, 3]; weights must be finite numbers"), "{message}");
        assert!(message.contains("inf.pkl"), "{message}");
    }

    /// An adapter without a single factor would merge as the base itself: refused in either format,
    /// naming the file.
    #[test]
    fn an_adapter_without_factors_is_refused_by_name_in_either_format() {
        let dir = tempfile::tempdir().unwrap();
        for file_name in ["none.safetensors", "none.pkl"] {
            let path = changed_adapter(dir.path(), file_name, |adapter| adapter.lora.clear());
            let message = load_adapter(&path).unwrap_err().to_string();
            let want = format!("adapter {} holds no LoRA factors (no `p/A` and `p/B` tensors", path.display());
            assert!(message.starts_with(&want), "{message}");
            assert!(message.contains("pass the adapter `needle finetune` wrote"), "{message}");
        }
    }

    #[test]
    fn a_damaged_adapter_says_what_is_wrong_and_where() {
        let dir = tempfile::tempdir().unwrap();
        let bytes = std::fs::read(fixture("golden/needle3_heads/adapter.safetensors")).unwrap();
        let path = dir.path().join("cut.safetensors");
        std::fs::write(&path, &bytes[..bytes.len() - 100]).unwrap();
        let message = load_adapter(&path).unwrap_err().to_string();
        assert!(
            message.starts_with(&format!("adapter {} is not a readable safetensors file: tensor `", path.display()))
        );
        assert!(message.contains("past the end of the"), "{message}");
    }
}
