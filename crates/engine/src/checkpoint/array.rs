//! The engine's array type: numpy arrays normalised to C order and little-endian elements, so that every
//! consumer reads `data` the same way whatever byte order or memory layout the saving machine used.

use half::{bf16, f16};

/// Element type of an array read from a checkpoint (the numpy dtypes the engine understands).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    F16,
    /// bfloat16 (float32's top 16 bits), as Needle 3 checkpoints are released; only safetensors
    /// stores it (numpy has no such type).
    BF16,
    F32,
    F64,
    I8,
    I16,
    I32,
    I64,
    U8,
    U16,
    U32,
    U64,
    Bool,
}

impl DType {
    /// Bytes per element.
    pub fn itemsize(self) -> usize {
        match self {
            DType::I8 | DType::U8 | DType::Bool => 1,
            DType::F16 | DType::BF16 | DType::I16 | DType::U16 => 2,
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F64 | DType::I64 | DType::U64 => 8,
        }
    }

    /// The numpy name (`float32`, `uint8`, `bool`), used in messages and fixtures.
    pub fn name(self) -> &'static str {
        match self {
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
            DType::F32 => "float32",
            DType::F64 => "float64",
            DType::I8 => "int8",
            DType::I16 => "int16",
            DType::I32 => "int32",
            DType::I64 => "int64",
            DType::U8 => "uint8",
            DType::U16 => "uint16",
            DType::U32 => "uint32",
            DType::U64 => "uint64",
            DType::Bool => "bool",
        }
    }

    /// Parses the type code numpy pickles as the first argument of `numpy.dtype` (`'f4'`, `'b1'`, ...).
    pub fn from_numpy_code(code: &str) -> Option<DType> {
        Some(match code {
            "f2" => DType::F16,
            "f4" => DType::F32,
            "f8" => DType::F64,
            "i1" => DType::I8,
            "i2" => DType::I16,
            "i4" => DType::I32,
            "i8" => DType::I64,
            "u1" => DType::U8,
            "u2" => DType::U16,
            "u4" => DType::U32,
            "u8" => DType::U64,
            "b1" => DType::Bool,
            _ => return None,
        })
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// How the elements of a pickled buffer are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawLayout {
    pub big_endian: bool,
    /// Fortran (column-major) element order instead of C (row-major).
    pub fortran: bool,
}

/// Why a pickled buffer cannot be an array of the declared shape.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArrayError {
    #[error("shape {shape:?} of {dtype} has more elements than this machine can address")]
    ShapeOverflow { shape: Vec<usize>, dtype: DType },
    #[error(
        "shape {shape:?} of {dtype} needs {expected} bytes of data but the pickle holds {found}; \
         the array data is damaged or does not belong to this shape"
    )]
    DataLength { shape: Vec<usize>, dtype: DType, expected: usize, found: usize },
}

/// A numpy array as read from a pickle: C-order, little-endian elements.
#[derive(Debug, Clone, PartialEq)]
pub struct NdArray {
    pub dtype: DType,
    pub shape: Vec<usize>,
    /// Raw little-endian element bytes in C order.
    pub data: Vec<u8>,
}

impl NdArray {
    /// Builds an array from numpy's raw buffer, checking its length against the shape and normalising
    /// the byte order and memory order.
    pub fn from_raw(dtype: DType, shape: Vec<usize>, layout: RawLayout, raw: &[u8]) -> Result<Self, ArrayError> {
        let expected = shape
            .iter()
            .try_fold(dtype.itemsize(), |bytes, &dim| bytes.checked_mul(dim))
            .ok_or_else(|| ArrayError::ShapeOverflow { shape: shape.clone(), dtype })?;
        if raw.len() != expected {
            return Err(ArrayError::DataLength { shape, dtype, expected, found: raw.len() });
        }
        let mut data = if layout.fortran && shape.len() > 1 {
            fortran_to_c_order(raw, &shape, dtype.itemsize())
        } else {
            raw.to_vec()
        };
        if layout.big_endian && dtype.itemsize() > 1 {
            data.chunks_exact_mut(dtype.itemsize()).for_each(<[u8]>::reverse);
        }
        Ok(NdArray { dtype, shape, data })
    }

