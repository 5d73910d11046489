//! The `.cact` container, written down once for the writer and the reader: the header's fields in
//! file order, the bytes of a directory record, and where blobs start.
//!
//! What the tensors are and in which order is the generation's ([`super::needle2`], [`super::needle3`],
//! picked by [`layout`]); what is here is the frame around them, and which one each generation has.

use serde::Serialize;

use thiserror::Error;

use super::layout::Layout;
use super::{needle2, needle3};
use crate::generation::Generation;
use crate::quant::{Bits, GROUP};

/// First u32 of every Needle 2 `.cact`.
pub const TAG: u32 = 0x05E1_2A83;
/// First u32 of a Needle 3 `.cact` (format v3).
pub const TAG_V3: u32 = 0x05E1_2A84;
/// Every blob starts on a multiple of this.
pub const ALIGN: usize = 64;
/// Byte offset of the header's `num_tensors`.
pub const NUM_TENSORS_AT: usize = 4;
/// One directory record.
pub const RECORD_LEN: usize = 44;
/// Most dimensions a directory record can describe.
pub const MAX_NDIM: usize = 4;

/// The tag a generation's `.cact` starts with.
pub const fn tag(generation: Generation) -> u32 {
    match generation {
        Generation::Needle2 => TAG,
        Generation::Needle3 => TAG_V3,
    }
}

/// The generation whose `.cact` files start with `tag`.
pub fn generation_of_tag(tag: u32) -> Option<Generation> {
    Generation::ALL.into_iter().find(|g| self::tag(*g) == tag)
}

/// The tensors a generation's `.cact` holds, in the order the runtime indexes them.
pub fn layout(generation: Generation) -> &'static Layout {
    match generation {
        Generation::Needle2 => &needle2::LAYOUT,
        Generation::Needle3 => &needle3::LAYOUT,
    }
}

/// What is wrong with a `.cact` image. Offsets are byte positions in the file.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum FormatError {
    #[error("the file is {len} bytes but its {what} needs bytes up to {needed}: the file is truncated; rebuild it with `needle build`")]
    Truncated { what: String, needed: u64, len: u64 },
    #[error("bad tag {found:#010x} at byte 0 (a .cact starts with {}): not a .cact file", known_tags())]
    BadTag { found: u32 },
    #[error("header byte 8: codebook_len is {found}, the format has {expected} (cb2|cb3|cb4); the file is corrupt or from another format version")]
    CodebookLen { found: u32, expected: u32 },
    #[error("header: {field} is {count}, the header holds at most {slots}; the file is corrupt")]
    HeaderList { field: &'static str, count: u32, slots: usize },
    #[error("tensor {index} (directory record at byte {at}): {problem}; the file is corrupt, rebuild it with `needle build`")]
    Record { index: usize, at: u64, problem: RecordProblem },
    #[error("the directory lists {found} tensors but the header geometry implies {expected}; the file is corrupt")]
    TensorCount { found: u64, expected: String },
    #[error("the last blob ends at byte {end} but the file has {len} bytes: {} bytes belong to no tensor of the {count} the header's num_tensors lists; the count is wrong or bytes were appended, rebuild it with `needle build`", len.saturating_sub(*end))]
    TrailingBytes { end: u64, len: u64, count: u32 },
    #[error("header byte {NUM_TENSORS_AT}: num_tensors is {count}, whose directory would end at byte {needed}, past the end of the {len}-byte file; the count is corrupt or the file truncated, rebuild it with `needle build`")]
    DirectoryPastEnd { count: u32, needed: u64, len: u64 },
}

