//! The structure of a safetensors file (Needle 3's checkpoints, and the adapters of both
//! generations), with messages that say what is wrong and where.
//!
//! The layout: 8 bytes holding the header's length `n` (a little-endian u64), `n` bytes of JSON
//! (`{"__metadata__": {str: str}, name: {"dtype", "shape", "data_offsets": [begin, end]}, ...}`),
//! then the data: each tensor's bytes at its `data_offsets`, counted from the data's start, one
//! after another with no gap, the last ending at the end of the file.
//!
//! The `safetensors` crate validates a file; when it refuses one, its error only names the rule
//! (`TensorInvalidInfo`, `InvalidOffset("…")`), so [`explain`] walks the same structure again to
//! find the byte, the tensor and the numbers that break it.

use std::collections::HashMap;

use safetensors::tensor::{SafeTensorError, SafeTensors, TensorInfo};

/// Where the JSON header starts: after its length.
const HEADER_START: usize = 8;

/// The largest header the `safetensors` crate reads (its `MAX_HEADER_SIZE`).
pub const MAX_HEADER: u64 = 100_000_000;

/// What is wrong with a file's safetensors structure; each message starts with "its" or "tensor",
/// to follow the file's name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SafetensorsProblem {
    #[error("it is {len} bytes long, shorter than the 8-byte header length a safetensors file starts with")]
    TooShort { len: usize },
    #[error("its header length (bytes 0..8) is {header_len}, more than the {MAX_HEADER} bytes a safetensors header may take")]
    HeaderTooLarge { header_len: u64 },
    #[error(
        "its header length (bytes 0..8) is {header_len}, but only {available} bytes follow; the file is cut short \
         or its first bytes are damaged"
    )]
    HeaderPastEnd { header_len: u64, available: usize },
    #[error("its header (bytes 8..{end}) is not UTF-8 text: byte {at} is not")]
    HeaderNotUtf8 { end: usize, at: usize },
    #[error("its header (bytes 8..{end}) is not a JSON object: {reason}")]
    HeaderJson { end: usize, reason: String },
    #[error("its header's `__metadata__` must map names to strings: {reason}")]
    Metadata { reason: String },
    #[error("tensor `{name}` {problem}")]
    Tensor { name: String, problem: String },
    #[error("its tensors' data ends at byte {end}, but the file goes on to byte {len}: {} bytes belong to no tensor", len - end)]
    TrailingData { end: usize, len: usize },
    /// A refusal [`explain`] did not find the place of (the crate's own rule, in words).
    #[error("{0}")]
    Other(String),
}

/// The file's tensors and its string metadata (empty when it has none).
pub fn parse(bytes: &[u8]) -> Result<(SafeTensors<'_>, HashMap<String, String>), SafetensorsProblem> {
    let refused = |error: SafeTensorError| explain(bytes).err().unwrap_or_else(|| describe(&error));
    let (_, header) = SafeTensors::read_metadata(bytes).map_err(refused)?;
    let tensors = SafeTensors::deserialize(bytes).map_err(refused)?;
    Ok((tensors, header.metadata().clone().unwrap_or_default()))
}

/// The first rule of the format `bytes` break, with its place; `Ok` when the structure holds.
pub fn explain(bytes: &[u8]) -> Result<(), SafetensorsProblem> {
    let len = bytes.len();
    let Some(&length) = bytes.first_chunk::<HEADER_START>() else {
        return Err(SafetensorsProblem::TooShort { len });
    };
    let header_len = u64::from_le_bytes(length);
    if header_len > MAX_HEADER {
        return Err(SafetensorsProblem::HeaderTooLarge { header_len });
    }
    let available = len - HEADER_START;
    // At most MAX_HEADER, so it fits a usize.
    let end = HEADER_START + header_len as usize;
    if end > len {
        return Err(SafetensorsProblem::HeaderPastEnd { header_len, available });
    }
    let text = std::str::from_utf8(&bytes[HEADER_START..end])
        .map_err(|e| SafetensorsProblem::HeaderNotUtf8 { end, at: HEADER_START + e.valid_up_to() })?;
    let header: serde_json::Map<String, serde_json::Value> = serde_json::from_str(text).map_err(|e| {
        let at = HEADER_START + byte_of(text, e.line(), e.column());
        SafetensorsProblem::HeaderJson { end, reason: format!("{} at byte {at}", json_reason(&e)) }
    })?;
    let mut entries = Vec::new();
    for (name, value) in header {
        if name == "__metadata__" {
            serde_json::from_value::<Option<HashMap<String, String>>>(value)
                .map_err(|e| SafetensorsProblem::Metadata { reason: json_reason(&e) })?;
            continue;
        }
        let entry: TensorInfo = serde_json::from_value(value).map_err(|e| SafetensorsProblem::Tensor {
            name: name.clone(),
            problem: format!("is not {{\"dtype\", \"shape\", \"data_offsets\"}} in the header: {}", json_reason(&e)),
        })?;
        entries.push((name, entry));
    }
    check_data(entries, end, len)
}

