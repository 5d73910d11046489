//! A pickle reader that builds a value tree and never executes anything.
//!
//! `pickle.load` runs whatever callables a file names, so a checkpoint from the internet could run any code.
//! This reader interprets the binary opcodes of protocols 2–5 as a pure stack machine over its own value
//! types. The only callables it understands are an allow-list of numpy array/dtype/scalar constructors
//! (numpy 1.x and 2.x spellings), `_codecs.encode` and the `bytes`/`bytearray`/`set`/`frozenset` builtins
//! (how protocols 2–4 spell those types) and `collections.OrderedDict`; each is interpreted here, never
//! imported. Any other global is refused with
//! its `module.name` and the byte offset of the opcode that named it.
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

use std::borrow::Cow;
use std::collections::HashMap;

use super::array::{ArrayError, DType, NdArray, RawLayout};

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

/// The bytes a read has copied so far, against what the file's size allows.
#[derive(Debug)]
struct Budget {
    file_len: usize,
    limit: usize,
    used: usize,
}

impl Budget {
    fn new(file_len: usize) -> Self {
        let limit = file_len.saturating_mul(BUDGET_FACTOR).saturating_add(BUDGET_ALLOWANCE);
        Budget { file_len, limit, used: 0 }
    }

    /// Counts `bytes` that `what` is about to copy, refusing before they are allocated.
    fn charge(&mut self, what: &'static str, bytes: usize) -> Result<(), PickleErrorKind> {
        self.used = self.used.saturating_add(bytes);
        if self.used > self.limit {
            return Err(PickleErrorKind::OverBudget { what, file_len: self.file_len, limit: self.limit });
        }
        Ok(())
    }
}

/// Reads a whole pickle into a [`PyValue`]. Bytes after the STOP opcode are ignored, as `pickle.load` does.
pub fn parse(bytes: &[u8]) -> Result<PyValue, PickleError> {
    let mut machine = Machine::new(bytes);
    let root = machine.run()?;
    machine.into_tree(root)
}

/// The callables a pickle may name. Each is interpreted by this module; none is ever imported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Global {
    /// `numpy.core.multiarray._reconstruct(ndarray, (0,), b'b')`: an empty array that a BUILD then fills.
    Reconstruct,
    /// `numpy.core.multiarray.scalar(dtype, raw_bytes)`: a numpy scalar.
    Scalar,
    /// `numpy.dtype(code, align, copy)`: a dtype, given its byte order by a BUILD.
    DType,
    /// `numpy.ndarray`, only ever as the first argument of `_reconstruct`.
    NdArrayClass,
    /// `numpy.core.numeric._frombuffer(buffer, dtype, shape, order)`: what protocol 5 writes for arrays.
    FromBuffer,
    /// `_codecs.encode(text, 'latin1')`: how protocol 2 spells a `bytes` object.
    CodecsEncode,
    /// `builtins.bytes()`: how protocol 2 spells an empty `bytes` object.
    EmptyBytes,
    /// `builtins.bytearray(data)`: how protocols 2–4 spell a `bytearray`.
    ByteArray,
    /// `builtins.set(items)` / `builtins.frozenset(items)`: how protocols 2–3 spell sets.
    Set,
    /// `collections.OrderedDict()`: an empty dict that SETITEMS fills.
    OrderedDict,
}

impl Global {
    fn lookup(module: &str, name: &str) -> Option<Global> {
        Some(match (module, name) {
            ("numpy.core.multiarray" | "numpy._core.multiarray", "_reconstruct") => Global::Reconstruct,
            ("numpy.core.multiarray" | "numpy._core.multiarray", "scalar") => Global::Scalar,
            ("numpy", "dtype") => Global::DType,
            ("numpy", "ndarray") => Global::NdArrayClass,
            ("numpy.core.numeric" | "numpy._core.numeric", "_frombuffer") => Global::FromBuffer,
            ("_codecs", "encode") => Global::CodecsEncode,
            // Protocol 2 writes Python 3's `builtins` under its Python 2 name.
            ("builtins" | "__builtin__", "bytes") => Global::EmptyBytes,
            ("builtins" | "__builtin__", "bytearray") => Global::ByteArray,
            ("builtins" | "__builtin__", "set" | "frozenset") => Global::Set,
            ("collections", "OrderedDict") => Global::OrderedDict,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            Global::Reconstruct => "numpy.core.multiarray._reconstruct",
            Global::Scalar => "numpy.core.multiarray.scalar",
            Global::DType => "numpy.dtype",
            Global::NdArrayClass => "numpy.ndarray",
            Global::FromBuffer => "numpy.core.numeric._frombuffer",
            Global::CodecsEncode => "_codecs.encode",
            Global::EmptyBytes => "builtins.bytes",
            Global::ByteArray => "builtins.bytearray",
            Global::Set => "builtins.set",
            Global::OrderedDict => "collections.OrderedDict",
        }
    }
}

type ObjId = usize;

/// A stack or memo entry: small values inline, everything else a reference into the arena.
#[derive(Debug, Clone, Copy)]
enum Value {
    None,
    Bool(bool),
    Int(i64),
    Float(f64),
    Global(Global),
    Obj(ObjId),
}

/// A numpy dtype object: its element type and the byte order its BUILD state gave it.
#[derive(Debug, Clone, Copy)]
struct NumpyDType {
    dtype: DType,
    big_endian: bool,
}

#[derive(Debug)]
enum Obj<'a> {
    Str(Cow<'a, str>),
    Bytes(Cow<'a, [u8]>),
    BigInt(&'a [u8]),
    Tuple(Vec<Value>),
    List(Vec<Value>),
    Dict(Vec<(Value, Value)>),
    Set(Vec<Value>),
    DType(NumpyDType),
    /// Made by `_reconstruct`, waiting for the BUILD that gives it shape, dtype and data.
    ArrayShell,
    Array(NdArray),
    /// Already moved into the result tree.
    Taken,
}

impl Obj<'_> {
    fn type_name(&self) -> &'static str {
        match self {
            Obj::Str(_) => "str",
            Obj::Bytes(_) => "bytes",
            Obj::BigInt(_) => "int",
            Obj::Tuple(_) => "tuple",
            Obj::List(_) => "list",
            Obj::Dict(_) => "dict",
            Obj::Set(_) => "set",
            Obj::DType(_) => "numpy dtype",
            Obj::ArrayShell => "numpy array without state",
            Obj::Array(_) => "numpy array",
            Obj::Taken => "value already used",
        }
    }

    fn children(&self) -> Vec<Value> {
        match self {
            Obj::Tuple(items) | Obj::List(items) | Obj::Set(items) => items.clone(),
            Obj::Dict(pairs) => pairs.iter().flat_map(|&(k, v)| [k, v]).collect(),
            _ => Vec::new(),
        }
    }
}

/// Every opcode of protocols 0–5, named as in CPython's `pickletools`: the ones the machine interprets
/// (the writer emits a subset of them), then the ones [`refusal`](op::refusal) explains.
pub(crate) mod op {
    /// Defines one `u8` constant per opcode and `name`, its `pickletools` spelling for messages, from one table.
    macro_rules! opcodes {
        ($($name:ident = $byte:expr,)*) => {
            $(pub const $name: u8 = $byte;)*

            /// The `pickletools` name of an opcode byte.
            pub fn name(byte: u8) -> &'static str {
                match byte {
                    $($name => stringify!($name),)*
                    _ => "an undefined opcode",
                }
            }
        };
    }