/// A bad directory record.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RecordProblem {
    #[error("unknown dtype code {0} (1 FP16, 2 FP32, 3 CQ, 4 RAW)")]
    DType(u8),
    #[error("ndim {0} exceeds {MAX_NDIM}")]
    Ndim(u8),
    #[error("blob offset {0} is not {ALIGN}-byte aligned")]
    Misaligned(u64),
    #[error("blob [{offset}, +{nbytes}) runs past the end of the {len}-byte file: the file is truncated or the record corrupt")]
    PastEnd { offset: u64, nbytes: u64, len: u64 },
    #[error("blob at {offset} starts inside the directory, which the header's num_tensors ({count}) says ends at byte {end}: the count (or this offset) is wrong")]
    InsideDirectory { offset: u64, end: u64, count: u32 },
    #[error("blob at {offset} starts before the end of the previous blob ({floor})")]
    Overlap { offset: u64, floor: u64 },
    #[error(
        "CQ record has group {group} and bits {bits}; the format uses group {GROUP} and bits 2, 3, 4 or 5 (ternary)"
    )]
    CqParams { group: u32, bits: u32 },
    #[error("CQ tensor has shape {0:?}; CQ tensors are 2-D [out, in]")]
    CqShape(Vec<u32>),
    #[error("blob is {nbytes} bytes but a {kind} tensor of shape {shape:?} needs {}",
            expected.map_or_else(|| "more bytes than a file can hold".to_string(), |n| n.to_string()))]
    Size { kind: &'static str, shape: Vec<u32>, nbytes: u64, expected: Option<u64> },
}

/// Every generation's tag, for a message: `0x05e12a83 (Needle 2) or 0x05e12a84 (Needle 3)`.
fn known_tags() -> String {
    let tags: Vec<String> = Generation::ALL.iter().map(|g| format!("{:#010x} ({g})", tag(*g))).collect();
    tags.join(" or ")
}

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

/// The geometry a `.cact` header carries. A Needle 2 header has no room for the fields marked
/// Needle 3; they are zero there.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Header {
    /// Told by the tag; decides which fields the file has and what its tensors are.
    pub generation: Generation,
    pub num_tensors: u32,
    pub codebook_len: u32,
    pub kv_window: u32,
    pub kv_bits: u32,
    pub vocab_size: u32,
    /// Needle 3: the embedding rows the output head scores (0: all of them).
    pub out_vocab: u32,
    pub d_model: u32,
    pub num_heads: u32,
    pub num_kv_heads: u32,
    pub num_layers: u32,
    /// Per-head width of queries and keys (in Needle 2, of values too).
    pub head_dim: u32,
    /// Needle 3: per-head width of values.
    pub v_head_dim: u32,
    pub max_seq_len: u32,
    pub hada_n: u32,
    pub mhc_lanes: u32,
    /// Needle 3: a windowed layer's attention width (0: none).
    pub sliding_window: u32,
    /// Needle 3: the layers that attend to the whole row, bit `i` for layer `i`.
    pub global_layers: u64,
    /// Needle 3: taps of the causal convolution on Q, K and V (0: none).
    pub qkv_conv_taps: u32,
    pub engram_slots: u32,
    pub engram_sub_dim: u32,
    pub num_engram_tables: u32,
    pub engram_conv_taps: u32,
    pub engram_conv_dilation: u32,
    /// Needle 3: the stride of the engram hash seeds (0: the engram heads).
    pub engram_seed_heads: u32,
    pub engram_orders: Vec<u32>,
    pub engram_layers: Vec<u32>,
    pub rope_theta: f32,
}

