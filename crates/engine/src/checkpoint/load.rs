//! Reading a checkpoint: which generation a file holds, its config and parameters, and the
//! reference's adapter pickles.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::array::{DType, NdArray};
use super::pickle::{PickleError, PyValue};
use super::safetensors_file::SafetensorsProblem;
use crate::config::ModelConfig;
use crate::generation::Generation;

/// The checkpoint layout the reference writes and accepts (`CHECKPOINT_FORMAT_VERSION` in `run.py`).
pub const FORMAT_VERSION: i64 = 2;

const CHECKPOINT_SHAPE: &str =
    "a Needle checkpoint is a pickled dict {\"format_version\": 2, \"params\": {...}, \"config\": {...}}";
const ADAPTER_SHAPE: &str =
    "a Needle LoRA adapter is a pickled dict {\"lora\": {path: {\"A\": array, \"B\": array}}, \"scale\", \"base\", \"rank\"}";

/// A checkpoint or adapter that cannot be used; every variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    // `error`, not `source`: the message already says it, and a chained source would be printed twice.
    #[error("cannot read {}: {error}", path.display())]
    Io { path: PathBuf, error: std::io::Error },
    #[error("{} is not a readable pickle: {error}", path.display())]
    Pickle { path: PathBuf, error: PickleError },
    #[error("{} holds a {found} at the top level, not a dict; {expected}", path.display())]
    NotADict { path: PathBuf, found: &'static str, expected: &'static str },
    #[error(
        "{} is not a format-v{FORMAT_VERSION} checkpoint (got format_version={found}); {}",
        path.display(),
        format_version_fix(*generation)
    )]
    FormatVersion { path: PathBuf, found: String, generation: Generation },
    #[error("{} is not a readable safetensors file: {problem}", path.display())]
    Safetensors { path: PathBuf, problem: SafetensorsProblem },
    #[error(
        "{} is a safetensors file without the `{key}` metadata a Needle 3 checkpoint carries (cactus-needle 3.x \
         writes format_version, config, step and run); pass a checkpoint it saved (an adapter goes to --lora)",
        path.display()
    )]
    NoCheckpointMetadata { path: PathBuf, key: &'static str },
    #[error(
        "{} is neither a Needle 2 checkpoint (a pickle, whose first byte is 0x80) nor a Needle 3 one (a \
         safetensors file, whose JSON header begins at byte 8): it begins {head}; pass a checkpoint saved by \
         cactus-needle",
        path.display()
    )]
    NotACheckpoint { path: PathBuf, head: String },
    #[error(
        "{}: `{name}` holds {value} at {place:?}; weights must be finite numbers, so the run that saved the file \
         diverged or the file is damaged: save or train it again",
        path.display()
    )]
    NonFinite { path: PathBuf, name: String, place: Vec<usize>, value: f64 },
    #[error(
        "{}: parameter `{name}` is {dtype}; Needle Studio reads float32, float16 and bfloat16 weights (save the \
         checkpoint in one of them)",
        path.display()
    )]
    ParamDtype { path: PathBuf, name: String, dtype: String },
    #[error("{} has no `{key}` entry; {expected}", path.display())]
    MissingKey { path: PathBuf, key: String, expected: &'static str },
    #[error("{}: `{key}` is a {found}, but {expected}", path.display())]
    WrongType { path: PathBuf, key: String, found: &'static str, expected: &'static str },
    #[error("{}: config value `{key}` {problem}; correct it in the checkpoint's config dict", path.display())]
    ConfigValue { path: PathBuf, key: String, problem: String },
    #[error(
        "{}: no parameter `{name}` among its {count}; names are the `/`-joined params keys, e.g. `{example}`",
        path.display()
    )]
    MissingParam { path: PathBuf, name: String, count: usize, example: String },
    #[error(
        "{}: parameter `{name}` has shape {shape:?}, which holds no elements; every Needle parameter holds at \
         least one, so the file is damaged or was not saved from a Needle model",
        path.display()
    )]
    EmptyParam { path: PathBuf, name: String, shape: Vec<usize> },
}