    opcodes! {
        MARK = b'(',
        STOP = b'.',
        POP = b'0',
        POP_MARK = b'1',
        DUP = b'2',
        BININT = b'J',
        BININT1 = b'K',
        BININT2 = b'M',
        NONE = b'N',
        REDUCE = b'R',
        BINUNICODE = b'X',
        APPEND = b'a',
        BUILD = b'b',
        GLOBAL = b'c',
        DICT = b'd',
        EMPTY_DICT = b'}',
        APPENDS = b'e',
        BINGET = b'h',
        LONG_BINGET = b'j',
        LIST = b'l',
        EMPTY_LIST = b']',
        BINPUT = b'q',
        LONG_BINPUT = b'r',
        SETITEM = b's',
        TUPLE = b't',
        EMPTY_TUPLE = b')',
        SETITEMS = b'u',
        BINFLOAT = b'G',
        PROTO = 0x80,
        NEWOBJ = 0x81,
        TUPLE1 = 0x85,
        TUPLE2 = 0x86,
        TUPLE3 = 0x87,
        NEWTRUE = 0x88,
        NEWFALSE = 0x89,
        LONG1 = 0x8a,
        LONG4 = 0x8b,
        BINBYTES = b'B',
        SHORT_BINBYTES = b'C',
        SHORT_BINUNICODE = 0x8c,
        BINUNICODE8 = 0x8d,
        BINBYTES8 = 0x8e,
        EMPTY_SET = 0x8f,
        ADDITEMS = 0x90,
        FROZENSET = 0x91,
        NEWOBJ_EX = 0x92,
        STACK_GLOBAL = 0x93,
        MEMOIZE = 0x94,
        FRAME = 0x95,
        BYTEARRAY8 = 0x96,

        INT = b'I',
        LONG = b'L',
        FLOAT = b'F',
        STRING = b'S',
        UNICODE = b'V',
        GET = b'g',
        PUT = b'p',
        INST = b'i',
        OBJ = b'o',
        BINSTRING = b'T',
        SHORT_BINSTRING = b'U',
        PERSID = b'P',
        BINPERSID = b'Q',
        EXT1 = 0x82,
        EXT2 = 0x83,
        EXT4 = 0x84,
        NEXT_BUFFER = 0x97,
        READONLY_BUFFER = 0x98,
    }

    /// Why an opcode that exists is refused, given to the user; None for the ones the machine interprets
    /// and for bytes that are no opcode.
    pub fn refusal(byte: u8) -> Option<&'static str> {
        Some(match byte {
            INT | LONG | FLOAT | STRING | UNICODE | GET | PUT | INST | OBJ => {
                "it belongs to text protocols 0/1; save with pickle protocol 2 or newer"
            }
            BINSTRING | SHORT_BINSTRING => "it is a Python 2 byte string; save the file again under Python 3",
            PERSID | BINPERSID => {
                "persistent ids need the saver's own loader (torch.save and the like); \
                 save the arrays with plain pickle.dump"
            }
            EXT1 | EXT2 | EXT4 => "copyreg extension codes name code to run; save without copyreg extensions",
            NEXT_BUFFER | READONLY_BUFFER => {
                "out-of-band buffers live outside the file; save without a buffer_callback"
            }
            _ => return None,
        })
    }
}

/// The pickle virtual machine: input cursor, stack, mark positions, memo and object arena.
struct Machine<'a> {
    input: &'a [u8],
    pos: usize,
    /// Offset and name of the opcode being executed: every error names them.
    at: usize,
    opcode: &'static str,
    stack: Vec<Value>,
    /// Stack heights at each MARK; values below the innermost mark are out of reach, as in CPython.
    marks: Vec<usize>,
    memo: HashMap<u32, Value>,
    objects: Vec<Obj<'a>>,
    budget: Budget,
}

impl<'a> Machine<'a> {
    fn new(input: &'a [u8]) -> Self {
        Machine {
            input,
            pos: 0,
            at: 0,
            opcode: "",
            stack: Vec::new(),
            marks: Vec::new(),
            memo: HashMap::new(),
            objects: Vec::new(),
            budget: Budget::new(input.len()),
        }
    }

    fn error(&self, kind: PickleErrorKind) -> PickleError {
        PickleError { offset: self.at, kind }
    }

    fn underflow(&self) -> PickleError {
        self.error(PickleErrorKind::StackUnderflow { opcode: self.opcode })
    }

    /// Counts a copy of `count` items of `T` that `what` (the opcode or callable) is about to make.
    fn charge<T>(&mut self, what: &'static str, count: usize) -> Result<(), PickleError> {
        let bytes = count.saturating_mul(std::mem::size_of::<T>());
        self.budget.charge(what, bytes).map_err(|kind| self.error(kind))
    }

    /// Runs opcodes until STOP and returns the value it pops.
    fn run(&mut self) -> Result<Value, PickleError> {
        loop {
            self.at = self.pos;
            let Some(&opcode) = self.input.get(self.pos) else {
                return Err(self.error(PickleErrorKind::MissingStop));
            };
            self.pos += 1;
            self.opcode = op::name(opcode);
            if opcode == op::STOP {
                return self.pop();
            }
            self.step(opcode)?;
        }
    }

