//! A pickle reader that builds a value tree and never executes anything.
//!
//! `pickle.load` runs whatever callables a file names, so a checkpoint from the internet could run any code.
//! This reader interprets the binary opcodes of protocols 2–5 as a pure stack machine over its own value
//! types. The only callables it understands are an allow-list of numpy array/dtype/scalar constructors
//! (numpy 1.x and 2.x spellings), `_codecs.encode` and the `bytes`/`bytearray`/`set`/`frozenset` builtins
//! (how protocols 2–4 spell those types) and `collections.OrderedDict`; each is interpreted here, never
//! imported. Any other global is refused with its `module.name` and the byte offset of the opcode that
//! named it.
//!
//! Objects live in an arena and the stack holds references to them, because pickles mutate objects after
//! memoizing them (`EMPTY_DICT MEMOIZE ... SETITEMS`, a dtype `BUILD` after its `BINPUT`), and later
//! `BINGET`s must see the mutated object. The arena is turned into a plain [`PyValue`] tree at `STOP`.
//!
//! Every opcode makes at most a constant number of values, but a few steps copy an object the file
//! names only once: the allowed calls (`set(list)`, `_codecs.encode(text)`, an array's BUILD or
//! `_frombuffer`, any tuple they read) and the tree's copies of memoized objects shared by several
//! places. Each such copy is counted against one `Budget`, a small multiple of the file's size,
//! before it is made; so reading takes time and memory linear in the file, and a 1 MB file that asks
//! for hundreds of GB of copies is refused at the opcode that asks.
//!
//! `op` names the opcodes, `machine` runs them, `callables` interprets the allow-listed globals (the
//! numpy array reconstruction among them) and `tree` turns the arena into the result.

mod callables;
mod machine;
pub(crate) mod op;
#[cfg(test)]
mod tests;
mod tree;

use super::array::{ArrayError, NdArray};
use machine::Machine;

/// The newest pickle protocol this reader knows (Python 3.8+ writes at most 5).
const HIGHEST_PROTOCOL: u8 = 5;

/// Containers nested deeper than this are refused: `pickle.dump` itself gives up near 1000 Python frames,
/// and real checkpoints nest a handful of levels.
const MAX_DEPTH: usize = 512;

/// What a read may copy, as a multiple of the file's size, plus a fixed allowance for small files. A real
/// checkpoint copies each array out of the file once (twice when protocol 2 spells it as latin-1 text for
/// `_codecs.encode`) and each key once into the tree, so it stays under three times its size.
const BUDGET_FACTOR: usize = 4;
const BUDGET_ALLOWANCE: usize = 1 << 20;

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

/// Reads a whole pickle into a [`PyValue`]. Bytes after the STOP opcode are ignored, as `pickle.load` does.
pub fn parse(bytes: &[u8]) -> Result<PyValue, PickleError> {
    let mut machine = Machine::new(bytes);
    let root = machine.run()?;
    machine.into_tree(root)
}
