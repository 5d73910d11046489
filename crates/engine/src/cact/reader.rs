//! Parses and checks a `.cact`: every length, offset and count in the file is validated against the
//! file's size before it is used, so a truncated or foreign file is an error, never a panic or a
//! huge allocation.

use std::path::{Path, PathBuf};

use half::f16;
use serde::Serialize;
use thiserror::Error;

use super::format::{self, FormatError, Header, Record, RecordProblem, TensorKind, ALIGN, RECORD_LEN};
use super::layout::{HEADS_MANIFEST, TOKENIZER};
use crate::quant::{self, CqBlobError};
use crate::tokenizer;

#[derive(Debug, Error)]
pub enum ReadError {
    #[error("cannot read {}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{}: {problem}", path.display())]
    Format { path: PathBuf, problem: FormatError },
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
        at.checked_add(len).and_then(|end| self.bytes.get(at..end)).ok_or_else(|| self.truncated(at, len, what))
    }

    fn truncated(&self, at: usize, len: usize, what: &str) -> FormatError {
        FormatError::Truncated { what: what.into(), needed: at as u64 + len as u64, len: self.bytes.len() as u64 }
    }
}

fn parse_header(c: &Cursor) -> Result<Header, FormatError> {
    let header = Header::parse(c.bytes)?;
    let expected = quant::header_codebooks().len() as u32;
    if header.codebook_len != expected {
        return Err(FormatError::CodebookLen { found: header.codebook_len, expected });
    }
    Ok(header)
}

/// Bytes a non-RAW tensor's blob must have; `None` when that overflows (no file holds it).
fn expected_blob_len(record: &Record) -> Result<Option<u64>, RecordProblem> {
    let elements = record.elements();
    match record.kind {
        TensorKind::Fp16 => Ok(elements.and_then(|n| n.checked_mul(2))),
        TensorKind::Fp32 => Ok(elements.and_then(|n| n.checked_mul(4))),
        TensorKind::Cq(bits) => {
            let &[out, in_dim] = record.shape.as_slice() else {
                return Err(RecordProblem::CqShape(record.shape.clone()));
            };
            Ok(quant::cq_blob_len(out as usize, in_dim as usize, bits).map(|n| n as u64))
        }
        TensorKind::Raw => Ok(None),
    }
}

/// Where the previous blob ends, for the next record's overlap check.
#[derive(Clone, Copy)]
enum Floor {
    /// No blob yet: the directory, as long as the header's `num_tensors` makes it, ends here.
    Directory {
        end: u64,
        count: u32,
    },
    Blob(u64),
}