    fn step(&mut self, opcode: u8) -> Result<(), PickleError> {
        match opcode {
            op::PROTO => {
                let version = self.read_u8()?;
                if version > HIGHEST_PROTOCOL {
                    return Err(self.error(PickleErrorKind::UnsupportedProtocol(version)));
                }
            }
            // Frames only group opcodes for buffered reading; the whole file is already in memory.
            op::FRAME => {
                self.read_u64()?;
            }
            op::MARK => self.marks.push(self.stack.len()),
            op::POP => {
                self.pop()?;
            }
            op::POP_MARK => {
                self.pop_mark()?;
            }
            op::DUP => {
                let top = self.peek()?;
                self.stack.push(top);
            }
            op::NONE => self.stack.push(Value::None),
            op::NEWTRUE => self.stack.push(Value::Bool(true)),
            op::NEWFALSE => self.stack.push(Value::Bool(false)),
            op::BININT => {
                let v = i32::from_le_bytes(self.read_array()?);
                self.stack.push(Value::Int(v.into()));
            }
            op::BININT1 => {
                let v = self.read_u8()?;
                self.stack.push(Value::Int(v.into()));
            }
            op::BININT2 => {
                let v = u16::from_le_bytes(self.read_array()?);
                self.stack.push(Value::Int(v.into()));
            }
            op::LONG1 => {
                let len = self.read_u8()?;
                self.push_long(len.into())?;
            }
            op::LONG4 => {
                let len = i32::from_le_bytes(self.read_array()?);
                let len = u64::try_from(len).map_err(|_| self.wrong_type("a byte count", "a negative count"))?;
                self.push_long(len)?;
            }
            op::BINFLOAT => {
                // The only big-endian number in the format.
                let v = f64::from_be_bytes(self.read_array()?);
                self.stack.push(Value::Float(v));
            }
            op::SHORT_BINUNICODE => {
                let len = self.read_u8()?;
                self.push_str(len.into())?;
            }
            op::BINUNICODE => {
                let len = self.read_u32()?;
                self.push_str(len.into())?;
            }
            op::BINUNICODE8 => {
                let len = self.read_u64()?;
                self.push_str(len)?;
            }
            op::SHORT_BINBYTES => {
                let len = self.read_u8()?;
                self.push_bytes(len.into())?;
            }
            op::BINBYTES => {
                let len = self.read_u32()?;
                self.push_bytes(len.into())?;
            }
            op::BINBYTES8 => {
                let len = self.read_u64()?;
                self.push_bytes(len)?;
            }
            op::BYTEARRAY8 => {
                let len = self.read_u64()?;
                self.push_bytes(len)?;
            }
            op::EMPTY_TUPLE => self.push_obj(Obj::Tuple(Vec::new())),
            op::TUPLE1 | op::TUPLE2 | op::TUPLE3 => {
                let count = match opcode {
                    op::TUPLE1 => 1,
                    op::TUPLE2 => 2,
                    _ => 3,
                };
                let items = self.pop_n(count)?;
                self.push_obj(Obj::Tuple(items));
            }
            op::TUPLE => {
                let items = self.pop_mark()?;
                self.push_obj(Obj::Tuple(items));
            }
            op::EMPTY_LIST => self.push_obj(Obj::List(Vec::new())),
            op::LIST => {
                let items = self.pop_mark()?;
                self.push_obj(Obj::List(items));
            }
            op::APPEND => {
                let item = self.pop()?;
                self.extend_list(vec![item])?;
            }
            op::APPENDS => {
                let items = self.pop_mark()?;
                self.extend_list(items)?;
            }
            op::EMPTY_DICT => self.push_obj(Obj::Dict(Vec::new())),
            op::DICT => {
                let items = self.pop_mark()?;
                let pairs = self.pairs(items)?;
                self.push_obj(Obj::Dict(pairs));
            }
            op::SETITEM => {
                let items = self.pop_n(2)?;
                self.extend_dict(items)?;
            }
            op::SETITEMS => {
                let items = self.pop_mark()?;
                self.extend_dict(items)?;
            }
            op::EMPTY_SET => self.push_obj(Obj::Set(Vec::new())),
            op::ADDITEMS => {
                let items = self.pop_mark()?;
                let id = self.top_obj()?;
                match &mut self.objects[id] {
                    Obj::Set(set) => set.extend(items),
                    other => {
                        let found = other.type_name();
                        return Err(self.wrong_type("a set", found));
                    }
                }
            }
            op::FROZENSET => {
                let items = self.pop_mark()?;
                self.push_obj(Obj::Set(items));
            }
            op::GLOBAL => {
                let module = self.read_line()?;
                let name = self.read_line()?;
                let global = self.allowed_global(module, name)?;
                self.stack.push(Value::Global(global));
            }
            op::STACK_GLOBAL => {
                let name = self.pop()?;
                let module = self.pop()?;
                let global = self.allowed_global(self.str_of(module)?, self.str_of(name)?)?;
                self.stack.push(Value::Global(global));
            }
            op::REDUCE => {
                let args = self.pop()?;
                let callable = self.pop()?;
                let callable = self.global_of(callable)?;
                let args = self.tuple_of(args)?;
                let result = self.call(callable, &args)?;
                self.stack.push(result);
            }
            op::NEWOBJ => {
                let _args = self.pop()?;
                let class = self.pop()?;
                self.new_object(class)?;
            }
            op::NEWOBJ_EX => {
                let _kwargs = self.pop()?;
                let _args = self.pop()?;
                let class = self.pop()?;
                self.new_object(class)?;
            }
            op::BUILD => {
                let state = self.pop()?;
                let target = self.top_obj()?;
                self.build(target, state)?;
            }
            op::MEMOIZE => {
                let top = self.peek()?;
                // CPython stores at len(memo); more than u32::MAX entries would need more opcodes than that.
                let index = u32::try_from(self.memo.len()).unwrap_or(u32::MAX);
                self.memo.insert(index, top);
            }
            op::BINPUT => {
                let index = self.read_u8()?;
                self.put(index.into())?;
            }
            op::LONG_BINPUT => {
                let index = self.read_u32()?;
                self.put(index)?;
            }
            op::BINGET => {
                let index = self.read_u8()?;
                self.get(index.into())?;
            }
            op::LONG_BINGET => {
                let index = self.read_u32()?;
                self.get(index)?;
            }
            other => {
                return Err(self.error(match op::refusal(other) {
                    Some(why) => PickleErrorKind::UnsupportedOpcode { opcode: self.opcode, why },
                    None => PickleErrorKind::UnknownOpcode(other),
                }));
            }
        }
        Ok(())
    }

    // ---- input ----