/// One stretch of the header after the tag.
#[derive(Debug)]
pub enum Field {
    Word(fn(&mut Header) -> &mut u32),
    /// A count, then this many slots, the unused ones zero; named by its count field.
    List(&'static str, usize, fn(&mut Header) -> &mut Vec<u32>),
    /// A 64-bit layer mask as two words, low then high.
    Mask(fn(&mut Header) -> &mut u64),
    Float(fn(&mut Header) -> &mut f32),
}

impl Field {
    const fn words(&self) -> usize {
        match self {
            Field::Word(_) | Field::Float(_) => 1,
            Field::List(_, slots, _) => 1 + *slots,
            Field::Mask(_) => 2,
        }
    }
}

/// A Needle 2 header after the tag, in file order: the one statement of it that encoding and
/// parsing share.
pub(crate) const FIELDS_V2: [Field; 21] = [
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
    Field::List("num_engram_orders", 4, |h| &mut h.engram_orders),
    Field::List("num_engram_sites", 4, |h| &mut h.engram_layers),
    Field::Float(|h| &mut h.rope_theta),
];

/// A Needle 3 header after the tag (3.x's `<48If`), in file order.
pub(crate) const FIELDS_V3: [Field; 27] = [
    Field::Word(|h| &mut h.num_tensors),
    Field::Word(|h| &mut h.codebook_len),
    Field::Word(|h| &mut h.kv_window),
    Field::Word(|h| &mut h.kv_bits),
    Field::Word(|h| &mut h.vocab_size),
    Field::Word(|h| &mut h.out_vocab),
    Field::Word(|h| &mut h.d_model),
    Field::Word(|h| &mut h.num_heads),
    Field::Word(|h| &mut h.num_kv_heads),
    Field::Word(|h| &mut h.num_layers),
    Field::Word(|h| &mut h.head_dim),
    Field::Word(|h| &mut h.v_head_dim),
    Field::Word(|h| &mut h.max_seq_len),
    Field::Word(|h| &mut h.hada_n),
    Field::Word(|h| &mut h.mhc_lanes),
    Field::Word(|h| &mut h.sliding_window),
    Field::Mask(|h| &mut h.global_layers),
    Field::Word(|h| &mut h.qkv_conv_taps),
    Field::Word(|h| &mut h.engram_slots),
    Field::Word(|h| &mut h.engram_sub_dim),
    Field::Word(|h| &mut h.num_engram_tables),
    Field::Word(|h| &mut h.engram_conv_taps),
    Field::Word(|h| &mut h.engram_conv_dilation),
    Field::Word(|h| &mut h.engram_seed_heads),
    Field::List("num_engram_orders", 4, |h| &mut h.engram_orders),
    Field::List("num_engram_sites", 16, |h| &mut h.engram_layers),
    Field::Float(|h| &mut h.rope_theta),
];

/// A generation's header fields after the tag, in file order.
pub fn fields(generation: Generation) -> &'static [Field] {
    match generation {
        Generation::Needle2 => &FIELDS_V2,
        Generation::Needle3 => &FIELDS_V3,
    }
}

/// Bytes of a generation's header, tag included: 120 for Needle 2, 196 for Needle 3.
pub fn header_len(generation: Generation) -> usize {
    4 * (1 + fields(generation).iter().map(Field::words).sum::<usize>())
}

/// The most entries a generation's header list `field` holds (engram orders: 4; sites: 4, or 16 in v3).
pub fn list_slots(generation: Generation, field: &str) -> usize {
    fields(generation)
        .iter()
        .find_map(|f| match f {
            Field::List(name, slots, _) if *name == field => Some(*slots),
            _ => None,
        })
        .unwrap_or(0)
}

impl Header {
    /// The header's bytes, tag first. A list longer than its slots is refused.
    pub fn to_bytes(&self) -> Result<Vec<u8>, FormatError> {
        let mut header = self.clone();
        let mut words = vec![tag(self.generation)];
        for field in fields(self.generation) {
            match field {
                Field::Word(at) => words.push(*at(&mut header)),
                Field::List(name, slots, at) => {
                    let list = at(&mut header);
                    if list.len() > *slots {
                        let (field, count, slots) = (*name, list.len() as u32, *slots);
                        return Err(FormatError::HeaderList { field, count, slots });
                    }
                    words.push(list.len() as u32);
                    words.extend((0..*slots).map(|i| list.get(i).copied().unwrap_or(0)));
                }
                Field::Mask(at) => {
                    let mask = *at(&mut header);
                    words.extend([mask as u32, (mask >> 32) as u32]);
                }
                Field::Float(at) => words.push(at(&mut header).to_bits()),
            }
        }
        debug_assert_eq!(words.len() * 4, header_len(self.generation));
        Ok(words.iter().flat_map(|w| w.to_le_bytes()).collect())
    }