/// How a checkpoint's bytes are laid out, told by their structure, never by one byte: a safetensors
/// header length may well begin with 0x80, a pickle's protocol mark.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Container {
    /// A pickle of protocol 2 and up (what cactus-needle 2.x writes).
    Pickle,
    /// A safetensors file (what cactus-needle 3.x writes), damaged or not.
    Safetensors,
}

impl Container {
    /// The container `head` (a file's first bytes; 9 are enough) opens as. A safetensors file has
    /// its JSON header at byte 8, a pickle its protocol mark (0x80, then the protocol) at byte 0.
    /// Both can hold: a header length whose low byte is 0x80 (one safetensors file in 32, as the
    /// header is padded to 8 bytes) is a safetensors file, even one whose length is damaged, while
    /// a pickle with a `{` at byte 8 reads as a header longer than any safetensors header may be.
    pub(super) fn of(head: &[u8]) -> Option<Self> {
        const PROTOCOL_MARK: u8 = 0x80;
        let json_at_8 = head.get(8) == Some(&b'{');
        let header_len = head.first_chunk::<8>().map_or(u64::MAX, |b| u64::from_le_bytes(*b));
        match head {
            [PROTOCOL_MARK, 2..=5, ..] if !json_at_8 || header_len > super::safetensors_file::MAX_HEADER => {
                Some(Container::Pickle)
            }
            _ if json_at_8 => Some(Container::Safetensors),
            // Another protocol byte: the pickle reader says which protocols it reads.
            [PROTOCOL_MARK, ..] => Some(Container::Pickle),
            _ => None,
        }
    }

    /// The generation whose package writes checkpoints in this container.
    pub(super) fn generation(self) -> Generation {
        match self {
            Container::Pickle => Generation::Needle2,
            Container::Safetensors => Generation::Needle3,
        }
    }
}

/// A file format a generation's package writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    /// A Python pickle (2.x's format-v2 dicts), read without executing anything.
    Pickle,
    /// safetensors, with the package's fields in its string metadata.
    Safetensors,
}

impl FileKind {
    pub const ALL: [FileKind; 2] = [FileKind::Pickle, FileKind::Safetensors];

    /// The file a base checkpoint of `generation` is.
    pub const fn of_checkpoint(generation: Generation) -> Self {
        match generation {
            Generation::Needle2 => FileKind::Pickle,
            Generation::Needle3 => FileKind::Safetensors,
        }
    }

    /// The extension such a file is saved with.
    pub fn extension(self) -> &'static str {
        match self {
            FileKind::Pickle => "pkl",
            FileKind::Safetensors => "safetensors",
        }
    }
}

/// A format-v2 checkpoint: params flattened to `/`-joined paths (`stack/layers/block/self_attn/q_proj/kernel`).
#[derive(Debug, Clone)]
pub struct Checkpoint {
    /// The file it was read from, for messages.
    pub source: PathBuf,
    pub params: BTreeMap<String, NdArray>,
    /// The config with reference defaults for missing keys, `attn_dim` resolved.
    pub config: ModelConfig,
    pub step: Option<i64>,
}

impl Checkpoint {
    /// One parameter by its flattened path.
    pub fn param(&self, name: &str) -> Result<&NdArray, CheckpointError> {
        self.params.get(name).ok_or_else(|| CheckpointError::MissingParam {
            path: self.source.clone(),
            name: name.to_owned(),
            count: self.params.len(),
            example: self.params.keys().next().cloned().unwrap_or_default(),
        })
    }
}