/// One directory record.
fn parse_record(rec: &[u8; RECORD_LEN], file_len: u64, floor: Floor) -> Result<Record, RecordProblem> {
    let record = Record::parse(rec)?;
    let (kind, offset, nbytes) = (record.kind, record.offset, record.nbytes);
    if offset % ALIGN as u64 != 0 {
        return Err(RecordProblem::Misaligned(offset));
    }
    match floor {
        Floor::Directory { end, count } if offset < end => {
            return Err(RecordProblem::InsideDirectory { offset, end, count })
        }
        Floor::Blob(floor) if offset < floor => return Err(RecordProblem::Overlap { offset, floor }),
        _ => {}
    }
    if offset.checked_add(nbytes).is_none_or(|end| end > file_len) {
        return Err(RecordProblem::PastEnd { offset, nbytes, len: file_len });
    }
    // Every dimension is a u32 and there are at most 4, but their product can overflow u64; the
    // shape must account for the blob exactly, so no later read is sized by the shape alone.
    let expected = expected_blob_len(&record)?;
    if kind != TensorKind::Raw && expected != Some(nbytes) {
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
            .slice(header.byte_len(), cb_len * 4, "codebook")?
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        let dir_start = header.byte_len() + cb_len * 4;
        let count = header.num_tensors;
        // Checked against the file size before any allocation sized by the untrusted count.
        let dir_end = u64::from(count) * RECORD_LEN as u64 + dir_start as u64;
        let directory = usize::try_from(dir_end)
            .ok()
            .and_then(|end| bytes.get(dir_start..end))
            .ok_or(FormatError::DirectoryPastEnd { count, needed: dir_end, len: bytes.len() as u64 })?;
        let mut records = Vec::with_capacity(directory.len() / RECORD_LEN);
        let mut floor = Floor::Directory { end: dir_end, count };
        for (index, rec) in directory.as_chunks::<RECORD_LEN>().0.iter().enumerate() {
            let at = dir_start + index * RECORD_LEN;
            let record = parse_record(rec, bytes.len() as u64, floor).map_err(|problem| FormatError::Record {
                index,
                at: at as u64,
                problem,
            })?;
            floor = Floor::Blob(record.offset + record.nbytes);
            records.push(record);
        }
        // Writers end the file with the last blob; bytes beyond it mean the count left tensors out.
        let (Floor::Directory { end, .. } | Floor::Blob(end)) = floor;
        if end != bytes.len() as u64 {
            return Err(FormatError::TrailingBytes { end, len: bytes.len() as u64, count });
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
        let end = self.header.byte_len() + self.codebook.len() * 4 + self.records.len() * RECORD_LEN;
        &self.bytes[..end]
    }

    /// Index of the RAW tokenizer blob, which the writer always puts last.
    pub fn tokenizer_index(&self) -> Option<usize> {
        self.records.iter().rposition(|r| r.kind == TensorKind::Raw).filter(|&i| i + 1 == self.records.len())
    }

    /// The probe heads the file carries, in file order, by their keys (`confidence_head`, …; a head
    /// of a code this generation does not know is `head<i>`): the tensors after the manifest.
    pub fn probe_heads(&self) -> Vec<&str> {
        let mut heads: Vec<&str> = Vec::new();
        let after = self.records.iter().position(|r| r.name == HEADS_MANIFEST).map_or(self.records.len(), |i| i + 1);
        for record in &self.records[after..] {
            if let Some((key, _)) = record.name.split_once('.') {
                if !heads.contains(&key) {
                    heads.push(key);
                }
            }
        }
        heads
    }

    /// Names by position: the canonical order from the header geometry, then the heads the manifest
    /// lists, then the tokenizer.
    fn positional_names(&self) -> Result<Vec<String>, FormatError> {
        let h = &self.header;
        let layout = format::layout(h.generation);
        let taps = h.qkv_conv_taps > 0;
        let found = self.records.len() as u64;
        let core = layout.core_count(h.num_layers, h.engram_layers.len() as u32, taps);
        let tokenizer = u64::from(self.tokenizer_index().is_some());
        let count_error = || FormatError::TensorCount {
            found,
            expected: format!("{core} through final_norm, then the probe heads the manifest lists, then the tokenizer"),
        };
        let extra = found.checked_sub(core + tokenizer).ok_or_else(count_error)?;
        let mut names = layout.core_names(h.num_layers as usize, h.engram_layers.len(), taps);
        if extra > 0 {
            // The manifest lists one code per head; it cannot list more heads than tensors follow it.
            let manifest = self
                .records
                .get(core as usize)
                .filter(|r| r.kind == TensorKind::Fp16 && r.elements().is_some_and(|n| n < extra));
            let codes: Vec<u16> = match manifest.and_then(|_| self.blob(core as usize)) {
                Some(blob) => blob.chunks_exact(2).map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32() as u16).collect(),
                None => return Err(count_error()),
            };
            let heads = layout.head_names(&codes);
            if heads.len() as u64 != extra {
                return Err(count_error());
            }
            names.extend(heads);
        }
        if tokenizer == 1 {
            names.push(TOKENIZER.into());
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

    /// Piece count the tokenizer blob's header states, if the file carries a blob with a whole header.
    pub fn tokenizer_pieces(&self) -> Option<u32> {
        tokenizer::cact_blob_stated_pieces(self.blob(self.tokenizer_index()?)?).ok()
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
                None => {
                    let pieces = tokenizer::cact_blob_piece_count(blob).map_err(|e| fail(e.to_string()))?;
                    report.tokenizer_pieces = Some(pieces)
                }
            }
            report.tensors += 1;
        }
        Ok(report)
    }
}

