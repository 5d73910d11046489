//! The allow-listed callables, interpreted and never imported: what REDUCE, NEWOBJ and BUILD do with
//! numpy's array, dtype and scalar constructors (arrays rebuilt from `_reconstruct` plus BUILD state or
//! from `_frombuffer`), `_codecs.encode`, and the builtins protocols 2–4 spell bytes, sets and
//! `OrderedDict`s with.

use std::borrow::Cow;

use super::machine::{Machine, Obj, ObjId, Value};
use super::{PickleError, PickleErrorKind};
use crate::checkpoint::array::{DType, NdArray, RawLayout};

/// The callables a pickle may name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Global {
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

/// A numpy dtype object: its element type and the byte order its BUILD state gave it.
#[derive(Debug, Clone, Copy)]
pub(super) struct NumpyDType {
    dtype: DType,
    big_endian: bool,
}

impl<'a> Machine<'a> {
    pub(super) fn allowed_global(&self, module: &str, name: &str) -> Result<Global, PickleError> {
        Global::lookup(module, name).ok_or_else(|| {
            self.error(PickleErrorKind::ForbiddenGlobal { module: module.to_owned(), name: name.to_owned() })
        })
    }

    fn bad_args(&self, callable: Global, problem: impl Into<String>) -> PickleError {
        self.error(PickleErrorKind::BadArguments { callable: callable.name(), problem: problem.into() })
    }

    /// Checks the argument count and returns the arguments as an array.
    fn args<const N: usize>(&self, callable: Global, args: &[Value]) -> Result<[Value; N], PickleError> {
        <[Value; N]>::try_from(args)
            .map_err(|_| self.bad_args(callable, format!("{} arguments instead of {N}", args.len())))
    }

    pub(super) fn call(&mut self, callable: Global, args: &[Value]) -> Result<Value, PickleError> {
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
    pub(super) fn new_object(&mut self, class: Value) -> Result<(), PickleError> {
        match self.global_of(class)? {
            Global::OrderedDict => {
                self.push_obj(Obj::Dict(Vec::new()));
                Ok(())
            }
            other => Err(self.bad_args(other, format!("{}, which only builds collections.OrderedDict", self.opcode))),
        }
    }

    /// BUILD: `__setstate__` of a numpy dtype (byte order) or of a reconstructed array (shape, dtype, data).
    pub(super) fn build(&mut self, target: ObjId, state: Value) -> Result<(), PickleError> {
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

    /// An array copied out of `data`'s bytes, the copy charged to `what` (the callable, or BUILD). Arrays
    /// share nothing: each BUILD, `_frombuffer` or scalar call copies its data, so a memoized buffer named
    /// by many of them counts once per copy.
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
}

/// Python's `str.encode('latin1')`: every character must be below U+0100.
fn latin1_bytes(text: &str) -> Option<Vec<u8>> {
    text.chars().map(|c| u8::try_from(u32::from(c)).ok()).collect()
}
