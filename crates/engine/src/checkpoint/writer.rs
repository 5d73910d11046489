//! The one pickle this project writes: a LoRA adapter in the reference's layout,
//! `{"lora": {path: {"A": ndarray, "B": ndarray}}, "scale": float, "base": str, "rank": int}`.
//!
//! Protocol 3, arrays spelled the way numpy 2 reduces them (`_reconstruct` then a BUILD with
//! version, shape, dtype, order and the raw bytes), so both Python's `pickle.load` and this crate's
//! reader accept it. Only the opcodes needed for that shape are emitted.

use super::pickle::op;
use super::{DType, NdArray, PickledAdapter};

/// The pickle bytes of `adapter`.
pub fn adapter_pickle(adapter: &PickledAdapter) -> Vec<u8> {
    let mut p = Pickler::default();
    p.out.extend([op::PROTO, 3]);
    p.out.extend([op::EMPTY_DICT, op::MARK]);
    p.string("lora");
    p.out.extend([op::EMPTY_DICT, op::MARK]);
    for (path, factors) in &adapter.lora {
        p.string(path);
        p.out.extend([op::EMPTY_DICT, op::MARK]);
        p.string("A");
        p.array(&factors.a);
        p.string("B");
        p.array(&factors.b);
        p.out.push(op::SETITEMS);
    }
    p.out.push(op::SETITEMS);
    p.string("scale");
    p.out.push(op::BINFLOAT);
    p.out.extend(adapter.scale.to_be_bytes());
    p.string("base");
    p.string(&adapter.base);
    p.string("rank");
    p.int(adapter.rank as i64);
    p.out.extend([op::SETITEMS, op::STOP]);
    p.out
}

#[derive(Default)]
struct Pickler {
    out: Vec<u8>,
}

impl Pickler {
    fn string(&mut self, text: &str) {
        self.out.push(op::BINUNICODE);
        self.length_u32(text.len());
        self.out.extend(text.as_bytes());
    }

    fn length_u32(&mut self, len: usize) {
        // Callers only pass lengths below 4 GiB (strings); arrays use `bytes`, which falls back to BINBYTES8.
        self.out.extend(u32::try_from(len).unwrap_or(u32::MAX).to_le_bytes());
    }

    fn int(&mut self, value: i64) {
        match i32::try_from(value) {
            Ok(small) => {
                self.out.push(op::BININT);
                self.out.extend(small.to_le_bytes());
            }
            Err(_) => {
                self.out.extend([op::LONG1, 8]);
                self.out.extend(value.to_le_bytes());
            }
        }
    }

    fn bytes(&mut self, data: &[u8]) {
        match u32::try_from(data.len()) {
            Ok(len) => {
                self.out.push(op::BINBYTES);
                self.out.extend(len.to_le_bytes());
            }
            Err(_) => {
                self.out.push(op::BINBYTES8);
                self.out.extend((data.len() as u64).to_le_bytes());
            }
        }
        self.out.extend(data);
    }

    fn global(&mut self, module: &str, name: &str) {
        self.out.push(op::GLOBAL);
        self.out.extend(format!("{module}\n{name}\n").as_bytes());
    }

    /// `_reconstruct(ndarray, (0,), b'b')` then BUILD `(1, shape, dtype, False, data)`.
    fn array(&mut self, array: &NdArray) {
        // numpy has no bfloat16: such an array goes in widened to float32, which is exact.
        let Some(code) = numpy_code(array.dtype) else {
            return self.array(&NdArray::from_f32(array.shape.clone(), &array.to_f32()));
        };
        self.global("numpy._core.multiarray", "_reconstruct");
        self.global("numpy", "ndarray");
        self.int(0);
        self.out.push(op::TUPLE1);
        self.bytes(b"b");
        self.out.extend([op::TUPLE3, op::REDUCE, op::MARK]);
        self.int(1);
        self.out.push(op::MARK);
        for &dim in &array.shape {
            self.int(dim as i64);
        }
        self.out.push(op::TUPLE);
        self.dtype(code, array.dtype.itemsize());
        self.out.push(op::NEWFALSE);
        self.bytes(&array.data);
        self.out.extend([op::TUPLE, op::BUILD]);
    }

    /// `numpy.dtype(code, False, True)` with the little-endian state BUILD numpy writes.
    fn dtype(&mut self, code: &str, itemsize: usize) {
        self.global("numpy", "dtype");
        self.string(code);
        self.out.extend([op::NEWFALSE, op::NEWTRUE, op::TUPLE3, op::REDUCE, op::MARK]);
        self.int(3);
        self.string(if itemsize > 1 { "<" } else { "|" });
        self.out.extend([op::NONE, op::NONE, op::NONE]);
        self.int(-1);
        self.int(-1);
        self.int(0);
        self.out.extend([op::TUPLE, op::BUILD]);
    }
}

/// The type code `numpy.dtype` is called with (the inverse of [`DType::from_numpy_code`]); None
/// for bfloat16, which numpy lacks.
fn numpy_code(dtype: DType) -> Option<&'static str> {
    Some(match dtype {
        DType::BF16 => return None,
        DType::F16 => "f2",
        DType::F32 => "f4",
        DType::F64 => "f8",
        DType::I8 => "i1",
        DType::I16 => "i2",
        DType::I32 => "i4",
        DType::I64 => "i8",
        DType::U8 => "u1",
        DType::U16 => "u2",
        DType::U32 => "u4",
        DType::U64 => "u8",
        DType::Bool => "b1",
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::path::PathBuf;

    use super::*;
    use crate::checkpoint::{LoraFactors, RawLayout};

    #[test]
    fn the_reader_gets_back_what_was_written() {
        let c_order = RawLayout { big_endian: false, fortran: false };
        let values: Vec<u8> = (0..24u8).collect();
        let a = NdArray::from_raw(DType::F32, vec![1, 3, 2], c_order, &values).unwrap();
        let b = NdArray::from_raw(DType::F32, vec![1, 2, 3], c_order, &values).unwrap();
        let adapter = PickledAdapter {
            source: PathBuf::new(),
            lora: BTreeMap::from([("stack/layers/block/self_attn/q_proj/kernel".to_string(), LoraFactors { a, b })]),
            scale: 2.5,
            base: "models/base.pkl".into(),
            rank: 2,
        };
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), adapter_pickle(&adapter)).unwrap();
        let back = PickledAdapter::load(file.path()).unwrap();
        assert_eq!(back.lora, adapter.lora);
        assert_eq!((back.scale, back.base.as_str(), back.rank), (2.5, "models/base.pkl", 2));
    }
}
