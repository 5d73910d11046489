//! Parses and checks a `.cact`: every length, offset and count in the file is validated against the
//! file's size before it is used, so a truncated or foreign file is an error, never a panic or a
//! huge allocation.

use std::path::{Path, PathBuf};

use half::f16;
use serde::Serialize;
use thiserror::Error;

use super::layout;
use super::quant::{self, Bits, CqBlobError, GROUP};
use super::{TensorKind, ALIGN, HEADER_LEN, MAX_NDIM, RECORD_LEN, TAG, TOKENIZER_HEADER_LEN};

/// Per piece: f32 score, u8 type, u16 surface length.
const TOKENIZER_RECORD_LEN: usize = 7;
/// Piece types are 0 NORMAL … 4 BYTE.
const MAX_PIECE_TYPE: u8 = 4;

#[derive(Debug, Error)]
pub enum ReadError {
    #[error("cannot read {}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{}: {problem}", path.display())]
    Format { path: PathBuf, problem: FormatError },
}

/// What is wrong with a `.cact` image. Offsets are byte positions in the file.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum FormatError {
    #[error("the file is {len} bytes but its {what} needs bytes up to {needed}: the file is truncated; rebuild it with `needle build`")]
    Truncated { what: String, needed: u64, len: u64 },
    #[error("bad tag {found:#010x} at byte 0 (a .cact starts with {TAG:#010x}): not a Needle 2 .cact file")]
    BadTag { found: u32 },
    #[error("header byte 8: codebook_len is {found}, the format has {expected} (cb2|cb3|cb4); the file is corrupt or from another format version")]
    CodebookLen { found: u32, expected: u32 },
    #[error("header: {field} is {count}, the header holds at most 4; the file is corrupt")]
    HeaderList { field: &'static str, count: u32 },
    #[error("tensor {index} (directory record at byte {at}): {problem}; the file is corrupt, rebuild it with `needle build`")]
    Record { index: usize, at: u64, problem: RecordProblem },
    #[error("the directory lists {found} tensors but the header geometry implies {expected}; the file is corrupt")]
    TensorCount { found: u64, expected: String },
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
    #[error("blob [{offset}, +{nbytes}) runs past the end of the file ({len} bytes)")]
    PastEnd { offset: u64, nbytes: u64, len: u64 },
    #[error("blob at {offset} starts before the end of the previous blob or the directory ({floor})")]
    Overlap { offset: u64, floor: u64 },
    #[error(
        "CQ record has group {group} and bits {bits}; the format uses group {GROUP} and bits 2, 3, 4 or 5 (ternary)"
    )]
    CqParams { group: u32, bits: u32 },
    #[error("CQ tensor has shape {0:?}; CQ tensors are 2-D [out, in]")]
    CqShape(Vec<u32>),
    #[error("blob is {nbytes} bytes but a {kind} tensor of shape {shape:?} needs {expected}")]
    Size { kind: &'static str, shape: Vec<u32>, nbytes: u64, expected: u64 },
}

/// The geometry a `.cact` header carries.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Header {
    pub num_tensors: u32,
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

/// One directory entry, with the name its position implies.
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

impl Record {
    /// Record bits as the directory stores them (0 for non-CQ tensors).
    pub fn bits(&self) -> Option<Bits> {
        match self.kind {
            TensorKind::Cq(b) => Some(b),
            _ => None,
        }
    }

    fn elements(&self) -> u64 {
        self.shape.iter().map(|&d| u64::from(d)).product()
    }
}

/// A parsed `.cact`.
#[derive(Debug, Clone)]
pub struct CactFile {
    pub header: Header,
    pub codebook: Vec<f32>,
    pub records: Vec<Record>,
    bytes: Vec<u8>,
}

/// Little-endian reads with the file length check and a description for the error.
struct Cursor<'a> {
    bytes: &'a [u8],
}

