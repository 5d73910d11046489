//! The values a pickle is read into, its errors, and the limits every read keeps.

use crate::checkpoint::{ArrayError, NdArray};

/// The newest pickle protocol this reader knows (Python 3.8+ writes at most 5).
pub(super) const HIGHEST_PROTOCOL: u8 = 5;

/// Containers nested deeper than this are refused: `pickle.dump` itself gives up near 1000 Python frames,
/// and real checkpoints nest a handful of levels.
pub(super) const MAX_DEPTH: usize = 512;

/// What a read may copy, as a multiple of the file's size, plus a fixed allowance for small files. A real
/// checkpoint copies each array out of the file once (twice when protocol 2 spells it as latin-1 text for
/// `_codecs.encode`) and each key once into the tree, so it stays under three times its size.
pub(super) const BUDGET_FACTOR: usize = 4;
pub(super) const BUDGET_ALLOWANCE: usize = 1 << 20;

/// A Python value as a pickle describes it, with numpy arrays and scalars as [`NdArray`]s.
#[derive(Debug, Clone, PartialEq)]
pub enum PyValue {
    None,
    Bool(bool),
    Int(i64),
    /// An integer outside the i64 range, as the pickle's little-endian two's-complement bytes.
    BigInt(Vec<u8>),
    Float(f64),
    Str(String),
    /// `bytes` or `bytearray`.
    Bytes(Vec<u8>),
    List(Vec<PyValue>),
    Tuple(Vec<PyValue>),
    /// `set` or `frozenset`, in pickle order.
    Set(Vec<PyValue>),
    /// `dict` or `OrderedDict` pairs in pickle order. `pickle.dump` never repeats a key; a hand-made file
    /// may, and then lookups take the last pair, which is the one Python's assignments would keep.
    Dict(Vec<(PyValue, PyValue)>),
    /// A numpy array; a numpy scalar is a 0-d array.
    Array(NdArray),
}

impl PyValue {
    /// The Python type name, for messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            PyValue::None => "None",
            PyValue::Bool(_) => "bool",
            PyValue::Int(_) | PyValue::BigInt(_) => "int",
            PyValue::Float(_) => "float",
            PyValue::Str(_) => "str",
            PyValue::Bytes(_) => "bytes",
            PyValue::List(_) => "list",
            PyValue::Tuple(_) => "tuple",
            PyValue::Set(_) => "set",
            PyValue::Dict(_) => "dict",
            PyValue::Array(_) => "numpy array",
        }
    }

    /// The value stored under string key `key`, if this is a dict that has one.
    pub fn get(&self, key: &str) -> Option<&PyValue> {
        match self {
            PyValue::Dict(pairs) => {
                pairs.iter().rev().find(|(k, _)| matches!(k, PyValue::Str(s) if s == key)).map(|(_, v)| v)
            }
            _ => None,
        }
    }
}

/// A pickle that cannot be read, with the byte offset of the opcode where reading stopped.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("at byte {offset}: {kind}")]
pub struct PickleError {
    pub offset: usize,
    pub kind: PickleErrorKind,
}

/// What went wrong; every message ends with what to do about it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PickleErrorKind {
    #[error("{opcode} needs {needed} bytes but only {available} remain; the file is truncated, copy or save it again")]
    Truncated { opcode: &'static str, needed: u64, available: usize },
    #[error("the data ends without a STOP opcode; the file is truncated, copy or save it again")]
    MissingStop,
    #[error("byte 0x{0:02x} is not a pickle opcode; the file is not a pickle or is corrupted")]
    UnknownOpcode(u8),
    #[error(
        "protocol {0} is newer than {HIGHEST_PROTOCOL}, the newest this reader knows; save with protocol 5 or lower"
    )]
    UnsupportedProtocol(u8),
    #[error("opcode {opcode} is not supported: {why}")]
    UnsupportedOpcode { opcode: &'static str, why: &'static str },
    #[error(
        "refusing global `{module}.{name}`: only numpy arrays, dtypes and scalars, builtin containers and \
         `collections.OrderedDict` are understood (nothing is ever imported or run); convert the object to \
         plain dicts, lists, numbers and numpy arrays before pickling"
    )]
    ForbiddenGlobal { module: String, name: String },
    #[error("{opcode} needs more values on the stack than there are; the file is corrupted")]
    StackUnderflow { opcode: &'static str },
    #[error("{opcode} needs a MARK that was never pushed; the file is corrupted")]
    MissingMark { opcode: &'static str },
    #[error("{opcode} refers to memo slot {index}, which was never stored; the file is corrupted")]
    MemoMiss { opcode: &'static str, index: u32 },
    #[error("{opcode} expects {expected} but found {found}; the file is corrupted or not a plain-data pickle")]
    WrongType { opcode: &'static str, expected: &'static str, found: &'static str },
    #[error("{opcode} text is not valid UTF-8; the file is corrupted")]
    InvalidUtf8 { opcode: &'static str },
    #[error("`{callable}` was called with {problem}; the file is corrupted or was written by an unsupported numpy")]
    BadArguments { callable: &'static str, problem: String },
    #[error("numpy dtype `{0}` is not supported; store float16/32/64, (u)int8..64 or bool arrays")]
    UnsupportedDType(String),
    #[error("numpy array {0}")]
    BadArray(#[from] ArrayError),
    #[error("{0}; the pickle holds something other than plain data and numpy arrays")]
    NotData(&'static str),
    #[error("containers nest deeper than {MAX_DEPTH} levels or contain themselves; save plain, acyclic data")]
    TooDeep,
    #[error(
        "{what} would take the copies made while reading this {file_len}-byte file past {limit} bytes \
         ({BUDGET_FACTOR}× its size plus {BUDGET_ALLOWANCE}); the file repeats copies of shared objects far \
         beyond any real checkpoint, so it is malformed or hostile"
    )]
    OverBudget { what: &'static str, file_len: usize, limit: usize },
}