impl FileReader<'_> {
    /// cactus-needle 2.x's checkpoint pickle.
    pub(super) fn needle2_checkpoint(&self, bytes: &[u8]) -> Result<Checkpoint, CheckpointError> {
        let (file, path) = (self, self.path);
        let mut top = file.top_dict(bytes, CHECKPOINT_SHAPE)?;
        match top.take("format_version") {
            Some(PyValue::Int(FORMAT_VERSION)) => {}
            other => {
                return Err(CheckpointError::FormatVersion {
                    path: path.to_owned(),
                    found: python_repr(other.as_ref()),
                    generation: Generation::Needle2,
                })
            }
        }
        let params = file.params(top.require("params", CHECKPOINT_SHAPE)?)?;
        let config = file.config(top.require("config", CHECKPOINT_SHAPE)?)?;
        let step = match top.take("step") {
            None | Some(PyValue::None) => None,
            Some(value) => Some(file.integer("step", &value, "the step must be an int or None")?),
        };
        Ok(Checkpoint { source: path.to_owned(), params, config, step })
    }
}

/// The two LoRA factors of one adapted weight: `W + scale * A @ B`.
#[derive(Debug, Clone, PartialEq)]
pub struct LoraFactors {
    pub a: NdArray,
    pub b: NdArray,
}

/// The reference's LoRA adapter pickle, as `needle finetune` writes it.
#[derive(Debug, Clone)]
pub struct PickledAdapter {
    /// The file it was read from, for messages.
    pub source: PathBuf,
    /// Factors by the flattened path of the weight they adapt.
    pub lora: BTreeMap<String, LoraFactors>,
    pub scale: f64,
    /// The base checkpoint path the adapter was trained on, as recorded at training time.
    pub base: String,
    pub rank: usize,
}

impl PickledAdapter {
    /// Reads an adapter pickle without executing anything.
    pub fn load(path: &Path) -> Result<Self, CheckpointError> {
        let file = FileReader { path };
        let mut top = file.top_dict(&file.read()?, ADAPTER_SHAPE)?;
        let groups = match top.require("lora", ADAPTER_SHAPE)? {
            PyValue::Dict(groups) => groups,
            other => {
                return Err(file.wrong_type(
                    "lora",
                    other.type_name(),
                    "it must map weight paths to {\"A\", \"B\"} dicts",
                ))
            }
        };
        let mut lora = BTreeMap::new();
        for (key, group) in groups {
            let target = file.str_key("lora", key)?;
            let factors = file.lora_factors(&target, group)?;
            lora.insert(target, factors);
        }
        let scale = match top.require("scale", ADAPTER_SHAPE)? {
            PyValue::Float(f) => f,
            PyValue::Int(i) => i as f64,
            other => return Err(file.wrong_type("scale", other.type_name(), "the scale must be a float")),
        };
        let base = match top.require("base", ADAPTER_SHAPE)? {
            PyValue::Str(s) => s,
            other => return Err(file.wrong_type("base", other.type_name(), "the base must be a str path")),
        };
        let rank = file.integer("rank", &top.require("rank", ADAPTER_SHAPE)?, "the rank must be a non-negative int")?;
        let rank = usize::try_from(rank)
            .map_err(|_| file.wrong_type("rank", "negative int", "the rank must be a non-negative int"))?;
        Ok(PickledAdapter { source: path.to_owned(), lora, scale, base, rank })
    }
}

/// Reading helpers that know the file path, so every error names it.
pub(super) struct FileReader<'p> {
    pub(super) path: &'p Path,
}

/// The entries of a top-level dict, taken out one by one.
struct Entries(Vec<(PyValue, PyValue)>);

impl Entries {
    /// Removes and returns the value under `key`; the last pair wins, as in Python.
    fn take(&mut self, key: &str) -> Option<PyValue> {
        let index = self.0.iter().rposition(|(k, _)| matches!(k, PyValue::Str(s) if s == key))?;
        Some(self.0.swap_remove(index).1)
    }
}