impl<'a> Cursor<'a> {
    fn slice(&self, at: usize, len: usize, what: &str) -> Result<&'a [u8], FormatError> {
        at.checked_add(len).and_then(|end| self.bytes.get(at..end)).ok_or_else(|| FormatError::Truncated {
            what: what.into(),
            needed: at as u64 + len as u64,
            len: self.bytes.len() as u64,
        })
    }

    fn u32(&self, at: usize, what: &str) -> Result<u32, FormatError> {
        let b = self.slice(at, 4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
}

fn header_list(fields: &[u32], count: u32, field: &'static str) -> Result<Vec<u32>, FormatError> {
    let count_usize = count as usize;
    if count_usize > fields.len() {
        return Err(FormatError::HeaderList { field, count });
    }
    Ok(fields[..count_usize].to_vec())
}

fn parse_header(c: &Cursor) -> Result<Header, FormatError> {
    let raw = c.slice(0, HEADER_LEN, "120-byte header")?;
    let f: Vec<u32> = raw.chunks_exact(4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
    if f[0] != TAG {
        return Err(FormatError::BadTag { found: f[0] });
    }
    let expected_cb = quant::header_codebooks().len() as u32;
    if f[2] != expected_cb {
        return Err(FormatError::CodebookLen { found: f[2], expected: expected_cb });
    }
    Ok(Header {
        num_tensors: f[1],
        kv_window: f[3],
        kv_bits: f[4],
        vocab_size: f[5],
        d_model: f[6],
        num_heads: f[7],
        num_kv_heads: f[8],
        num_layers: f[9],
        head_dim: f[10],
        max_seq_len: f[11],
        hada_n: f[12],
        mhc_lanes: f[13],
        engram_slots: f[14],
        engram_sub_dim: f[15],
        num_engram_tables: f[16],
        engram_conv_taps: f[17],
        engram_conv_dilation: f[18],
        engram_orders: header_list(&f[20..24], f[19], "num_engram_orders")?,
        engram_layers: header_list(&f[25..29], f[24], "num_engram_sites")?,
        rope_theta: f32::from_bits(f[29]),
    })
}

/// Bytes a non-RAW tensor's blob must have.
fn expected_blob_len(kind: TensorKind, shape: &[u32], elements: u64) -> Result<u64, RecordProblem> {
    match kind {
        TensorKind::Fp16 => Ok(elements.saturating_mul(2)),
        TensorKind::Fp32 => Ok(elements.saturating_mul(4)),
        TensorKind::Cq(bits) => {
            let &[out, in_dim] = shape else {
                return Err(RecordProblem::CqShape(shape.to_vec()));
            };
            let in_pad = u64::from(in_dim).div_ceil(GROUP as u64) * GROUP as u64;
            let row = in_pad * bits.packed_bits() as u64 / 8 + in_pad / GROUP as u64 * 2;
            Ok(u64::from(out) * row)
        }
        TensorKind::Raw => Ok(0),
    }
}

/// One directory record; `floor` is where the previous blob (or the directory) ends.
fn parse_record(rec: &[u8], file_len: u64, floor: u64) -> Result<Record, RecordProblem> {
    let u32_at = |i: usize| u32::from_le_bytes([rec[i], rec[i + 1], rec[i + 2], rec[i + 3]]);
    let u64_at = |i: usize| {
        u64::from_le_bytes([rec[i], rec[i + 1], rec[i + 2], rec[i + 3], rec[i + 4], rec[i + 5], rec[i + 6], rec[i + 7]])
    };
    let (code, ndim) = (rec[0], rec[1]);
    if usize::from(ndim) > MAX_NDIM {
        return Err(RecordProblem::Ndim(ndim));
    }
    let (group, bits) = (u32_at(36), u32_at(40));
    let kind = match code {
        1 => TensorKind::Fp16,
        2 => TensorKind::Fp32,
        3 => match Bits::from_record_bits(bits) {
            Some(b) if group as usize == GROUP => TensorKind::Cq(b),
            _ => return Err(RecordProblem::CqParams { group, bits }),
        },
        4 => TensorKind::Raw,
        other => return Err(RecordProblem::DType(other)),
    };
    let shape: Vec<u32> = (0..usize::from(ndim)).map(|i| u32_at(4 + 4 * i)).collect();
    let (offset, nbytes) = (u64_at(20), u64_at(28));
    if offset % ALIGN as u64 != 0 {
        return Err(RecordProblem::Misaligned(offset));
    }
    if offset < floor {
        return Err(RecordProblem::Overlap { offset, floor });
    }
    if offset.checked_add(nbytes).is_none_or(|end| end > file_len) {
        return Err(RecordProblem::PastEnd { offset, nbytes, len: file_len });
    }
    let record = Record { name: String::new(), kind, shape, offset, nbytes };
    // Every dimension is a u32 and there are at most 4, but their product can overflow u64.
    let elements = record.shape.iter().try_fold(1u64, |acc, &d| acc.checked_mul(u64::from(d)));
    let expected = match elements {
        Some(n) => expected_blob_len(kind, &record.shape, n)?,
        None => u64::MAX,
    };
    if kind != TensorKind::Raw && expected != nbytes {
        return Err(RecordProblem::Size { kind: kind.label(), shape: record.shape.clone(), nbytes, expected });
    }
    Ok(record)
}

impl CactFile {
    pub fn open(path: &Path) -> Result<Self, ReadError> {
        let bytes = std::fs::read(path).map_err(|source| ReadError::Io { path: path.to_path_buf(), source })?;
        Self::parse(bytes).map_err(|problem| ReadError::Format { path: path.to_path_buf(), problem })
    }

    pub fn parse(bytes: Vec<u8>) -> Result<Self, FormatError> {
        let c = Cursor { bytes: &bytes };
        let header = parse_header(&c)?;
        let cb_len = quant::header_codebooks().len();
        let codebook: Vec<f32> = c
            .slice(HEADER_LEN, cb_len * 4, "codebook")?
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        let dir_start = HEADER_LEN + cb_len * 4;
        let n = header.num_tensors as usize;
        // Checked against the file size before any allocation sized by the untrusted count.
        let directory = c.slice(dir_start, n.saturating_mul(RECORD_LEN), "directory")?;
        let mut records = Vec::with_capacity(n);
        let mut floor = (dir_start + directory.len()) as u64;
        for (index, rec) in directory.chunks_exact(RECORD_LEN).enumerate() {
            let at = dir_start + index * RECORD_LEN;
            let record = parse_record(rec, bytes.len() as u64, floor).map_err(|problem| FormatError::Record {
                index,
                at: at as u64,
                problem,
            })?;
            floor = record.offset + record.nbytes;
            records.push(record);
        }
        let mut file = CactFile { header, codebook, records, bytes: Vec::new() };
        file.bytes = bytes;
        let names = file.positional_names()?;
        file.records.iter_mut().zip(names).for_each(|(r, name)| r.name = name);
        Ok(file)
    }

    /// Size of the whole file in bytes.
    pub fn size(&self) -> usize {
        self.bytes.len()
    }

    /// The blob of tensor `index` (validated against the file size at parse time).
    pub fn blob(&self, index: usize) -> Option<&[u8]> {
        let r = self.records.get(index)?;
        self.bytes.get(r.offset as usize..(r.offset + r.nbytes) as usize)
    }

    /// Header, codebooks and directory: everything before the first blob.
    pub fn preamble(&self) -> &[u8] {
        let end = HEADER_LEN + self.codebook.len() * 4 + self.records.len() * RECORD_LEN;
        &self.bytes[..end]
    }

    /// Index of the RAW tokenizer blob, which the writer always puts last.
    pub fn tokenizer_index(&self) -> Option<usize> {
        self.records.iter().rposition(|r| r.kind == TensorKind::Raw).filter(|&i| i + 1 == self.records.len())
    }

    /// Names by position: the canonical order from the header geometry, then the heads the manifest
    /// lists, then the tokenizer.
    fn positional_names(&self) -> Result<Vec<String>, FormatError> {
        let h = &self.header;
        let found = self.records.len() as u64;
        let core = 1 + 14 * u64::from(h.num_layers) + 9 + 4 * h.engram_layers.len() as u64 + 1;
        let tokenizer = u64::from(self.tokenizer_index().is_some());
        let count_error = || FormatError::TensorCount {
            found,
            expected: format!("{core} through final_norm, then 1 + 3 per probe head, then the tokenizer"),
        };
        let extra = found.checked_sub(core + tokenizer).ok_or_else(count_error)?;
        let mut names = layout::core_names(h.num_layers as usize, h.engram_layers.len());
        if extra > 0 {
            if (extra - 1) % 3 != 0 {
                return Err(count_error());
            }
            let heads = ((extra - 1) / 3) as usize;
            let manifest =
                self.records.get(core as usize).filter(|r| r.kind == TensorKind::Fp16 && r.elements() == heads as u64);
            let codes: Vec<u16> = match manifest.and_then(|_| self.blob(core as usize)) {
                Some(blob) => blob.chunks_exact(2).map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32() as u16).collect(),
                None => return Err(count_error()),
            };
            names.extend(layout::head_names(&codes));
        }
        if tokenizer == 1 {
            names.push(layout::TOKENIZER.into());
        }
        Ok(names)
    }

    /// The tensor's values as f32 (row-major; CQ tensors reconstructed). `None` for RAW blobs.
    pub fn values(&self, index: usize) -> Option<Result<Vec<f32>, CqBlobError>> {
        let r = self.records.get(index)?;
        let blob = self.blob(index)?;
        match r.kind {
            TensorKind::Fp16 => {
                Some(Ok(blob.chunks_exact(2).map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32()).collect()))
            }
            TensorKind::Fp32 => {
                Some(Ok(blob.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()))
            }
            TensorKind::Cq(bits) => {
                let (out, in_dim) = (r.shape[0] as usize, r.shape[1] as usize);
                Some(quant::cq_decode(blob, out, in_dim, bits))
            }
            TensorKind::Raw => None,
        }
    }

    /// Piece count of the tokenizer blob, if the file carries one.
    pub fn tokenizer_pieces(&self) -> Option<u32> {
        let blob = self.blob(self.tokenizer_index()?)?;
        blob.first_chunk::<4>().map(|b| u32::from_le_bytes(*b))
    }

    /// Decodes every tensor and checks what a runtime relies on: the header codebooks are the
    /// format's, CQ norms are finite and non-negative, all values are finite, the tokenizer blob
    /// walks cleanly to its end.
    pub fn verify(&self) -> Result<VerifyReport, VerifyError> {
        if self.codebook != quant::header_codebooks() {
            return Err(VerifyError::Codebook);
        }
        let mut report = VerifyReport::default();
        for (index, r) in self.records.iter().enumerate() {
            let fail = |problem: String| VerifyError::Tensor { index, name: r.name.clone(), problem };
            let blob = self.blob(index).ok_or_else(|| fail("blob out of range".into()))?;
            if let TensorKind::Cq(bits) = r.kind {
                let parts = quant::cq_split(blob, r.shape[0] as usize, r.shape[1] as usize, bits)
                    .map_err(|e| fail(e.to_string()))?;
                if let Some(g) = parts.norms.iter().position(|n| !n.is_finite() || n.to_f32() < 0.0) {
                    return Err(fail(format!("group norm {g} is {}", parts.norms[g])));
                }
                report.cq_groups += parts.norms.len();
            }
            match self.values(index) {
                Some(values) => {
                    let values = values.map_err(|e| fail(e.to_string()))?;
                    if let Some(i) = values.iter().position(|v| !v.is_finite()) {
                        return Err(fail(format!("element {i} is {}", values[i])));
                    }
                    report.max_abs = values.iter().fold(report.max_abs, |m, v| m.max(v.abs()));
                }
                None => report.tokenizer_pieces = Some(check_tokenizer_blob(blob).map_err(fail)?),
            }
            report.tensors += 1;
        }
        Ok(report)
    }
}