/// What `verify` checked.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct VerifyReport {
    pub tensors: usize,
    pub cq_groups: usize,
    /// Largest |value| over every decoded tensor.
    pub max_abs: f32,
    pub tokenizer_pieces: Option<usize>,
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum VerifyError {
    #[error("the header's codebooks differ from the format's Lloyd-Max levels; the file was not written by a Needle exporter")]
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
    use crate::cact::writer::tests::small_config;
    use crate::cact::{build_cact, BitsChoice, BitsMap};
    use crate::config::ModelConfig;
    use crate::quant::Bits;

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
        120 + quant::header_codebooks().len() * 4 + index * RECORD_LEN
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
        assert!(err.to_string().contains("120-byte Needle 2 header"), "{err}");
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

    fn with_num_tensors(count: u32) -> Vec<u8> {
        let mut bytes = IMAGE.clone();
        bytes[format::NUM_TENSORS_AT..format::NUM_TENSORS_AT + 4].copy_from_slice(&count.to_le_bytes());
        bytes
    }

    #[test]
    fn a_huge_tensor_count_is_refused_before_an_allocation() {
        let err = CactFile::parse(with_num_tensors(u32::MAX)).unwrap_err();
        let needed = u32::MAX as u64 * RECORD_LEN as u64 + record_at(0) as u64;
        assert_eq!(err, FormatError::DirectoryPastEnd { count: u32::MAX, needed, len: IMAGE.len() as u64 });
        assert!(err.to_string().contains("num_tensors is 4294967295"), "{err}");
    }

    #[test]
    fn a_count_that_lies_within_the_file_is_caught_by_the_first_blob() {
        let real = CactFile::parse(IMAGE.clone()).unwrap().records.len() as u32;
        // More tensors than there are: the directory would swallow the first blobs.
        let err = CactFile::parse(with_num_tensors(real + 20)).unwrap_err();
        match &err {
            FormatError::Record { index: 0, problem: RecordProblem::InsideDirectory { count, .. }, .. } => {
                assert_eq!(*count, real + 20)
            }
            other => panic!("expected the first blob inside the directory, got {other}"),
        }
        assert!(err.to_string().contains("starts inside the directory"), "{err}");
        // Fewer: the blobs left out are bytes no tensor accounts for.
        for fewer in [0, 1, real - 1] {
            let err = CactFile::parse(with_num_tensors(fewer)).unwrap_err();
            assert!(matches!(err, FormatError::TrailingBytes { count, .. } if count == fewer), "{err}");
        }
    }

    #[test]
    fn every_truncation_is_an_error_naming_the_file_length() {
        for len in (0..IMAGE.len()).step_by(97) {
            let err = CactFile::parse(IMAGE[..len].to_vec()).expect_err("a cut image");
            let text = err.to_string();
            assert!(text.contains(&format!("{len} bytes")) || text.contains(&format!("{len}-byte")), "{len}: {text}");
        }
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

    #[test]
    fn a_weight_bits_map_sets_each_tensors_width_including_ternary() {
        let mut ckpt = random_checkpoint(&small_config(), true, 1).unwrap();
        ckpt.config.weight_bits = "default=4,attn.q_proj=2,embedding=3,engram=1.58".into();
        let bits = BitsChoice::resolve(None, &ckpt.config).unwrap();
        let built = build_cact(&ckpt, &bits, &placeholder_tokenizer_blob(32)).unwrap();
        let file = CactFile::parse(built.bytes).unwrap();
        // The reader recovers every position's name from the header alone.
        let read_names: Vec<&String> = file.records.iter().map(|r| &r.name).collect();
        assert_eq!(read_names, built.names.iter().collect::<Vec<_>>());
        let width = |name: &str| file.records.iter().find(|r| r.name == name).and_then(|r| r.bits());
        assert_eq!(width("embedding"), Some(Bits::Three));
        assert_eq!(width("layer01.q_proj"), Some(Bits::Two));
        assert_eq!(width("layer01.k_proj"), Some(Bits::Four));
        assert_eq!(width("engram0.tables"), Some(Bits::Ternary));
        assert_eq!(width("mhc_phi_res"), Some(Bits::Four));
        assert_eq!(width("layer00.norm_in"), None);
        file.verify().unwrap();
        assert_eq!(
            bits,
            BitsChoice::Map {
                spec: ckpt.config.weight_bits.clone(),
                map: BitsMap::parse(&ckpt.config.weight_bits).unwrap()
            }
        );
    }
}
