//! The `.cact` container, written down once for the writer and the reader: the header's fields in
//! file order, the bytes of a directory record, and where blobs start.
//!
//! What the tensors are and in which order is the generation's ([`super::needle2`]); what is here
//! is the frame around them.

use serde::Serialize;

use super::quant::{Bits, GROUP};
use super::reader::{FormatError, RecordProblem};
use crate::config::Generation;

/// First u32 of every Needle 2 `.cact`.
pub const TAG: u32 = 0x05E1_2A83;
/// First u32 of a Needle 3 `.cact` (format v3), recognised so that it is named, not called foreign.
pub const TAG_V3: u32 = 0x05E1_2A84;
/// Every blob starts on a multiple of this.
pub const ALIGN: usize = 64;
/// Header size: the tag, 28 u32 fields and the f32 `rope_theta`.
pub const HEADER_LEN: usize = 30 * 4;
/// One directory record.
pub const RECORD_LEN: usize = 44;
/// Most dimensions a directory record can describe.
pub const MAX_NDIM: usize = 4;
/// Slots the header gives each of its lists (engram orders, engram sites).
pub const LIST_SLOTS: usize = 4;

/// Rounds a byte position up to the next blob boundary.
pub fn align_up(pos: usize) -> usize {
    pos.div_ceil(ALIGN) * ALIGN
}

/// Storage of one tensor, as the directory's `dtype` (and, for CQ, `group`/`bits`) fields record it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorKind {
    Fp16,
    Fp32,
    Cq(Bits),
    Raw,
}

impl TensorKind {
    /// The directory's dtype code.
    pub fn code(self) -> u8 {
        match self {
            TensorKind::Fp16 => 1,
            TensorKind::Fp32 => 2,
            TensorKind::Cq(_) => 3,
            TensorKind::Raw => 4,
        }
    }

    /// Short label for tables and size-by-kind summaries.
    pub fn label(self) -> &'static str {
        match self {
            TensorKind::Fp16 => "FP16",
            TensorKind::Fp32 => "FP32",
            TensorKind::Cq(_) => "CQ",
            TensorKind::Raw => "RAW",
        }
    }

    /// The record's `group` and `bits` fields (zero for all but CQ).
    fn group_and_bits(self) -> (u32, u32) {
        match self {
            TensorKind::Cq(bits) => (GROUP as u32, bits.record_bits()),
            _ => (0, 0),
        }
    }

    /// The kind a record's dtype code, group and bits describe.
    fn from_record(code: u8, group: u32, bits: u32) -> Result<Self, RecordProblem> {
        match code {
            1 => Ok(TensorKind::Fp16),
            2 => Ok(TensorKind::Fp32),
            3 => match Bits::from_record_bits(bits) {
                Some(b) if group as usize == GROUP => Ok(TensorKind::Cq(b)),
                _ => Err(RecordProblem::CqParams { group, bits }),
            },
            4 => Ok(TensorKind::Raw),
            other => Err(RecordProblem::DType(other)),
        }
    }
}

/// The geometry a `.cact` header carries.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Header {
    pub num_tensors: u32,
    pub codebook_len: u32,
    pub kv_window: u32,
    pub kv_bits: u32,
    pub vocab_size: u32,
    pub d_model: u32,
    pub num_heads: u32,
    pub num_kv_heads: u32,
    pub num_layers: u32,
    pub head_dim: u32,
    pub max_seq_len: u32,
    pub hada_n: u32,
    pub mhc_lanes: u32,
    pub engram_slots: u32,
    pub engram_sub_dim: u32,
    pub num_engram_tables: u32,
    pub engram_conv_taps: u32,
    pub engram_conv_dilation: u32,
    pub engram_orders: Vec<u32>,
    pub engram_layers: Vec<u32>,
    pub rope_theta: f32,
}