impl FileReader<'_> {
    pub(super) fn read(&self) -> Result<Vec<u8>, CheckpointError> {
        std::fs::read(self.path).map_err(|error| CheckpointError::Io { path: self.path.to_owned(), error })
    }

    fn top_dict(&self, bytes: &[u8], expected: &'static str) -> Result<TopDict<'_>, CheckpointError> {
        match super::pickle::parse(bytes) {
            Ok(PyValue::Dict(pairs)) => Ok(TopDict { file: self, entries: Entries(pairs) }),
            Ok(other) => {
                Err(CheckpointError::NotADict { path: self.path.to_owned(), found: other.type_name(), expected })
            }
            Err(error) => Err(CheckpointError::Pickle { path: self.path.to_owned(), error }),
        }
    }

    fn wrong_type(&self, key: &str, found: &'static str, expected: &'static str) -> CheckpointError {
        CheckpointError::WrongType { path: self.path.to_owned(), key: key.to_owned(), found, expected }
    }

    fn str_key(&self, parent: &str, key: PyValue) -> Result<String, CheckpointError> {
        match key {
            PyValue::Str(s) => Ok(s),
            other => {
                Err(self.wrong_type(&format!("{parent}/<key>"), other.type_name(), "every key there must be a str"))
            }
        }
    }

    /// An int, also accepting a numpy integer scalar (what `np.int64` arithmetic leaves behind).
    fn integer(&self, key: &str, value: &PyValue, expected: &'static str) -> Result<i64, CheckpointError> {
        match value {
            PyValue::Int(i) => Ok(*i),
            PyValue::Array(a) if a.shape.is_empty() => numpy_scalar(a)
                .and_then(|v| v.as_i64())
                .ok_or_else(|| self.wrong_type(key, "non-integer numpy scalar", expected)),
            other => Err(self.wrong_type(key, other.type_name(), expected)),
        }
    }

    /// Flattens the nested params dict into `/`-joined paths; every leaf must be an array.
    fn params(&self, value: PyValue) -> Result<BTreeMap<String, NdArray>, CheckpointError> {
        let PyValue::Dict(pairs) = value else {
            return Err(self.wrong_type("params", value.type_name(), "params must be a nested dict of numpy arrays"));
        };
        let mut out = BTreeMap::new();
        for (key, child) in pairs {
            let key = self.str_key("params", key)?;
            self.flatten(key, child, &mut out)?;
        }
        Ok(out)
    }

    fn flatten(
        &self,
        path: String,
        value: PyValue,
        out: &mut BTreeMap<String, NdArray>,
    ) -> Result<(), CheckpointError> {
        match value {
            PyValue::Array(array) => {
                let array = self.weight(&path, array)?;
                out.insert(path, array);
                Ok(())
            }
            PyValue::Dict(pairs) => {
                for (key, child) in pairs {
                    let key = self.str_key(&format!("params/{path}"), key)?;
                    self.flatten(format!("{path}/{key}"), child, out)?;
                }
                Ok(())
            }
            other => Err(self.wrong_type(
                &format!("params/{path}"),
                other.type_name(),
                "params may only hold dicts and numpy arrays",
            )),
        }
    }

    /// A weight (a parameter or a LoRA factor): an array with at least one element, every one finite.
    /// An empty one is never a real parameter, and its other dimensions are backed by no data: a
    /// `[2^40, 0]` array would have the consumers that walk its rows (the export's transposes, the
    /// merge) loop 2^40 times over nothing. A NaN or an infinity would train an adapter of NaNs and
    /// build a `.cact` that its own verification refuses.
    pub(super) fn weight(&self, name: &str, array: NdArray) -> Result<NdArray, CheckpointError> {
        let (path, name) = (self.path.to_owned(), name.to_owned());
        if array.is_empty() {
            return Err(CheckpointError::EmptyParam { path, name, shape: array.shape });
        }
        if let Some((place, value)) = array.first_non_finite() {
            return Err(CheckpointError::NonFinite { path, name, place, value });
        }
        Ok(array)
    }

    /// The config dict, its unknown keys dropped as `TransformerConfig(**config)` drops them.
    fn config(&self, value: PyValue) -> Result<ModelConfig, CheckpointError> {
        let PyValue::Dict(pairs) = value else {
            return Err(self.wrong_type(
                "config",
                value.type_name(),
                "the config must be a dict of TransformerConfig fields",
            ));
        };
        let fields = config_field_names();
        let mut object = serde_json::Map::new();
        for (key, value) in pairs {
            let key = self.str_key("config", key)?;
            // TransformerConfig(**config) drops unknown keys whatever their values; so do we.
            if !fields.contains(&key) {
                continue;
            }
            let json = to_json(&value).map_err(|problem| CheckpointError::ConfigValue {
                path: self.path.to_owned(),
                key: key.clone(),
                problem,
            })?;
            object.insert(key, json);
        }
        self.config_from_json(object, ModelConfig::default())
    }

    /// A config's fields (JSON) over `defaults`, naming the key of any bad value, and every count
    /// checked against the range a real model could have ([`ModelConfig::validate`]).
    pub(super) fn config_from_json(
        &self,
        fields: serde_json::Map<String, serde_json::Value>,
        defaults: ModelConfig,
    ) -> Result<ModelConfig, CheckpointError> {
        let generation = defaults.generation;
        let mut object = match serde_json::to_value(defaults) {
            Ok(serde_json::Value::Object(object)) => object,
            _ => serde_json::Map::new(),
        };
        object.extend(fields);
        let mut config: ModelConfig =
            serde_path_to_error::deserialize(serde_json::Value::Object(object)).map_err(|e| {
                CheckpointError::ConfigValue {
                    path: self.path.to_owned(),
                    key: e.path().to_string(),
                    problem: e.inner().to_string(),
                }
            })?;
        config.generation = generation;
        let config = config.resolved();
        config.validate().map_err(|e| CheckpointError::ConfigValue {
            path: self.path.to_owned(),
            key: e.field.to_owned(),
            problem: e.problem,
        })?;
        Ok(config)
    }

    fn lora_factors(&self, target: &str, group: PyValue) -> Result<LoraFactors, CheckpointError> {
        let key = format!("lora/{target}");
        let PyValue::Dict(pairs) = group else {
            return Err(self.wrong_type(
                &key,
                group.type_name(),
                "each adapted weight must map to {\"A\": array, \"B\": array}",
            ));
        };
        let mut entries = Entries(pairs);
        let mut factor = |name: &str| match entries.take(name) {
            Some(PyValue::Array(array)) => self.weight(&format!("{key}/{name}"), array),
            Some(other) => {
                Err(self.wrong_type(&format!("{key}/{name}"), other.type_name(), "LoRA factors must be numpy arrays"))
            }
            None => Err(CheckpointError::MissingKey {
                path: self.path.to_owned(),
                key: format!("{key}/{name}"),
                expected: ADAPTER_SHAPE,
            }),
        };
        Ok(LoraFactors { a: factor("A")?, b: factor("B")? })
    }
}