    /// Reads the header from the start of a file's `bytes`: the tag tells the generation, and so
    /// how long the header is.
    pub fn parse(bytes: &[u8]) -> Result<Self, FormatError> {
        let truncated = |what: String, needed: usize| FormatError::Truncated {
            what,
            needed: needed as u64,
            len: bytes.len() as u64,
        };
        let word = |i: usize| bytes.get(4 * i..4 * i + 4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
        let found = word(0).ok_or_else(|| truncated("4-byte tag".into(), 4))?;
        let generation = generation_of_tag(found).ok_or(FormatError::BadTag { found })?;
        let len = header_len(generation);
        if bytes.len() < len {
            return Err(truncated(format!("{len}-byte {generation} header"), len));
        }
        let mut words = (1..len / 4).map(|i| word(i).unwrap_or(0));
        let mut next = || words.next().unwrap_or(0);
        let mut header = Header { generation, ..Header::default() };
        for field in fields(generation) {
            match field {
                Field::Word(at) => *at(&mut header) = next(),
                Field::List(name, slots, at) => {
                    let count = next();
                    let values: Vec<u32> = (0..*slots).map(|_| next()).collect();
                    if count as usize > *slots {
                        return Err(FormatError::HeaderList { field: name, count, slots: *slots });
                    }
                    *at(&mut header) = values[..count as usize].to_vec();
                }
                Field::Mask(at) => {
                    let low = u64::from(next());
                    *at(&mut header) = low | (u64::from(next()) << 32);
                }
                Field::Float(at) => *at(&mut header) = f32::from_bits(next()),
            }
        }
        Ok(header)
    }

    /// Bytes of this header.
    pub fn byte_len(&self) -> usize {
        header_len(self.generation)
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

    fn needle2_header() -> Header {
        Header {
            generation: Generation::Needle2,
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
            ..Header::default()
        }
    }

    #[test]
    fn a_header_reads_back_as_written() {
        let header = needle2_header();
        let bytes = header.to_bytes().unwrap();
        assert_eq!(bytes.len(), 120);
        assert_eq!(Header::parse(&bytes).unwrap(), header);
        let five = Header { engram_layers: vec![0; 5], ..header };
        assert_eq!(
            five.to_bytes().unwrap_err(),
            FormatError::HeaderList { field: "num_engram_sites", count: 5, slots: 4 }
        );
    }

    #[test]
    fn a_needle3_header_reads_back_as_written_with_its_own_fields() {
        let header = Header {
            generation: Generation::Needle3,
            out_vocab: 8000,
            v_head_dim: 64,
            sliding_window: 1024,
            global_layers: (1 << 40) | 0b1001,
            qkv_conv_taps: 3,
            engram_seed_heads: 3,
            engram_layers: vec![3, 7, 11, 15, 19],
            ..needle2_header()
        };
        let bytes = header.to_bytes().unwrap();
        assert_eq!(bytes.len(), 196);
        assert_eq!(u32::from_le_bytes(bytes[..4].try_into().unwrap()), TAG_V3);
        assert_eq!(Header::parse(&bytes).unwrap(), header);
        // The v3 fields have no room in a Needle 2 header: it reads back without them.
        let v2 = Header { generation: Generation::Needle2, engram_layers: vec![3], ..header.clone() };
        let read = Header::parse(&v2.to_bytes().unwrap()).unwrap();
        assert_eq!((read.out_vocab, read.global_layers, read.qkv_conv_taps), (0, 0, 0));
        let err = Header::parse(&bytes[..150]).unwrap_err();
        assert!(err.to_string().contains("196-byte Needle 3 header"), "{err}");
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

    #[test]
    fn the_core_count_is_the_number_of_core_names() {
        for generation in [Generation::Needle2, Generation::Needle3] {
            let layout = layout(generation);
            for (layers, sites, taps) in [(0, 0, false), (3, 1, true), (27, 4, false), (20, 5, true)] {
                let names = layout.core_names(layers as usize, sites as usize, taps);
                assert_eq!(layout.core_count(layers, sites, taps), names.len() as u64);
            }
        }
    }
}