/// One stretch of the header after the tag.
enum Field {
    Word(fn(&mut Header) -> &mut u32),
    /// A count, then [`LIST_SLOTS`] slots, the unused ones zero; named by its count field.
    List(&'static str, fn(&mut Header) -> &mut Vec<u32>),
    Float(fn(&mut Header) -> &mut f32),
}

/// The header after the tag, in file order: the one statement of it that encoding and parsing share.
const FIELDS: [Field; 21] = [
    Field::Word(|h| &mut h.num_tensors),
    Field::Word(|h| &mut h.codebook_len),
    Field::Word(|h| &mut h.kv_window),
    Field::Word(|h| &mut h.kv_bits),
    Field::Word(|h| &mut h.vocab_size),
    Field::Word(|h| &mut h.d_model),
    Field::Word(|h| &mut h.num_heads),
    Field::Word(|h| &mut h.num_kv_heads),
    Field::Word(|h| &mut h.num_layers),
    Field::Word(|h| &mut h.head_dim),
    Field::Word(|h| &mut h.max_seq_len),
    Field::Word(|h| &mut h.hada_n),
    Field::Word(|h| &mut h.mhc_lanes),
    Field::Word(|h| &mut h.engram_slots),
    Field::Word(|h| &mut h.engram_sub_dim),
    Field::Word(|h| &mut h.num_engram_tables),
    Field::Word(|h| &mut h.engram_conv_taps),
    Field::Word(|h| &mut h.engram_conv_dilation),
    Field::List("num_engram_orders", |h| &mut h.engram_orders),
    Field::List("num_engram_sites", |h| &mut h.engram_layers),
    Field::Float(|h| &mut h.rope_theta),
];

impl Header {
    /// The header's bytes, tag first. A list longer than its slots is refused.
    pub fn to_bytes(&self) -> Result<Vec<u8>, FormatError> {
        let mut header = self.clone();
        let mut words = vec![TAG];
        for field in &FIELDS {
            match field {
                Field::Word(at) => words.push(*at(&mut header)),
                Field::List(name, at) => {
                    let list = at(&mut header);
                    if list.len() > LIST_SLOTS {
                        return Err(FormatError::HeaderList { field: name, count: list.len() as u32 });
                    }
                    words.push(list.len() as u32);
                    words.extend((0..LIST_SLOTS).map(|i| list.get(i).copied().unwrap_or(0)));
                }
                Field::Float(at) => words.push(at(&mut header).to_bits()),
            }
        }
        debug_assert_eq!(words.len() * 4, HEADER_LEN);
        Ok(words.iter().flat_map(|w| w.to_le_bytes()).collect())
    }

    /// Reads the header from the start of `bytes` (at least [`HEADER_LEN`] long), checking the tag.
    pub fn parse(bytes: &[u8; HEADER_LEN]) -> Result<Self, FormatError> {
        let mut words = bytes.chunks_exact(4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
        let mut next = || words.next().unwrap_or(0);
        match next() {
            TAG => {}
            TAG_V3 => return Err(FormatError::Generation(Generation::Needle3)),
            found => return Err(FormatError::BadTag { found }),
        }
        let mut header = Header::default();
        for field in &FIELDS {
            match field {
                Field::Word(at) => *at(&mut header) = next(),
                Field::List(name, at) => {
                    let count = next();
                    let slots: Vec<u32> = (0..LIST_SLOTS).map(|_| next()).collect();
                    if count as usize > LIST_SLOTS {
                        return Err(FormatError::HeaderList { field: name, count });
                    }
                    *at(&mut header) = slots[..count as usize].to_vec();
                }
                Field::Float(at) => *at(&mut header) = f32::from_bits(next()),
            }
        }
        Ok(header)
    }
}

/// One directory entry, with the name its position implies (the file itself is nameless).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Record {
    pub name: String,
    #[serde(serialize_with = "serialize_kind")]
    pub kind: TensorKind,
    pub shape: Vec<u32>,
    pub offset: u64,
    pub nbytes: u64,
}

fn serialize_kind<S: serde::Serializer>(kind: &TensorKind, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(kind.label())
}

// Byte positions in a record: `u8 dtype, u8 ndim, u16 pad, u32 shape[4], u64 offset, u64 nbytes,
// u32 group, u32 bits`.
const SHAPE_AT: usize = 4;
const OFFSET_AT: usize = 20;
const NBYTES_AT: usize = 28;
const GROUP_AT: usize = 36;
const BITS_AT: usize = 40;

impl Record {
    /// Record bits as the directory stores them (`None` for non-CQ tensors).
    pub fn bits(&self) -> Option<Bits> {
        match self.kind {
            TensorKind::Cq(b) => Some(b),
            _ => None,
        }
    }

