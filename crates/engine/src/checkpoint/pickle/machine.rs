//! The stack machine: input cursor, stack, marks, memo, the object arena and the copy budget, and the
//! dispatch of every opcode that is not a call (those are in [`callables`](super::callables)).

use std::borrow::Cow;
use std::collections::HashMap;

use super::callables::{Global, NumpyDType};
use super::{op, tree, PickleError, PickleErrorKind, PyValue, BUDGET_ALLOWANCE, BUDGET_FACTOR, HIGHEST_PROTOCOL};
use crate::checkpoint::NdArray;

/// An object's index in the machine's arena.
pub(super) type ObjId = usize;

/// A stack or memo entry: small values inline, everything else a reference into the arena.
#[derive(Debug, Clone, Copy)]
pub(super) enum Value {
    None,
    Bool(bool),
    Int(i64),
    Float(f64),
    Global(Global),
    Obj(ObjId),
}

/// An arena object: memoized references keep seeing it as later opcodes mutate it.
#[derive(Debug)]
pub(super) enum Obj<'a> {
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
    pub(super) fn type_name(&self) -> &'static str {
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
}

/// The bytes a read has copied so far, against what the file's size allows.
#[derive(Debug)]
pub(super) struct Budget {
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
    pub(super) fn charge(&mut self, what: &'static str, bytes: usize) -> Result<(), PickleErrorKind> {
        self.used = self.used.saturating_add(bytes);
        if self.used > self.limit {
            return Err(PickleErrorKind::OverBudget { what, file_len: self.file_len, limit: self.limit });
        }
        Ok(())
    }
}

/// The pickle virtual machine: input cursor, stack, mark positions, memo, object arena and copy budget.
pub(super) struct Machine<'a> {
    input: &'a [u8],
    pos: usize,
    /// Offset of the opcode being executed, the place every error reports.
    at: usize,
    /// Its `pickletools` name: errors read it here, so no helper is told which opcode called it.
    pub(super) opcode: &'static str,
    stack: Vec<Value>,
    /// Stack heights at each MARK; values below the innermost mark are out of reach, as in CPython.
    marks: Vec<usize>,
    memo: HashMap<u32, Value>,
    pub(super) objects: Vec<Obj<'a>>,
    budget: Budget,
}

impl<'a> Machine<'a> {
    pub(super) fn new(input: &'a [u8]) -> Self {
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

    pub(super) fn error(&self, kind: PickleErrorKind) -> PickleError {
        PickleError { offset: self.at, kind }
    }

    fn underflow(&self) -> PickleError {
        self.error(PickleErrorKind::StackUnderflow { opcode: self.opcode })
    }

    /// Counts a copy of `count` items of `T` that `what` (the opcode or callable) is about to make.
    pub(super) fn charge<T>(&mut self, what: &'static str, count: usize) -> Result<(), PickleError> {
        let bytes = count.saturating_mul(std::mem::size_of::<T>());
        self.budget.charge(what, bytes).map_err(|kind| self.error(kind))
    }

    /// Runs opcodes until STOP and returns the value it pops.
    pub(super) fn run(&mut self) -> Result<Value, PickleError> {
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

    pub(super) fn push_obj(&mut self, obj: Obj<'a>) {
        let value = self.alloc(obj);
        self.stack.push(value);
    }

    pub(super) fn alloc(&mut self, obj: Obj<'a>) -> Value {
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

    pub(super) fn type_name(&self, value: Value) -> &'static str {
        match value {
            Value::None => "None",
            Value::Bool(_) => "bool",
            Value::Int(_) => "int",
            Value::Float(_) => "float",
            Value::Global(_) => "a global",
            Value::Obj(id) => self.objects[id].type_name(),
        }
    }

    pub(super) fn wrong_type(&self, expected: &'static str, found: &'static str) -> PickleError {
        self.error(PickleErrorKind::WrongType { opcode: self.opcode, expected, found })
    }

    pub(super) fn str_of(&self, value: Value) -> Result<&str, PickleError> {
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
    pub(super) fn tuple_of(&mut self, value: Value) -> Result<Vec<Value>, PickleError> {
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

    pub(super) fn global_of(&self, value: Value) -> Result<Global, PickleError> {
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

    /// Converts the value STOP popped into a tree.
    pub(super) fn into_tree(self, root: Value) -> Result<PyValue, PickleError> {
        tree::build(root, self.objects, self.budget, self.at)
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

#[cfg(test)]
mod tests {
    use super::decode_long;

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
}