    /// A float32 array of `values` (row-major, as many as `shape` holds).
    pub fn from_f32(shape: Vec<usize>, values: &[f32]) -> Self {
        NdArray { dtype: DType::F32, shape, data: values.iter().flat_map(|v| v.to_le_bytes()).collect() }
    }

    /// Number of elements (1 for a 0-d array).
    pub fn len(&self) -> usize {
        self.data.len() / self.dtype.itemsize()
    }

    /// True when the array has no elements (some dimension is 0).
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// The first value that is NaN or infinite, as its place ([`unravel`]) and value; an integer
    /// or bool array has none.
    pub fn first_non_finite(&self) -> Option<(Vec<usize>, f64)> {
        fn first<const N: usize>(data: &[u8], value: impl Fn([u8; N]) -> f64) -> Option<(usize, f64)> {
            data.chunks_exact(N)
                .map(|bytes| value(bytes.try_into().expect("chunks_exact yields N bytes")))
                .enumerate()
                .find(|(_, v)| !v.is_finite())
        }
        let found = match self.dtype {
            DType::F16 => first(&self.data, |b| f64::from(f16::from_le_bytes(b))),
            DType::BF16 => first(&self.data, |b| f64::from(bf16::from_le_bytes(b))),
            DType::F32 => first(&self.data, |b| f64::from(f32::from_le_bytes(b))),
            DType::F64 => first(&self.data, f64::from_le_bytes),
            DType::I8
            | DType::I16
            | DType::I32
            | DType::I64
            | DType::U8
            | DType::U16
            | DType::U32
            | DType::U64
            | DType::Bool => None,
        };
        found.map(|(flat, value)| (unravel(&self.shape, flat), value))
    }

    /// The elements converted to f32 (float16 and bfloat16 widened exactly; wider types rounded as
    /// `as f32` does).
    pub fn to_f32(&self) -> Vec<f32> {
        // One match per array, not per element: the per-dtype loops below compile to tight conversions,
        // which matters for the ~100M-element checkpoints `needle build` and training read.
        let data = &self.data;
        match self.dtype {
            DType::F16 => convert(data, |b| f16::from_le_bytes(b).to_f32()),
            DType::BF16 => convert(data, |b| bf16::from_le_bytes(b).to_f32()),
            DType::F32 => convert(data, f32::from_le_bytes),
            DType::F64 => convert(data, |b| f64::from_le_bytes(b) as f32),
            DType::I8 => convert(data, |[b]: [u8; 1]| b as i8 as f32),
            DType::I16 => convert(data, |b| i16::from_le_bytes(b) as f32),
            DType::I32 => convert(data, |b| i32::from_le_bytes(b) as f32),
            DType::I64 => convert(data, |b| i64::from_le_bytes(b) as f32),
            DType::U8 => convert(data, |[b]: [u8; 1]| f32::from(b)),
            DType::U16 => convert(data, |b| f32::from(u16::from_le_bytes(b))),
            DType::U32 => convert(data, |b| u32::from_le_bytes(b) as f32),
            DType::U64 => convert(data, |b| u64::from_le_bytes(b) as f32),
            DType::Bool => convert(data, |[b]: [u8; 1]| f32::from(u8::from(b != 0))),
        }
    }
}

/// Converts little-endian elements of `N` bytes each; `data.len()` is a multiple of `N` (checked when the
/// array was built).
/// The place of flat (row-major) index `flat` in an array of `shape`: `[layer, row, column]`.
pub fn unravel(shape: &[usize], mut flat: usize) -> Vec<usize> {
    let mut place = vec![0; shape.len()];
    for (axis, &dim) in shape.iter().enumerate().rev() {
        if dim > 0 {
            place[axis] = flat % dim;
            flat /= dim;
        }
    }
    place
}

fn convert<const N: usize>(data: &[u8], element: impl Fn([u8; N]) -> f32) -> Vec<f32> {
    data.chunks_exact(N).map(|bytes| element(bytes.try_into().expect("chunks_exact yields N bytes"))).collect()
}