    /// The element count; `None` when it overflows a u64.
    pub fn elements(&self) -> Option<u64> {
        self.shape.iter().try_fold(1u64, |acc, &d| acc.checked_mul(u64::from(d)))
    }

    /// The record's bytes. A shape of more than [`MAX_NDIM`] dimensions is refused.
    pub fn to_bytes(&self) -> Result<[u8; RECORD_LEN], RecordProblem> {
        let ndim = u8::try_from(self.shape.len()).unwrap_or(u8::MAX);
        if usize::from(ndim) > MAX_NDIM {
            return Err(RecordProblem::Ndim(ndim));
        }
        let (group, bits) = self.kind.group_and_bits();
        let mut rec = [0u8; RECORD_LEN];
        rec[0] = self.kind.code();
        rec[1] = ndim;
        for (i, &dim) in self.shape.iter().enumerate() {
            rec[SHAPE_AT + 4 * i..SHAPE_AT + 4 * i + 4].copy_from_slice(&dim.to_le_bytes());
        }
        rec[OFFSET_AT..OFFSET_AT + 8].copy_from_slice(&self.offset.to_le_bytes());
        rec[NBYTES_AT..NBYTES_AT + 8].copy_from_slice(&self.nbytes.to_le_bytes());
        rec[GROUP_AT..GROUP_AT + 4].copy_from_slice(&group.to_le_bytes());
        rec[BITS_AT..BITS_AT + 4].copy_from_slice(&bits.to_le_bytes());
        Ok(rec)
    }

    /// The record `rec` describes, unnamed; where its blob lies is for the caller to check.
    pub fn parse(rec: &[u8; RECORD_LEN]) -> Result<Self, RecordProblem> {
        let u32_at = |i: usize| u32::from_le_bytes([rec[i], rec[i + 1], rec[i + 2], rec[i + 3]]);
        let u64_at = |i: usize| u64::from(u32_at(i)) | (u64::from(u32_at(i + 4)) << 32);
        let ndim = rec[1];
        if usize::from(ndim) > MAX_NDIM {
            return Err(RecordProblem::Ndim(ndim));
        }
        let kind = TensorKind::from_record(rec[0], u32_at(GROUP_AT), u32_at(BITS_AT))?;
        Ok(Record {
            name: String::new(),
            kind,
            shape: (0..usize::from(ndim)).map(|i| u32_at(SHAPE_AT + 4 * i)).collect(),
            offset: u64_at(OFFSET_AT),
            nbytes: u64_at(NBYTES_AT),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_reads_back_as_written() {
        let header = Header {
            num_tensors: 57,
            codebook_len: 28,
            kv_window: 480,
            kv_bits: 8,
            vocab_size: 8192,
            d_model: 768,
            num_heads: 12,
            num_kv_heads: 6,
            num_layers: 27,
            head_dim: 64,
            max_seq_len: 1024,
            hada_n: 1024,
            mhc_lanes: 4,
            engram_slots: 4096,
            engram_sub_dim: 128,
            num_engram_tables: 6,
            engram_conv_taps: 4,
            engram_conv_dilation: 3,
            engram_orders: vec![2, 3],
            engram_layers: vec![1, 5, 9],
            rope_theta: 1.0e5,
        };
        let bytes: [u8; HEADER_LEN] = header.to_bytes().unwrap().try_into().unwrap();
        assert_eq!(Header::parse(&bytes).unwrap(), header);
        let five = Header { engram_layers: vec![0; 5], ..header };
        assert_eq!(five.to_bytes().unwrap_err(), FormatError::HeaderList { field: "num_engram_sites", count: 5 });
    }

    #[test]
    fn a_record_reads_back_as_written() {
        for kind in [TensorKind::Fp16, TensorKind::Fp32, TensorKind::Cq(Bits::Three), TensorKind::Raw] {
            let record = Record { name: String::new(), kind, shape: vec![3, 1 << 20], offset: 1 << 40, nbytes: 12_345 };
            assert_eq!(Record::parse(&record.to_bytes().unwrap()).unwrap(), record);
        }
        let deep = Record { name: String::new(), kind: TensorKind::Fp16, shape: vec![1; 5], offset: 0, nbytes: 2 };
        assert_eq!(deep.to_bytes().unwrap_err(), RecordProblem::Ndim(5));
    }
}