/// The tensors' data, in offset order as the format lays it out: each one's size is what its shape
/// and dtype need, each begins where the one before it ended, and the last ends at the file's end.
fn check_data(mut entries: Vec<(String, TensorInfo)>, data_start: usize, len: usize) -> Result<(), SafetensorsProblem> {
    entries.sort_by_key(|(_, entry)| entry.data_offsets);
    let mut expected_begin = 0;
    let mut previous: Option<String> = None;
    for (name, entry) in entries {
        let problem = |problem: String| SafetensorsProblem::Tensor { name: name.clone(), problem };
        let (begin, end) = entry.data_offsets;
        let at = |offset: usize| data_start.saturating_add(offset);
        if begin != expected_begin {
            let after = match &previous {
                Some(previous) => format!("the tensor before it, `{previous}`, ends at byte {}", at(expected_begin)),
                None => format!("the data begins at byte {data_start}"),
            };
            return Err(problem(format!(
                "begins at byte {} (data_offsets [{begin}, {end}]), but {after}; tensors must follow each other \
                 with no gap and no overlap",
                at(begin)
            )));
        }
        if end < begin {
            return Err(problem(format!("has data_offsets [{begin}, {end}], which end before they begin")));
        }
        let bytes = entry.shape.iter().try_fold(entry.dtype.size(), |n, &d| n.checked_mul(d));
        let Some(bytes) = bytes else {
            return Err(problem(format!("has shape {:?}, too many {:?} values to count", entry.shape, entry.dtype)));
        };
        if end - begin != bytes {
            return Err(problem(format!(
                "has shape {:?} of {:?}, which takes {bytes} bytes, but its data_offsets [{begin}, {end}] hold {}",
                entry.shape,
                entry.dtype,
                end - begin
            )));
        }
        if at(end) > len {
            return Err(problem(format!("ends at byte {}, past the end of the {len}-byte file", at(end))));
        }
        expected_begin = end;
        previous = Some(name);
    }
    match data_start + expected_begin {
        end if end < len => Err(SafetensorsProblem::TrailingData { end, len }),
        _ => Ok(()),
    }
}

/// The crate's refusal (of a file, or of tensors to write) in words.
pub fn describe(error: &SafeTensorError) -> SafetensorsProblem {
    let text = match error {
        SafeTensorError::InvalidHeader => "its header is not UTF-8 text".to_owned(),
        SafeTensorError::InvalidHeaderStart => "its header does not begin with `{`".to_owned(),
        SafeTensorError::InvalidHeaderDeserialization => "its header is not the JSON safetensors describes".to_owned(),
        SafeTensorError::HeaderTooLarge => format!("its header is larger than {MAX_HEADER} bytes"),
        SafeTensorError::HeaderTooSmall => "it is shorter than the 8-byte header length".to_owned(),
        SafeTensorError::InvalidHeaderLength => "its header length runs past the end of the file".to_owned(),
        SafeTensorError::TensorNotFound(name) => format!("it has no tensor `{name}`"),
        SafeTensorError::TensorInvalidInfo => {
            "a tensor's data_offsets do not hold what its shape and dtype need".to_owned()
        }
        SafeTensorError::InvalidOffset(name) => {
            format!("tensor `{name}`'s data_offsets do not follow the tensor before it")
        }
        SafeTensorError::IoError(error) => format!("it could not be read: {error}"),
        SafeTensorError::JsonError(error) => format!("its header is not JSON: {error}"),
        SafeTensorError::InvalidTensorView(dtype, shape, bytes) => {
            format!("a {dtype:?} tensor of shape {shape:?} cannot be made of {bytes} bytes")
        }
        SafeTensorError::MetadataIncompleteBuffer => {
            "its tensors' data_offsets do not cover the data up to the end of the file".to_owned()
        }
        SafeTensorError::ValidationOverflow => "a tensor's shape holds too many values to count".to_owned(),
    };
    SafetensorsProblem::Other(text)
}