    /// Takes `len` bytes of operand, refusing before allocating anything when the file is shorter.
    fn take(&mut self, len: u64) -> Result<&'a [u8], PickleError> {
        let available = self.input.len() - self.pos;
        match usize::try_from(len) {
            Ok(n) if n <= available => {
                let bytes = &self.input[self.pos..self.pos + n];
                self.pos += n;
                Ok(bytes)
            }
            _ => Err(self.error(PickleErrorKind::Truncated { opcode: self.opcode, needed: len, available })),
        }
    }

    fn read_array<const N: usize>(&mut self) -> Result<[u8; N], PickleError> {
        let bytes = self.take(N as u64)?;
        let mut out = [0u8; N];
        out.copy_from_slice(bytes);
        Ok(out)
    }

    fn read_u8(&mut self) -> Result<u8, PickleError> {
        Ok(self.read_array::<1>()?[0])
    }

    fn read_u32(&mut self) -> Result<u32, PickleError> {
        Ok(u32::from_le_bytes(self.read_array()?))
    }

    fn read_u64(&mut self) -> Result<u64, PickleError> {
        Ok(u64::from_le_bytes(self.read_array()?))
    }

    /// A newline-terminated UTF-8 operand of GLOBAL.
    fn read_line(&mut self) -> Result<&'a str, PickleError> {
        let rest = &self.input[self.pos..];
        let Some(len) = rest.iter().position(|&b| b == b'\n') else {
            return Err(self.error(PickleErrorKind::Truncated {
                opcode: self.opcode,
                needed: rest.len() as u64 + 1,
                available: rest.len(),
            }));
        };
        self.pos += len + 1;
        std::str::from_utf8(&rest[..len]).map_err(|_| self.error(PickleErrorKind::InvalidUtf8 { opcode: self.opcode }))
    }

    // ---- stack ----

    fn push_obj(&mut self, obj: Obj<'a>) {
        let value = self.alloc(obj);
        self.stack.push(value);
    }

    fn alloc(&mut self, obj: Obj<'a>) -> Value {
        self.objects.push(obj);
        Value::Obj(self.objects.len() - 1)
    }

    /// Height below which the current opcode may not reach.
    fn floor(&self) -> usize {
        self.marks.last().copied().unwrap_or(0)
    }

    fn pop(&mut self) -> Result<Value, PickleError> {
        if self.stack.len() <= self.floor() {
            return Err(self.underflow());
        }
        self.stack.pop().ok_or_else(|| self.underflow())
    }

    fn pop_n(&mut self, n: usize) -> Result<Vec<Value>, PickleError> {
        if self.stack.len() < self.floor() + n {
            return Err(self.underflow());
        }
        Ok(self.stack.split_off(self.stack.len() - n))
    }

    fn peek(&self) -> Result<Value, PickleError> {
        match self.stack.last() {
            Some(&top) if self.stack.len() > self.floor() => Ok(top),
            _ => Err(self.underflow()),
        }
    }

    /// Pops everything above the innermost MARK, and the mark.
    fn pop_mark(&mut self) -> Result<Vec<Value>, PickleError> {
        let mark = self.marks.pop().ok_or_else(|| self.error(PickleErrorKind::MissingMark { opcode: self.opcode }))?;
        Ok(self.stack.split_off(mark))
    }

    /// The arena object on top of the stack (the target of APPENDS, SETITEMS, BUILD ...).
    fn top_obj(&self) -> Result<ObjId, PickleError> {
        match self.peek()? {
            Value::Obj(id) => Ok(id),
            other => Err(self.wrong_type("an object", self.type_name(other))),
        }
    }

    // ---- values ----

    fn type_name(&self, value: Value) -> &'static str {
        match value {
            Value::None => "None",
            Value::Bool(_) => "bool",
            Value::Int(_) => "int",
            Value::Float(_) => "float",
            Value::Global(_) => "a global",
            Value::Obj(id) => self.objects[id].type_name(),
        }
    }

    fn wrong_type(&self, expected: &'static str, found: &'static str) -> PickleError {
        self.error(PickleErrorKind::WrongType { opcode: self.opcode, expected, found })
    }

    fn str_of(&self, value: Value) -> Result<&str, PickleError> {
        match value {
            Value::Obj(id) => match &self.objects[id] {
                Obj::Str(s) => Ok(s),
                _ => Err(self.wrong_type("a str", self.type_name(value))),
            },
            _ => Err(self.wrong_type("a str", self.type_name(value))),
        }
    }

    /// A copy of the tuple's items. A memoized tuple can be read by any number of opcodes, so each copy
    /// counts against the budget.
    fn tuple_of(&mut self, value: Value) -> Result<Vec<Value>, PickleError> {
        let len = self.tuple_items(value)?.len();
        self.charge::<Value>(self.opcode, len)?;
        Ok(self.tuple_items(value)?.to_vec())
    }

    fn tuple_items(&self, value: Value) -> Result<&[Value], PickleError> {
        match value {
            Value::Obj(id) => match &self.objects[id] {
                Obj::Tuple(items) => Ok(items),
                _ => Err(self.wrong_type("a tuple", self.type_name(value))),
            },
            _ => Err(self.wrong_type("a tuple", self.type_name(value))),
        }
    }

    fn global_of(&self, value: Value) -> Result<Global, PickleError> {
        match value {
            Value::Global(global) => Ok(global),
            _ => Err(self.wrong_type("a global callable", self.type_name(value))),
        }
    }

    fn push_long(&mut self, len: u64) -> Result<(), PickleError> {
        let bytes = self.take(len)?;
        match decode_long(bytes) {
            Some(v) => self.stack.push(Value::Int(v)),
            None => self.push_obj(Obj::BigInt(bytes)),
        }
        Ok(())
    }

    fn push_str(&mut self, len: u64) -> Result<(), PickleError> {
        let bytes = self.take(len)?;
        let text =
            std::str::from_utf8(bytes).map_err(|_| self.error(PickleErrorKind::InvalidUtf8 { opcode: self.opcode }))?;
        self.push_obj(Obj::Str(Cow::Borrowed(text)));
        Ok(())
    }

    fn push_bytes(&mut self, len: u64) -> Result<(), PickleError> {
        let bytes = self.take(len)?;
        self.push_obj(Obj::Bytes(Cow::Borrowed(bytes)));
        Ok(())
    }

    fn extend_list(&mut self, items: Vec<Value>) -> Result<(), PickleError> {
        let id = self.top_obj()?;
        match &mut self.objects[id] {
            Obj::List(list) => {
                list.extend(items);
                Ok(())
            }
            other => {
                let found = other.type_name();
                Err(self.wrong_type("a list", found))
            }
        }
    }

    fn extend_dict(&mut self, items: Vec<Value>) -> Result<(), PickleError> {
        let pairs = self.pairs(items)?;
        let id = self.top_obj()?;
        match &mut self.objects[id] {
            Obj::Dict(dict) => {
                dict.extend(pairs);
                Ok(())
            }
            other => {
                let found = other.type_name();
                Err(self.wrong_type("a dict", found))
            }
        }
    }

    /// Pairs up alternating keys and values.
    fn pairs(&self, items: Vec<Value>) -> Result<Vec<(Value, Value)>, PickleError> {
        if items.len() % 2 == 1 {
            return Err(self.wrong_type("key/value pairs", "an odd count"));
        }
        Ok(items.chunks_exact(2).map(|pair| (pair[0], pair[1])).collect())
    }

    fn put(&mut self, index: u32) -> Result<(), PickleError> {
        let top = self.peek()?;
        self.memo.insert(index, top);
        Ok(())
    }

    fn get(&mut self, index: u32) -> Result<(), PickleError> {
        let value = *self
            .memo
            .get(&index)
            .ok_or_else(|| self.error(PickleErrorKind::MemoMiss { opcode: self.opcode, index }))?;
        self.stack.push(value);
        Ok(())
    }

    fn allowed_global(&self, module: &str, name: &str) -> Result<Global, PickleError> {
        Global::lookup(module, name).ok_or_else(|| {
            self.error(PickleErrorKind::ForbiddenGlobal { module: module.to_owned(), name: name.to_owned() })
        })
    }

    // ---- the allow-listed callables ----

    fn bad_args(&self, callable: Global, problem: impl Into<String>) -> PickleError {
        self.error(PickleErrorKind::BadArguments { callable: callable.name(), problem: problem.into() })
    }

    /// Checks the argument count and returns the arguments as an array.
    fn args<const N: usize>(&self, callable: Global, args: &[Value]) -> Result<[Value; N], PickleError> {
        <[Value; N]>::try_from(args)
            .map_err(|_| self.bad_args(callable, format!("{} arguments instead of {N}", args.len())))
    }

    fn call(&mut self, callable: Global, args: &[Value]) -> Result<Value, PickleError> {
        match callable {
            Global::Reconstruct => {
                let [class, _shape, _typecode] = self.args(callable, args)?;
                if !matches!(class, Value::Global(Global::NdArrayClass)) {
                    return Err(self.bad_args(
                        callable,
                        format!(
                            "{} instead of numpy.ndarray (array subclasses are not supported)",
                            self.type_name(class)
                        ),
                    ));
                }
                Ok(self.alloc(Obj::ArrayShell))
            }
            Global::DType => {
                let code = args.first().copied().ok_or_else(|| self.bad_args(callable, "no type code"))?;
                let code = self.str_of(code)?;
                let dtype = DType::from_numpy_code(code)
                    .ok_or_else(|| self.error(PickleErrorKind::UnsupportedDType(code.to_owned())))?;
                // numpy writes the byte order in the BUILD state that follows; single-byte types have none.
                Ok(self.alloc(Obj::DType(NumpyDType { dtype, big_endian: false })))
            }
            Global::Scalar => {
                let [dtype, raw] = self.args(callable, args)?;
                let dtype = self.dtype_of(callable, dtype)?;
                let array = self.array_from(callable.name(), dtype, Vec::new(), false, raw)?;
                Ok(self.alloc(Obj::Array(array)))
            }
            Global::FromBuffer => {
                let [buffer, dtype, shape, order] = self.args(callable, args)?;
                let dtype = self.dtype_of(callable, dtype)?;
                let shape = self.shape_of(callable, shape)?;
                let fortran = match self.str_of(order)? {
                    "C" => false,
                    "F" => true,
                    other => {
                        return Err(self.bad_args(callable, format!("memory order {other:?} instead of 'C' or 'F'")))
                    }
                };
                let array = self.array_from(callable.name(), dtype, shape, fortran, buffer)?;
                Ok(self.alloc(Obj::Array(array)))
            }
            Global::CodecsEncode => {
                let [text, encoding] = self.args(callable, args)?;
                let encoding = self.str_of(encoding)?;
                if encoding != "latin1" && encoding != "latin-1" {
                    return Err(self.bad_args(callable, format!("encoding {encoding:?}; only latin1 spells bytes")));
                }
                // A memoized text can be encoded any number of times; each encoding is a new copy.
                let len = self.str_of(text)?.len();
                self.charge::<u8>(callable.name(), len)?;
                let bytes = latin1_bytes(self.str_of(text)?)
                    .ok_or_else(|| self.bad_args(callable, "text with characters beyond U+00FF"))?;
                Ok(self.alloc(Obj::Bytes(Cow::Owned(bytes))))
            }
            // With arguments, bytes() would allocate or convert; only the empty form is ever pickled.
            Global::EmptyBytes => {
                let [] = self.args(callable, args)?;
                Ok(self.alloc(Obj::Bytes(Cow::Borrowed(&[]))))
            }
            // Only a bytes argument: bytearray(n) would allocate n bytes on the file's say-so.
            Global::ByteArray => {
                let [data] = self.args(callable, args)?;
                match data {
                    Value::Obj(id) if matches!(self.objects[id], Obj::Bytes(_)) => Ok(data),
                    other => Err(self.bad_args(callable, format!("a {} instead of bytes", self.type_name(other)))),
                }
            }
            Global::Set => {
                let [items] = self.args(callable, args)?;
                // A memoized list can be turned into any number of sets; each is a new copy.
                let len = self.list_items(callable, items)?.len();
                self.charge::<Value>(callable.name(), len)?;
                let items = self.list_items(callable, items)?.to_vec();
                Ok(self.alloc(Obj::Set(items)))
            }
            Global::OrderedDict => {
                let [] = self.args(callable, args)?;
                Ok(self.alloc(Obj::Dict(Vec::new())))
            }
            Global::NdArrayClass => Err(self.bad_args(callable, "a direct call (it is only _reconstruct's argument)")),
        }
    }

    fn list_items(&self, callable: Global, value: Value) -> Result<&[Value], PickleError> {
        match value {
            Value::Obj(id) => match &self.objects[id] {
                Obj::List(items) => Ok(items),
                other => Err(self.bad_args(callable, format!("a {} instead of a list", other.type_name()))),
            },
            other => Err(self.bad_args(callable, format!("a {} instead of a list", self.type_name(other)))),
        }
    }

    /// NEWOBJ / NEWOBJ_EX: `cls.__new__(cls, ...)`, which for the one container class is an empty dict.
    fn new_object(&mut self, class: Value) -> Result<(), PickleError> {
        match self.global_of(class)? {
            Global::OrderedDict => {
                self.push_obj(Obj::Dict(Vec::new()));
                Ok(())
            }
            other => Err(self.bad_args(other, format!("{}, which only builds collections.OrderedDict", self.opcode))),
        }
    }

    /// BUILD: `__setstate__` of a numpy dtype (byte order) or of a reconstructed array (shape, dtype, data).
    fn build(&mut self, target: ObjId, state: Value) -> Result<(), PickleError> {
        match self.objects[target] {
            Obj::DType(dtype) => {
                let state = self.tuple_of(state)?;
                let built = self.dtype_state(dtype, &state)?;
                self.objects[target] = Obj::DType(built);
                Ok(())
            }
            Obj::ArrayShell => {
                let state = self.tuple_of(state)?;
                // numpy writes (version, shape, dtype, is_fortran, data); very old numpy left the version out.
                let fields = if state.len() == 5 { &state[1..] } else { &state[..] };
                let [shape, dtype, fortran, data] = <[Value; 4]>::try_from(fields).map_err(|_| {
                    self.bad_args(Global::NdArrayClass, format!("a BUILD state of {} items instead of 5", state.len()))
                })?;
                let shape = self.shape_of(Global::NdArrayClass, shape)?;
                let dtype = self.dtype_of(Global::NdArrayClass, dtype)?;
                let Value::Bool(fortran) = fortran else {
                    return Err(self.wrong_type("is_fortran as a bool", self.type_name(fortran)));
                };
                let array = self.array_from(self.opcode, dtype, shape, fortran, data)?;
                self.objects[target] = Obj::Array(array);
                Ok(())
            }
            ref other => Err(self.wrong_type("a numpy dtype or array", other.type_name())),
        }
    }

    /// numpy's dtype state: (version, byteorder, subarray, names, fields, elsize, alignment, flags[, metadata]).
    fn dtype_state(&self, dtype: NumpyDType, state: &[Value]) -> Result<NumpyDType, PickleError> {
        let order =
            state.get(1).copied().ok_or_else(|| self.bad_args(Global::DType, "a BUILD state without a byte order"))?;
        let big_endian = match self.str_of(order)? {
            "<" | "|" => false,
            ">" => true,
            other => return Err(self.bad_args(Global::DType, format!("byte order {other:?}"))),
        };
        if state.iter().skip(2).take(3).any(|v| !matches!(v, Value::None)) {
            return Err(
                self.error(PickleErrorKind::UnsupportedDType(format!("{} with sub-arrays or fields", dtype.dtype)))
            );
        }
        Ok(NumpyDType { big_endian, ..dtype })
    }

    fn dtype_of(&self, callable: Global, value: Value) -> Result<NumpyDType, PickleError> {
        match value {
            Value::Obj(id) => match self.objects[id] {
                Obj::DType(dtype) => Ok(dtype),
                ref other => Err(self.bad_args(callable, format!("a {} where a dtype belongs", other.type_name()))),
            },
            other => Err(self.bad_args(callable, format!("a {} where a dtype belongs", self.type_name(other)))),
        }
    }

    fn shape_of(&mut self, callable: Global, value: Value) -> Result<Vec<usize>, PickleError> {
        self.tuple_of(value)?
            .into_iter()
            .map(|dim| match dim {
                Value::Int(n) => {
                    usize::try_from(n).map_err(|_| self.bad_args(callable, format!("negative dimension {n}")))
                }
                other => Err(self.bad_args(callable, format!("a {} as a dimension", self.type_name(other)))),
            })
            .collect()
    }

    /// An array copied out of `data`'s bytes. Arrays share nothing: each BUILD, `_frombuffer` or scalar
    /// call copies its data, so a memoized buffer named by many of them counts once per copy.
    fn array_from(
        &mut self,
        what: &'static str,
        dtype: NumpyDType,
        shape: Vec<usize>,
        fortran: bool,
        data: Value,
    ) -> Result<NdArray, PickleError> {
        let len = self.array_data(data)?.len();
        self.charge::<u8>(what, len)?;
        let layout = RawLayout { big_endian: dtype.big_endian, fortran };
        NdArray::from_raw(dtype.dtype, shape, layout, self.array_data(data)?).map_err(|e| self.error(e.into()))
    }

    fn array_data(&self, data: Value) -> Result<&[u8], PickleError> {
        match data {
            Value::Obj(id) => match &self.objects[id] {
                Obj::Bytes(bytes) => Ok(bytes),
                Obj::List(_) => Err(self.error(PickleErrorKind::NotData("an object-dtype numpy array"))),
                other => Err(self.bad_args(Global::NdArrayClass, format!("a {} as array data", other.type_name()))),
            },
            other => Err(self.bad_args(Global::NdArrayClass, format!("a {} as array data", self.type_name(other)))),
        }
    }

    // ---- arena → tree ----

    /// Converts the value STOP popped into a tree, moving each object out of the arena once and copying
    /// only objects that several places share.
    fn into_tree(self, root: Value) -> Result<PyValue, PickleError> {
        let uses = self.count_uses(root);
        let mut builder =
            TreeBuilder { at: self.at, objects: self.objects, uses, cache: HashMap::new(), budget: self.budget };
        builder.value(root, 0)
    }

    /// How many references each reachable object has (one per container slot, plus the root).
    fn count_uses(&self, root: Value) -> Vec<usize> {
        let mut uses = vec![0usize; self.objects.len()];
        let mut pending = vec![root];
        while let Some(value) = pending.pop() {
            if let Value::Obj(id) = value {
                uses[id] += 1;
                if uses[id] == 1 {
                    pending.extend(self.objects[id].children());
                }
            }
        }
        uses
    }
}