/// Walks the RAW tokenizer blob record by record; returns the piece count.
fn check_tokenizer_blob(blob: &[u8]) -> Result<u32, String> {
    let c = Cursor { bytes: blob };
    let err = |e: FormatError| format!("tokenizer blob: {e}");
    c.slice(0, TOKENIZER_HEADER_LEN, "tokenizer header").map_err(err)?;
    let n = c.u32(0, "tokenizer header").map_err(err)?;
    let mut at = TOKENIZER_HEADER_LEN;
    for piece in 0..n {
        let rec = c.slice(at, TOKENIZER_RECORD_LEN, &format!("piece {piece} record")).map_err(err)?;
        let (kind, len) = (rec[4], usize::from(u16::from_le_bytes([rec[5], rec[6]])));
        if kind > MAX_PIECE_TYPE {
            return Err(format!("tokenizer blob byte {}: piece {piece} has type {kind} (0..=4)", at + 4));
        }
        let surface = c.slice(at + TOKENIZER_RECORD_LEN, len, &format!("piece {piece} surface")).map_err(err)?;
        std::str::from_utf8(surface)
            .map_err(|e| format!("tokenizer blob byte {}: piece {piece} is not UTF-8 ({e})", at + 7))?;
        at += TOKENIZER_RECORD_LEN + len;
    }
    if at != blob.len() {
        return Err(format!("tokenizer blob has {} trailing bytes after its {n} pieces", blob.len() - at));
    }
    Ok(n)
}