/// A top-level dict whose required entries report the file when missing.
struct TopDict<'f> {
    file: &'f FileReader<'f>,
    entries: Entries,
}

impl TopDict<'_> {
    fn take(&mut self, key: &str) -> Option<PyValue> {
        self.entries.take(key)
    }

    fn require(&mut self, key: &str, expected: &'static str) -> Result<PyValue, CheckpointError> {
        self.entries.take(key).ok_or_else(|| CheckpointError::MissingKey {
            path: self.file.path.to_owned(),
            key: key.to_owned(),
            expected,
        })
    }
}

/// The config keys the model knows, read off [`ModelConfig`]'s own serialisation.
pub(super) fn config_field_names() -> Vec<String> {
    match serde_json::to_value(ModelConfig::default()) {
        Ok(serde_json::Value::Object(fields)) => fields.keys().cloned().collect(),
        _ => Vec::new(),
    }
}

/// What to do about a checkpoint of another `format_version`, by the generation whose file it is.
fn format_version_fix(generation: Generation) -> &'static str {
    match generation {
        Generation::Needle2 => {
            "old encoder-decoder/tool-calling checkpoints are incompatible, use one saved by needle 2.x"
        }
        Generation::Needle3 => {
            "cactus-needle 3.x saves format-v2 safetensors checkpoints, so this one comes from another version: \
             save it again with cactus-needle 3.x"
        }
    }
}