/// Builds the result tree; every object is converted once and cached until its last reference takes it.
struct TreeBuilder<'a> {
    /// Offset of STOP, the place reported for errors found while building the tree.
    at: usize,
    objects: Vec<Obj<'a>>,
    uses: Vec<usize>,
    /// Converted objects still awaiting further references, with their size in bytes.
    cache: HashMap<ObjId, (PyValue, usize)>,
    /// The machine's budget, still counting: the tree's copies add to the calls' copies.
    budget: Budget,
}

impl TreeBuilder<'_> {
    fn error(&self, kind: PickleErrorKind) -> PickleError {
        PickleError { offset: self.at, kind }
    }

    fn charge(&mut self, what: &'static str, bytes: usize) -> Result<(), PickleError> {
        self.budget.charge(what, bytes).map_err(|kind| self.error(kind))
    }

    fn value(&mut self, value: Value, depth: usize) -> Result<PyValue, PickleError> {
        Ok(match value {
            Value::None => PyValue::None,
            Value::Bool(b) => PyValue::Bool(b),
            Value::Int(i) => PyValue::Int(i),
            Value::Float(f) => PyValue::Float(f),
            Value::Global(_) => return Err(self.error(PickleErrorKind::NotData("a bare numpy/collections global"))),
            Value::Obj(id) => self.object(id, depth)?.0,
        })
    }

    /// The converted object and its size, copied unless this is its last reference.
    fn object(&mut self, id: ObjId, depth: usize) -> Result<(PyValue, usize), PickleError> {
        if depth > MAX_DEPTH {
            return Err(self.error(PickleErrorKind::TooDeep));
        }
        let converted = match self.cache.remove(&id) {
            Some(done) => done,
            None => self.convert(id, depth)?,
        };
        self.uses[id] = self.uses[id].saturating_sub(1);
        if self.uses[id] == 0 {
            return Ok(converted);
        }
        self.charge("STOP (a memoized object shared by several places)", converted.1)?;
        self.cache.insert(id, converted.clone());
        Ok(converted)
    }

    fn convert(&mut self, id: ObjId, depth: usize) -> Result<(PyValue, usize), PickleError> {
        // A container met again while its own conversion is under way contains itself: the arena slot
        // reads Taken, and the cache has no entry yet.
        let obj = std::mem::replace(&mut self.objects[id], Obj::Taken);
        const NODE: usize = 16;
        // Text and bytes still borrowed from the file are copied into the tree once; owned ones move.
        const COPY: &str = "STOP (text and bytes copied out of the file)";
        if let Obj::Str(Cow::Borrowed(text)) = &obj {
            self.charge(COPY, text.len())?;
        }
        if let Obj::Bytes(Cow::Borrowed(data)) | Obj::BigInt(data) = &obj {
            self.charge(COPY, data.len())?;
        }
        Ok(match obj {
            Obj::Str(s) => {
                let size = NODE + s.len();
                (PyValue::Str(s.into_owned()), size)
            }
            Obj::Bytes(b) => {
                let size = NODE + b.len();
                (PyValue::Bytes(b.into_owned()), size)
            }
            Obj::BigInt(b) => (PyValue::BigInt(b.to_vec()), NODE + b.len()),
            Obj::Array(a) => {
                let size = NODE + a.data.len();
                (PyValue::Array(a), size)
            }
            Obj::Tuple(items) => self.items(items, depth).map(|(v, s)| (PyValue::Tuple(v), s))?,
            Obj::List(items) => self.items(items, depth).map(|(v, s)| (PyValue::List(v), s))?,
            Obj::Set(items) => self.items(items, depth).map(|(v, s)| (PyValue::Set(v), s))?,
            Obj::Dict(pairs) => {
                let flat = pairs.into_iter().flat_map(|(k, v)| [k, v]).collect();
                let (mut flat, size) = self.items(flat, depth)?;
                let mut pairs = Vec::with_capacity(flat.len() / 2);
                while let (Some(v), Some(k)) = (flat.pop(), flat.pop()) {
                    pairs.push((k, v));
                }
                pairs.reverse();
                (PyValue::Dict(pairs), size)
            }
            Obj::DType(_) => return Err(self.error(PickleErrorKind::NotData("a numpy dtype outside an array"))),
            Obj::ArrayShell => {
                return Err(self.error(PickleErrorKind::NotData("a numpy array that was never given its data")))
            }
            Obj::Taken => return Err(self.error(PickleErrorKind::TooDeep)),
        })
    }

    fn items(&mut self, items: Vec<Value>, depth: usize) -> Result<(Vec<PyValue>, usize), PickleError> {
        let mut size: usize = 16;
        let mut out = Vec::with_capacity(items.len());
        for item in items {
            let (value, item_size) = match item {
                Value::Obj(id) => self.object(id, depth + 1)?,
                scalar => (self.value(scalar, depth + 1)?, 16),
            };
            size = size.saturating_add(item_size);
            out.push(value);
        }
        Ok((out, size))
    }
}

