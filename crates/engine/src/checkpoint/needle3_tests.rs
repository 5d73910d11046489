//! Reading Needle 3 checkpoints: the detection of one, and the errors a damaged one gives.

use safetensors::tensor::TensorView;

use std::collections::HashMap;

use safetensors::Dtype;

use super::*;

/// A Needle 3 checkpoint of one tensor `w` holding `data` (as `dtype`), with `metadata` beside a
/// filler entry that makes its header length `header_len` (a multiple of 8).
fn checkpoint(dtype: Dtype, shape: &[usize], data: &[u8], metadata: &[(&str, &str)], header_len: u64) -> Vec<u8> {
    (0..1024)
        .map(|width| {
            let mut entries: HashMap<String, String> =
                metadata.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
            entries.insert("filler".into(), "x".repeat(width));
            let view = TensorView::new(dtype, shape.to_vec(), data).unwrap();
            safetensors::serialize([("w", view)], &Some(entries)).unwrap()
        })
        .find(|bytes| bytes[..8] == header_len.to_le_bytes())
        .expect("a filler width gives the header length")
}

const SOUND: [(&str, &str); 2] = [("format_version", "2"), ("config", "{}")];

fn load(bytes: &[u8]) -> (Result<Checkpoint, CheckpointError>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    std::fs::write(&path, bytes).unwrap();
    (Checkpoint::load(&path), dir)
}

fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

#[test]
fn a_header_length_whose_low_byte_is_a_pickles_mark_is_still_safetensors() {
    // 0x280: byte 0 is 0x80 and byte 1 is 2, a protocol-2 pickle's first two bytes.
    let bytes = checkpoint(Dtype::F32, &[2], &f32_bytes(&[1.0, 2.0]), &SOUND, 0x280);
    assert_eq!(bytes[..2], [0x80, 0x02]);
    assert_eq!(generation(&bytes), Some(Generation::Needle3));
    let (loaded, dir) = load(&bytes);
    assert_eq!(loaded.unwrap().params["w"].to_f32(), [1.0, 2.0]);
    assert_eq!(file_generation(&dir.path().join("model.safetensors")), Some(Generation::Needle3));
    // Cut short, it is a damaged safetensors file, not a broken pickle.
    let (cut, _dir) = load(&bytes[..bytes.len() - 4]);
    let message = cut.unwrap_err().to_string();
    assert!(message.contains("is not a readable safetensors file: tensor `w` ends at byte"), "{message}");
    assert!(!message.contains("pickle"), "{message}");
}

#[test]
fn another_format_version_is_not_sent_to_needle_2() {
    let bytes = checkpoint(Dtype::F32, &[1], &f32_bytes(&[1.0]), &[("format_version", "3"), ("config", "{}")], 256);
    let message = load(&bytes).0.unwrap_err().to_string();
    assert!(message.contains("format_version=\"3\"") && message.contains("cactus-needle 3.x"), "{message}");
    assert!(!message.contains("2.x"), "{message}");
}

#[test]
fn a_safetensors_file_without_checkpoint_metadata_is_named_as_such() {
    let bytes = checkpoint(Dtype::F32, &[1], &f32_bytes(&[1.0]), &[("format_version", "2")], 256);
    let error = load(&bytes).0.unwrap_err();
    assert!(matches!(error, CheckpointError::NoCheckpointMetadata { key: "config", .. }), "{error}");
}

#[test]
fn a_non_finite_weight_is_refused_with_its_name_and_place() {
    let nan = checkpoint(Dtype::F32, &[2, 2], &f32_bytes(&[0.0, 1.0, f32::INFINITY, 2.0]), &SOUND, 256);
    let message = load(&nan).0.unwrap_err().to_string();
    assert!(message.contains("`w` holds inf at [1, 0]; weights must be finite numbers"), "{message}");
    // A bfloat16 NaN (0x7FC0).
    let bf16: Vec<u8> = [0x3F80u16, 0x7FC0].iter().flat_map(|v| v.to_le_bytes()).collect();
    let message = load(&checkpoint(Dtype::BF16, &[2], &bf16, &SOUND, 256)).0.unwrap_err().to_string();
    assert!(message.contains("`w` holds NaN at [1]"), "{message}");
}

#[test]
fn a_file_of_neither_kind_says_what_it_begins_with() {
    let (error, _dir) = load(b"version https://git-lfs.github.com/spec/v1\n");
    let message = error.unwrap_err().to_string();
    assert!(message.contains("is neither a Needle 2 checkpoint"), "{message}");
    assert!(message.contains("it begins with the bytes 76 65 72 73"), "{message}");
}