/// A file's first bytes in hex (at most 16), for a message about a file of no known kind.
pub(super) fn hex_head(bytes: &[u8]) -> String {
    match bytes.len() {
        0 => "with nothing (the file is empty)".to_owned(),
        n => {
            let shown: Vec<String> = bytes.iter().take(16).map(|b| format!("{b:02x}")).collect();
            let more = if n > 16 { " …" } else { "" };
            format!("with the bytes {}{more}", shown.join(" "))
        }
    }
}

/// Python's `repr` of a format_version value, enough to tell the user what was found.
fn python_repr(value: Option<&PyValue>) -> String {
    match value {
        None | Some(PyValue::None) => "None".into(),
        Some(PyValue::Int(i)) => i.to_string(),
        Some(PyValue::Str(s)) => format!("{s:?}"),
        Some(PyValue::Float(f)) => f.to_string(),
        Some(other) => format!("<{}>", other.type_name()),
    }
}

/// Converts a config value to JSON for serde: tuples and lists become arrays, numpy scalars numbers.
fn to_json(value: &PyValue) -> Result<serde_json::Value, String> {
    use serde_json::Value as J;
    Ok(match value {
        PyValue::None => J::Null,
        PyValue::Bool(b) => J::Bool(*b),
        PyValue::Int(i) => J::from(*i),
        PyValue::Float(f) => float_json(*f)?,
        PyValue::Str(s) => J::String(s.clone()),
        PyValue::List(items) | PyValue::Tuple(items) | PyValue::Set(items) => {
            J::Array(items.iter().map(to_json).collect::<Result<_, _>>()?)
        }
        PyValue::Dict(pairs) => {
            let mut object = serde_json::Map::new();
            for (key, value) in pairs {
                let PyValue::Str(key) = key else {
                    return Err(format!("is a dict with a {} key, where only str keys fit", key.type_name()));
                };
                object.insert(key.clone(), to_json(value)?);
            }
            J::Object(object)
        }
        PyValue::Array(a) if a.shape.is_empty() => {
            numpy_scalar(a).ok_or_else(|| "is a non-finite numpy float".to_owned())?
        }
        PyValue::BigInt(_) => return Err("is an integer too large for 64 bits".into()),
        other => return Err(format!("is a {}, which no config field takes", other.type_name())),
    })
}

fn float_json(f: f64) -> Result<serde_json::Value, String> {
    serde_json::Number::from_f64(f)
        .map(serde_json::Value::Number)
        .ok_or_else(|| format!("is {f}, which is not a finite number"))
}

/// A 0-d array (numpy scalar) as a JSON number or bool; None for non-finite floats.
fn numpy_scalar(a: &NdArray) -> Option<serde_json::Value> {
    use serde_json::Value as J;
    let mut wide = [0u8; 8];
    let bytes = a.data.get(..a.dtype.itemsize())?;
    wide[..bytes.len()].copy_from_slice(bytes);
    // Sign-extend signed integers narrower than 8 bytes.
    let signed = |bits: u32| (i64::from_le_bytes(wide) << (64 - bits)) >> (64 - bits);
    Some(match a.dtype {
        DType::Bool => J::Bool(wide[0] != 0),
        DType::I8 => J::from(signed(8)),
        DType::I16 => J::from(signed(16)),
        DType::I32 => J::from(signed(32)),
        DType::I64 => J::from(signed(64)),
        DType::U8 | DType::U16 | DType::U32 | DType::U64 => J::from(u64::from_le_bytes(wide)),
        DType::F64 => float_json(f64::from_le_bytes(wide)).ok()?,
        // float16, bfloat16 and float32 widen to f64 exactly.
        DType::F16 | DType::BF16 | DType::F32 => float_json(f64::from(*a.to_f32().first()?)).ok()?,
    })
}