/// LONG1/LONG4 payload (little-endian two's complement) as an i64, or None when it does not fit.
fn decode_long(bytes: &[u8]) -> Option<i64> {
    let negative = bytes.last().is_some_and(|&b| b & 0x80 != 0);
    let fill = if negative { 0xff } else { 0x00 };
    // Bytes beyond the 8th must be pure sign extension, and the 8th's sign bit must agree with it.
    let (low, high) = bytes.split_at(bytes.len().min(8));
    if high.iter().any(|&b| b != fill) {
        return None;
    }
    let mut wide = [fill; 8];
    wide[..low.len()].copy_from_slice(low);
    let value = i64::from_le_bytes(wide);
    (value.is_negative() == negative).then_some(value)
}

/// Python's `str.encode('latin1')`: every character must be below U+0100.
fn latin1_bytes(text: &str) -> Option<Vec<u8>> {
    text.chars().map(|c| u8::try_from(u32::from(c)).ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(bytes: &[u8]) -> PickleError {
        parse(bytes).unwrap_err()
    }

    #[test]
    fn long_decoding_matches_python_int_from_bytes() {
        assert_eq!(decode_long(&[]), Some(0));
        assert_eq!(decode_long(&[0xff]), Some(-1));
        assert_eq!(decode_long(&[0x00, 0x80]), Some(-32768));
        assert_eq!(decode_long(&[0xff, 0x00]), Some(255));
        assert_eq!(decode_long(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f]), Some(i64::MAX));
        // 2**63 needs a ninth byte and does not fit.
        assert_eq!(decode_long(&[0, 0, 0, 0, 0, 0, 0, 0x80, 0x00]), None);
        assert_eq!(decode_long(&[0, 0, 0, 0, 0, 0, 0, 0x80, 0xff]), Some(i64::MIN));
        assert_eq!(decode_long(&[1, 0, 0, 0, 0, 0, 0, 0, 0, 0]), Some(1));
    }

    #[test]
    fn memoized_dict_sees_later_setitems() {
        // {'a': d, 'b': d} where d = {} is filled after being memoized and fetched again.
        let bytes =
            b"\x80\x02}q\x00(X\x01\x00\x00\x00aq\x01}q\x02X\x01\x00\x00\x00bq\x03h\x02uh\x02X\x01\x00\x00\x00kK\x07s0.";
        // Stack walk: outer dict, MARK, 'a', inner dict, 'b', inner again, SETITEMS -> outer = {a: inner, b: inner};
        // BINGET 2 pushes inner, SETITEM inner['k'] = 7, POP leaves outer for STOP.
        let inner = PyValue::Dict(vec![(PyValue::Str("k".into()), PyValue::Int(7))]);
        let expected =
            PyValue::Dict(vec![(PyValue::Str("a".into()), inner.clone()), (PyValue::Str("b".into()), inner)]);
        assert_eq!(parse(bytes).unwrap(), expected);
    }

    #[test]
    fn shared_objects_are_copied_into_every_place() {
        // l = [1]; [l, l]
        let bytes = b"\x80\x02](]q\x00K\x01ah\x00e.";
        let one = PyValue::List(vec![PyValue::Int(1)]);
        assert_eq!(parse(bytes).unwrap(), PyValue::List(vec![one.clone(), one]));
    }

    #[test]
    fn self_containing_list_is_refused() {
        // l = []; l.append(l)
        let e = err(b"\x80\x02]q\x00h\x00a.");
        assert_eq!(e.kind, PickleErrorKind::TooDeep);
    }

    #[test]
    fn exponential_sharing_hits_the_expansion_limit() {
        // x0 = 'aaaa...' (1 KiB); x(n+1) = (xn, xn) forty times: 2**40 KiB if copied naively.
        let mut bytes = b"\x80\x04".to_vec();
        bytes.push(op::BINUNICODE);
        bytes.extend_from_slice(&1024u32.to_le_bytes());
        bytes.extend(std::iter::repeat_n(b'a', 1024));
        for _ in 0..40 {
            bytes.extend_from_slice(&[op::MEMOIZE, op::DUP, op::TUPLE2]);
        }
        bytes.push(op::STOP);
        assert!(matches!(err(&bytes).kind, PickleErrorKind::OverBudget { what, .. } if what.contains("shared")));
    }

    /// A pickle that memoizes `setup`'s result, then pushes `call` `count` times into a list: the shape
    /// of every amplification attack (each call copies the memoized object again).
    fn repeated(setup: &[u8], call: &[u8], count: usize) -> Vec<u8> {
        let mut bytes = b"\x80\x02".to_vec();
        bytes.extend_from_slice(setup);
        bytes.extend_from_slice(&[op::EMPTY_LIST, op::MARK]);
        for _ in 0..count {
            bytes.extend_from_slice(call);
        }
        bytes.extend_from_slice(&[op::APPENDS, op::STOP]);
        bytes
    }

    /// Asserts the read stops at one of the repeated calls, naming `what` and the limit.
    fn assert_over_budget(bytes: &[u8], what: &str, opcode: u8) {
        let e = err(bytes);
        let PickleErrorKind::OverBudget { what: named, file_len, limit } = e.kind else { panic!("{e}") };
        assert_eq!((named, file_len), (what, bytes.len()), "{e}");
        assert_eq!(limit, bytes.len() * BUDGET_FACTOR + BUDGET_ALLOWANCE);
        assert_eq!(bytes[e.offset], opcode, "{e}");
        let message = e.to_string();
        assert!(message.contains(what) && message.contains(&format!("past {limit} bytes")), "{message}");
    }

    fn text(len: usize) -> Vec<u8> {
        let mut bytes = vec![op::BINUNICODE];
        bytes.extend_from_slice(&(len as u32).to_le_bytes());
        bytes.extend(std::iter::repeat_n(b'a', len));
        bytes
    }

    #[test]
    fn encoding_one_memoized_text_again_and_again_hits_the_budget() {
        // e = _codecs.encode; args = ('a' * 64 KiB, 'latin1'); [e(*args) for _ in range(1000)]: 64 MB of copies.
        let mut setup = b"c_codecs\nencode\nq\x00".to_vec();
        setup.extend(text(64 << 10));
        setup.extend_from_slice(b"X\x06\x00\x00\x00latin1\x86q\x01");
        let bytes = repeated(&setup, b"h\x00h\x01R", 1000);
        assert_over_budget(&bytes, "_codecs.encode", op::REDUCE);
    }

    #[test]
    fn turning_one_memoized_list_into_sets_again_and_again_hits_the_budget() {
        // l = [1] * 10000; [set(l) for _ in range(1000)]: 160 MB of copied items.
        let mut setup = b"c__builtin__\nset\nq\x00(K\x01".to_vec();
        setup.extend(std::iter::repeat_n(op::DUP, 9999));
        setup.extend_from_slice(b"l\x85q\x01");
        let bytes = repeated(&setup, b"h\x00h\x01R", 1000);
        assert_over_budget(&bytes, "builtins.set", op::REDUCE);
    }

    #[test]
    fn building_arrays_from_one_memoized_buffer_hits_the_budget() {
        // args = (b'\0' * 64 KiB, dtype('u1'), (65536,), 'C'); [_frombuffer(*args) for _ in range(1000)].
        let mut setup = b"cnumpy.core.numeric\n_frombuffer\nq\x00(B\x00\x00\x01\x00".to_vec();
        setup.extend(std::iter::repeat_n(0u8, 64 << 10));
        setup.extend_from_slice(
            b"cnumpy\ndtype\nX\x02\x00\x00\x00u1\x89\x88\x87RJ\x00\x00\x01\x00\x85X\x01\x00\x00\x00Ctq\x01",
        );
        let bytes = repeated(&setup, b"h\x00h\x01R", 1000);
        assert_over_budget(&bytes, "numpy.core.numeric._frombuffer", op::REDUCE);
        // The same buffer built into 1000 reconstructed arrays: each BUILD copies it too.
        let mut setup = b"B\x00\x00\x01\x00".to_vec();
        setup.extend(std::iter::repeat_n(0u8, 64 << 10));
        setup.extend_from_slice(b"q\x00");
        let call = b"cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\nK\x00\x85C\x01b\x87R\
            (K\x01J\x00\x00\x01\x00\x85cnumpy\ndtype\nX\x02\x00\x00\x00u1\x89\x88\x87R\x89h\x00tb";
        let bytes = repeated(&setup, call, 1000);
        assert_over_budget(&bytes, "BUILD", op::BUILD);
    }

    #[test]
    fn reading_one_memoized_tuple_again_and_again_hits_the_budget() {
        // A dtype rebuilt 10000 times from one 20000-item state tuple: nothing is kept, but each BUILD
        // reads (copies) the whole tuple, 3 GB of work for a 50 KB file.
        let mut bytes = b"\x80\x02cnumpy\ndtype\nX\x02\x00\x00\x00u1\x89\x88\x87R(NX\x01\x00\x00\x00<".to_vec();
        bytes.extend(std::iter::repeat_n(op::NONE, 20_000));
        bytes.extend_from_slice(b"tq\x000");
        for _ in 0..10_000 {
            bytes.extend_from_slice(b"h\x00b");
        }
        bytes.push(op::STOP);
        assert_over_budget(&bytes, "BUILD", op::BUILD);
    }

    #[test]
    fn pop_cannot_reach_below_a_mark() {
        let e = err(b"\x80\x02K\x01(0.");
        assert_eq!((e.offset, e.kind), (5, PickleErrorKind::StackUnderflow { opcode: "POP" }));
    }

    #[test]
    fn huge_declared_length_is_refused_before_allocating() {
        let mut bytes = b"\x80\x04\x8e".to_vec();
        bytes.extend_from_slice(&(u64::MAX - 1).to_le_bytes());
        let e = err(&bytes);
        assert_eq!(e.offset, 2);
        assert!(matches!(e.kind, PickleErrorKind::Truncated { opcode: "BINBYTES8", available: 0, .. }));
    }

    #[test]
    fn memo_miss_names_the_slot() {
        let e = err(b"\x80\x02j\x10\x27\x00\x00.");
        assert_eq!((e.offset, e.kind), (2, PickleErrorKind::MemoMiss { opcode: "LONG_BINGET", index: 10000 }));
    }

    #[test]
    fn text_protocol_opcodes_are_refused_with_a_reason() {
        let e = err(b"I42\n.");
        assert!(matches!(e.kind, PickleErrorKind::UnsupportedOpcode { opcode: "INT", .. }));
    }

    #[test]
    fn newobj_builds_an_ordered_dict_and_nothing_else() {
        let ok = b"\x80\x02ccollections\nOrderedDict\n)\x81X\x01\x00\x00\x00kK\x01s.";
        assert_eq!(parse(ok).unwrap().get("k"), Some(&PyValue::Int(1)));
        let e = err(b"\x80\x02cnumpy\ndtype\n)\x81.");
        assert!(matches!(e.kind, PickleErrorKind::BadArguments { callable: "numpy.dtype", .. }));
    }

    #[test]
    fn big_ints_are_kept_as_bytes() {
        // 2**64 as LONG1.
        let v = parse(b"\x80\x02\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x00\x01.").unwrap();
        assert_eq!(v, PyValue::BigInt(vec![0, 0, 0, 0, 0, 0, 0, 0, 1]));
    }
}