/// serde_json's message without its " at line L column C" suffix (the caller says where).
fn json_reason(error: &serde_json::Error) -> String {
    let message = error.to_string();
    match message.rsplit_once(" at line ") {
        Some((reason, _)) => reason.to_owned(),
        None => message,
    }
}

/// The byte offset in `text` of serde_json's 1-based line and column.
fn byte_of(text: &str, line: usize, column: usize) -> usize {
    let line_start: usize = text.split_inclusive('\n').take(line.saturating_sub(1)).map(str::len).sum();
    (line_start + column.saturating_sub(1)).min(text.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A safetensors file of float32 tensors `(name, shape, data_offsets)` over `data_len` bytes of data.
    fn file(tensors: &[(&str, &[usize], [usize; 2])], data_len: usize) -> Vec<u8> {
        let mut header = serde_json::Map::new();
        header.insert("__metadata__".into(), serde_json::json!({"format_version": "2"}));
        for (name, shape, offsets) in tensors {
            header.insert((*name).into(), serde_json::json!({"dtype": "F32", "shape": shape, "data_offsets": offsets}));
        }
        let mut text = serde_json::to_vec(&header).unwrap();
        text.resize(text.len().next_multiple_of(8), b' ');
        [&(text.len() as u64).to_le_bytes()[..], &text, &vec![0u8; data_len]].concat()
    }

    fn refused(bytes: &[u8]) -> String {
        let problem = parse(bytes).map(|_| ()).expect_err("refused").to_string();
        for debug_name in ["TensorInvalidInfo", "InvalidOffset", "MetadataIncompleteBuffer", "InvalidHeader"] {
            assert!(!problem.contains(debug_name), "a bare error name: {problem}");
        }
        problem
    }

    #[test]
    fn a_sound_file_parses_with_its_metadata() {
        let bytes = file(&[("a", &[2], [0, 8]), ("b", &[1, 3], [8, 20])], 20);
        let (tensors, metadata) = parse(&bytes).unwrap();
        assert_eq!((tensors.len(), metadata["format_version"].as_str()), (2, "2"));
        explain(&bytes).unwrap();
    }

    #[test]
    fn each_broken_rule_is_named_with_its_tensor_and_bytes() {
        let overlap = file(&[("a", &[2], [0, 8]), ("b", &[1, 3], [4, 16])], 16);
        let start = overlap.len() - 16;
        assert_eq!(
            refused(&overlap),
            format!(
                "tensor `b` begins at byte {} (data_offsets [4, 16]), but the tensor before it, `a`, ends at byte {}; \
                 tensors must follow each other with no gap and no overlap",
                start + 4,
                start + 8
            )
        );
        let size = file(&[("a", &[3], [0, 8])], 8);
        assert_eq!(
            refused(&size),
            "tensor `a` has shape [3] of F32, which takes 12 bytes, but its data_offsets [0, 8] hold 8"
        );
        let cut = file(&[("a", &[2], [0, 8])], 4);
        assert!(refused(&cut).starts_with("tensor `a` ends at byte"), "{}", refused(&cut));
        let trailing = file(&[("a", &[2], [0, 8])], 12);
        assert!(refused(&trailing).ends_with("4 bytes belong to no tensor"), "{}", refused(&trailing));
        let entry = br#"{"a":{"dtype":"F4","shape":[1],"data_offsets":[0,1]}}"#;
        let unknown = [&(entry.len() as u64).to_le_bytes()[..], entry, &[0]].concat();
        assert!(refused(&unknown).starts_with("tensor `a` is not {\"dtype\", \"shape\", \"data_offsets\"}"));
    }

    #[test]
    fn a_damaged_header_is_placed() {
        assert_eq!(
            refused(&[1, 2, 3]),
            "it is 3 bytes long, shorter than the 8-byte header length a safetensors file starts with"
        );
        let mut long = file(&[("a", &[2], [0, 8])], 8);
        long[..8].copy_from_slice(&1000u64.to_le_bytes());
        assert!(refused(&long).starts_with("its header length (bytes 0..8) is 1000, but only"), "{}", refused(&long));
        let mut huge = long.clone();
        huge[..8].copy_from_slice(&(1u64 << 40).to_le_bytes());
        assert!(refused(&huge).contains("more than the 100000000 bytes"), "{}", refused(&huge));
        let not_json = [&8u64.to_le_bytes()[..], b"{\"a\": }  "].concat();
        assert!(
            refused(&not_json).starts_with("its header (bytes 8..16) is not a JSON object: "),
            "{}",
            refused(&not_json)
        );
        assert!(refused(&not_json).ends_with("at byte 14"), "{}", refused(&not_json));
    }
}