/// Reorders column-major elements into row-major ones. In Fortran order the first index varies fastest,
/// so walking the C-order index and advancing a Fortran offset with per-axis strides visits each element once.
fn fortran_to_c_order(raw: &[u8], shape: &[usize], itemsize: usize) -> Vec<u8> {
    let mut fortran_strides = Vec::with_capacity(shape.len());
    let mut stride = itemsize;
    for &dim in shape {
        fortran_strides.push(stride);
        stride *= dim;
    }
    let mut out = Vec::with_capacity(raw.len());
    let mut index = vec![0usize; shape.len()];
    let mut offset = 0usize;
    for _ in 0..raw.len() / itemsize {
        out.extend_from_slice(&raw[offset..offset + itemsize]);
        // Odometer increment over the C-order index, last axis fastest.
        for axis in (0..shape.len()).rev() {
            index[axis] += 1;
            offset += fortran_strides[axis];
            if index[axis] < shape[axis] {
                break;
            }
            offset -= fortran_strides[axis] * shape[axis];
            index[axis] = 0;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const C_LE: RawLayout = RawLayout { big_endian: false, fortran: false };

    #[test]
    fn fortran_buffer_is_reordered_to_c() {
        // numpy: np.arange(6, dtype='u1').reshape(2, 3) in Fortran order is bytes 0 3 1 4 2 5.
        let a = NdArray::from_raw(
            DType::U8,
            vec![2, 3],
            RawLayout { big_endian: false, fortran: true },
            &[0, 3, 1, 4, 2, 5],
        )
        .unwrap();
        assert_eq!(a.data, vec![0, 1, 2, 3, 4, 5]);
    }

    #[test]
    fn fortran_three_axes_matches_numpy_transpose() {
        // Element (i, j, k) of shape (2, 3, 2) has value 100i + 10j + k; Fortran puts i fastest, then j, then k.
        let shape = [2usize, 3, 2];
        let mut fortran = Vec::new();
        for k in 0..2u8 {
            for j in 0..3u8 {
                for i in 0..2u8 {
                    fortran.push(100 * i + 10 * j + k);
                }
            }
        }
        let a = NdArray::from_raw(DType::U8, shape.to_vec(), RawLayout { big_endian: false, fortran: true }, &fortran)
            .unwrap();
        let c: Vec<u8> =
            (0..2u8).flat_map(|i| (0..3u8).flat_map(move |j| (0..2u8).map(move |k| 100 * i + 10 * j + k))).collect();
        assert_eq!(a.data, c);
    }

    #[test]
    fn big_endian_elements_are_swapped() {
        let a = NdArray::from_raw(
            DType::F32,
            vec![1],
            RawLayout { big_endian: true, fortran: false },
            &1.5f32.to_be_bytes(),
        )
        .unwrap();
        assert_eq!(a.to_f32(), vec![1.5]);
    }

    #[test]
    fn data_length_must_match_shape() {
        let err = NdArray::from_raw(DType::F32, vec![2, 2], C_LE, &[0; 12]).unwrap_err();
        assert_eq!(err, ArrayError::DataLength { shape: vec![2, 2], dtype: DType::F32, expected: 16, found: 12 });
    }

    #[test]
    fn overflowing_shape_is_an_error_not_a_panic() {
        let err = NdArray::from_raw(DType::F64, vec![usize::MAX, 2], C_LE, &[]).unwrap_err();
        assert!(matches!(err, ArrayError::ShapeOverflow { .. }));
    }

    #[test]
    fn to_f32_widens_every_dtype() {
        let half_max = NdArray::from_raw(DType::F16, vec![1], C_LE, &f16::MAX.to_le_bytes()).unwrap();
        assert_eq!(half_max.to_f32(), vec![65504.0]);
        let ints = NdArray::from_raw(DType::I16, vec![2], C_LE, &[0xff, 0xff, 0x02, 0x00]).unwrap();
        assert_eq!(ints.to_f32(), vec![-1.0, 2.0]);
        let big = NdArray::from_raw(DType::U64, vec![1], C_LE, &u64::MAX.to_le_bytes()).unwrap();
        assert_eq!(big.to_f32(), vec![u64::MAX as f32]);
        let flags = NdArray::from_raw(DType::Bool, vec![2], C_LE, &[1, 0]).unwrap();
        assert_eq!(flags.to_f32(), vec![1.0, 0.0]);
        let scalar = NdArray::from_raw(DType::F64, vec![], C_LE, &0.25f64.to_le_bytes()).unwrap();
        assert_eq!((scalar.len(), scalar.to_f32()), (1, vec![0.25]));
    }
}