/// What `verify` checked.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct VerifyReport {
    pub tensors: usize,
    pub cq_groups: usize,
    /// Largest |value| over every decoded tensor.
    pub max_abs: f32,
    pub tokenizer_pieces: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum VerifyError {
    #[error("the header's codebooks differ from the format's Lloyd-Max levels; the file was not written by a Needle 2 exporter")]
    Codebook,
    #[error("tensor {index} ({name}): {problem}")]
    Tensor { index: usize, name: String, problem: String },
}

#[cfg(test)]
mod tests {
    use std::sync::LazyLock;

    use proptest::prelude::*;

    use super::*;
    use crate::cact::synthetic::{placeholder_tokenizer_blob, random_checkpoint};
    use crate::cact::{build_cact, BitsChoice};
    use crate::config::ModelConfig;

    /// A small but complete image: 2 layers, 2 engram sites, ragged widths, a tokenizer.
    static IMAGE: LazyLock<Vec<u8>> = LazyLock::new(|| {
        let config = ModelConfig {
            vocab_size: 40,
            d_model: 40,
            num_heads: 4,
            num_kv_heads: 2,
            num_layers: 2,
            engram_slots: 8,
            engram_layers: vec![0, 1],
            mhc_lanes: 2,
            ..ModelConfig::default()
        };
        let ckpt = random_checkpoint(&config, false, 7).unwrap();
        build_cact(&ckpt, &BitsChoice::Uniform(Bits::Two), &placeholder_tokenizer_blob(40)).unwrap().bytes
    });

    /// Everything a consumer does with a parsed file; must never panic whatever the bytes.
    fn exercise(bytes: Vec<u8>) {
        if let Ok(file) = CactFile::parse(bytes) {
            for i in 0..file.records.len() {
                let _ = file.values(i);
            }
            let _ = file.tokenizer_pieces();
            let _ = file.verify();
        }
    }

    fn record_at(index: usize) -> usize {
        HEADER_LEN + quant::header_codebooks().len() * 4 + index * RECORD_LEN
    }

    #[test]
    fn a_built_image_parses_names_and_verifies() {
        let file = CactFile::parse(IMAGE.clone()).unwrap();
        let names: Vec<&str> = file.records.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names.len(), 1 + 2 * 14 + 9 + 2 * 4 + 1 + 1);
        assert_eq!(names[..3], ["embedding", "layer00.norm_in", "layer00.q_proj"]);
        assert_eq!(names[names.len() - 2..], ["final_norm", "tokenizer"]);
        assert_eq!(file.tokenizer_pieces(), Some(40));
        let report = file.verify().unwrap();
        assert_eq!(report.tokenizer_pieces, Some(40));
        assert!(report.max_abs > 0.0 && report.max_abs < 1.0);
    }

    #[test]
    fn a_foreign_file_is_a_bad_tag() {
        let mut bytes = IMAGE.clone();
        bytes[..4].copy_from_slice(b"PK\x03\x04");
        assert_eq!(CactFile::parse(bytes).unwrap_err(), FormatError::BadTag { found: 0x0403_4b50 });
    }

    #[test]
    fn truncation_names_what_is_missing() {
        let len = IMAGE.len();
        let err = CactFile::parse(IMAGE[..len - 1].to_vec()).unwrap_err();
        assert!(matches!(err, FormatError::Record { problem: RecordProblem::PastEnd { .. }, .. }), "{err}");
        let err = CactFile::parse(IMAGE[..100].to_vec()).unwrap_err();
        assert!(err.to_string().contains("120-byte header"), "{err}");
    }

    #[test]
    fn a_misaligned_offset_is_reported_with_its_record() {
        let mut bytes = IMAGE.clone();
        let at = record_at(3) + 20;
        let offset = u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap()) + 8;
        bytes[at..at + 8].copy_from_slice(&offset.to_le_bytes());
        assert_eq!(
            CactFile::parse(bytes).unwrap_err(),
            FormatError::Record { index: 3, at: record_at(3) as u64, problem: RecordProblem::Misaligned(offset) }
        );
    }

    #[test]
    fn a_huge_tensor_count_is_a_truncation_not_an_allocation() {
        let mut bytes = IMAGE.clone();
        bytes[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(CactFile::parse(bytes), Err(FormatError::Truncated { .. })));
    }

    #[test]
    fn a_huge_layer_count_is_a_count_mismatch_not_an_allocation() {
        let mut bytes = IMAGE.clone();
        bytes[36..40].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(CactFile::parse(bytes), Err(FormatError::TensorCount { .. })));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        #[test]
        fn truncated_images_never_panic(len in 0usize..4096) {
            exercise(IMAGE[..len.min(IMAGE.len())].to_vec());
        }

        #[test]
        fn mutated_images_never_panic(edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8)) {
            let mut bytes = IMAGE.clone();
            let len = bytes.len();
            for (at, value) in edits {
                bytes[at.index(len)] = value;
            }
            exercise(bytes);
        }

        /// Mutations aimed at the header and directory, where every field is a length or offset.
        #[test]
        fn mutated_directories_never_panic(edits in prop::collection::vec((0usize..3000, any::<u8>()), 1..8)) {
            let mut bytes = IMAGE.clone();
            for (at, value) in edits {
                if let Some(b) = bytes.get_mut(at) {
                    *b = value;
                }
            }
            exercise(bytes);
        }
    }
}
