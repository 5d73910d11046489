//! Fixture-driven tests: every `tests/fixtures/pickles/NAME.pkl` (written by `make_pickle_cases.py` with
//! real numpy 1.x and 2.x) is read and compared with `NAME.json`; the reference-made checkpoints in
//! `tests/fixtures/models/` are checked against their `golden/<stem>/meta.json`; and mutated checkpoints
//! must give errors, never panics.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use proptest::prelude::*;
use serde_json::Value as J;

use super::pickle::{self, PyValue};
use super::*;
use crate::config::ModelConfig;

const PICKLES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/pickles");
const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures");

/// The fixture cases whose expectation JSON has top-level key `kind`, as (name, pickle path, expectation).
fn cases(kind: &str) -> Vec<(String, PathBuf, J)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(PICKLES).expect("tests/fixtures/pickles exists") {
        let path = entry.expect("directory entry").path();
        if path.extension().is_some_and(|e| e == "pkl") {
            let json_path = path.with_extension("json");
            let text = std::fs::read_to_string(&json_path).unwrap_or_else(|e| panic!("{}: {e}", json_path.display()));
            let json: J = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", json_path.display()));
            if let Some(expected) = json.get(kind) {
                let name = path.file_stem().and_then(|s| s.to_str()).unwrap_or_default().to_owned();
                out.push((name, path, expected.clone()));
            }
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    assert!(!out.is_empty(), "no `{kind}` cases in {PICKLES}");
    out
}

/// Compares a parsed value with its description, returning the first difference with its place.
fn compare(actual: &PyValue, expected: &J, at: &str) -> Result<(), String> {
    let mismatch = || Err(format!("{at}: got {actual:?}, expected {expected}"));
    match (actual, expected) {
        (PyValue::None, J::Null) => Ok(()),
        (PyValue::Bool(a), J::Bool(e)) if a == e => Ok(()),
        (_, J::Object(obj)) => {
            let Some((tag, inner)) = obj.iter().next() else {
                return mismatch();
            };
            match (tag.as_str(), actual) {
                ("int", PyValue::Int(a)) if inner.as_i64() == Some(*a) => Ok(()),
                ("bigint_le_hex", PyValue::BigInt(a)) if inner.as_str() == Some(&hex(a)) => Ok(()),
                ("float", PyValue::Float(a)) if float_matches(*a, inner) => Ok(()),
                ("str", PyValue::Str(a)) if inner.as_str() == Some(a) => Ok(()),
                ("bytes", PyValue::Bytes(a)) if inner.as_str() == Some(&hex(a)) => Ok(()),
                ("list", PyValue::List(items)) | ("tuple", PyValue::Tuple(items)) | ("set", PyValue::Set(items)) => {
                    compare_items(items, inner, at)
                }
                ("dict", PyValue::Dict(pairs)) => {
                    let expected = inner.as_array().ok_or_else(|| format!("{at}: expectation is not a list"))?;
                    if pairs.len() != expected.len() {
                        return Err(format!("{at}: {} pairs, expected {}", pairs.len(), expected.len()));
                    }
                    pairs.iter().zip(expected).try_for_each(|((k, v), pair)| {
                        compare(k, &pair[0], &format!("{at} key"))?;
                        compare(v, &pair[1], &format!("{at}[{}]", pair[0]))
                    })
                }
                ("array", PyValue::Array(a)) => compare_array(a, inner).map_err(|e| format!("{at}: {e}")),
                _ => mismatch(),
            }
        }
        _ => mismatch(),
    }
}

fn compare_items(items: &[PyValue], expected: &J, at: &str) -> Result<(), String> {
    let expected = expected.as_array().ok_or_else(|| format!("{at}: expectation is not a list"))?;
    if items.len() != expected.len() {
        return Err(format!("{at}: {} items, expected {}", items.len(), expected.len()));
    }
    items.iter().zip(expected).enumerate().try_for_each(|(i, (a, e))| compare(a, e, &format!("{at}[{i}]")))
}

fn float_matches(actual: f64, expected: &J) -> bool {
    match expected {
        J::String(s) => s == &actual.to_string(),
        number => number.as_f64().is_some_and(|e| e.to_bits() == actual.to_bits()),
    }
}

/// dtype, shape, exact little-endian C-order bytes, and `to_f32` against the listed values.
fn compare_array(actual: &NdArray, expected: &J) -> Result<(), String> {
    let dtype = expected["dtype"].as_str().unwrap_or_default();
    let shape: Vec<usize> = serde_json::from_value(expected["shape"].clone()).map_err(|e| e.to_string())?;
    if actual.dtype.name() != dtype || actual.shape != shape {
        return Err(format!("{} {:?}, expected {dtype} {shape:?}", actual.dtype, actual.shape));
    }
    if expected["data"].as_str() != Some(&hex(&actual.data)) {
        return Err(format!("data {}, expected {}", hex(&actual.data), expected["data"]));
    }
    let values: Vec<f32> = expected["values"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|v| v.as_f64().or_else(|| v.as_bool().map(f64::from)).unwrap_or(f64::NAN) as f32)
        .collect();
    if actual.to_f32() != values {
        return Err(format!("to_f32 {:?}, expected {values:?}", actual.to_f32()));
    }
    Ok(())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn strings(expected: &J, key: &str) -> Vec<String> {
    serde_json::from_value(expected[key].clone()).unwrap_or_default()
}

fn assert_contains_all(name: &str, message: &str, needles: &[String]) {
    assert!(!needles.is_empty(), "{name}: expectation lists no message fragments");
    for needle in needles {
        assert!(message.contains(needle.as_str()), "{name}: message {message:?} lacks {needle:?}");
    }
}

#[test]
fn plain_values_and_arrays_of_every_protocol_and_numpy_match_python() {
    let all = cases("expect");
    for protocol in 2..=5 {
        for family in ["np1_arrays", "np2_arrays", "values"] {
            let name = format!("{family}_p{protocol}");
            assert!(all.iter().any(|(n, ..)| *n == name), "missing fixture {name}");
        }
    }
    for (name, path, expected) in all {
        let bytes = std::fs::read(&path).expect("fixture readable");
        let value = pickle::parse(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        if let Err(difference) = compare(&value, &expected, &name) {
            panic!("{difference}");
        }
    }
}

#[test]
fn hostile_and_broken_pickles_are_refused_with_offsets() {
    for (name, path, expected) in cases("error") {
        let bytes = std::fs::read(&path).expect("fixture readable");
        let err = match pickle::parse(&bytes) {
            Ok(value) => panic!("{name}: parsed to {value:?}"),
            Err(err) => err,
        };
        if let Some(offset) = expected["offset"].as_u64() {
            assert_eq!(err.offset as u64, offset, "{name}: {err}");
        }
        assert_contains_all(&name, &err.to_string(), &strings(&expected, "contains"));
    }
}

#[test]
fn mini_checkpoints_flatten_params_and_resolve_config_like_the_reference() {
    for (name, path, expected) in cases("checkpoint") {
        let ckpt = Checkpoint::load(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
        let params = expected["params"].as_object().expect("params object");
        assert_eq!(ckpt.params.keys().cloned().collect::<Vec<_>>(), sorted(params.keys().cloned().collect()), "{name}");
        for (param, description) in params {
            if let Err(difference) = compare_array(ckpt.param(param).expect("listed param"), description) {
                panic!("{name}: {param}: {difference}");
            }
        }
        let config: ModelConfig = serde_json::from_value(expected["config"].clone()).expect("reference config");
        assert_eq!(ckpt.config, config, "{name}");
        assert_eq!(ckpt.step, expected["step"].as_i64(), "{name}");
        assert_eq!(ckpt.source, path);
    }
}

#[test]
fn malformed_checkpoints_name_the_file_and_the_problem() {
    for (name, path, expected) in cases("checkpoint_error") {
        let err = Checkpoint::load(&path).err().unwrap_or_else(|| panic!("{name}: loaded"));
        let message = err.to_string();
        assert!(message.contains(&path.display().to_string()), "{name}: {message}");
        assert_contains_all(&name, &message, &strings(&expected, "contains"));
    }
}

#[test]
fn adapters_load_with_factors_scale_base_and_rank() {
    for (name, path, expected) in cases("adapter") {
        let adapter = PickledAdapter::load(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
        let lora = expected["lora"].as_object().expect("lora object");
        assert_eq!(adapter.lora.keys().cloned().collect::<Vec<_>>(), sorted(lora.keys().cloned().collect()), "{name}");
        for (target, factors) in &adapter.lora {
            for (part, array) in [("A", &factors.a), ("B", &factors.b)] {
                if let Err(difference) = compare_array(array, &lora[target][part]) {
                    panic!("{name}: {target}/{part}: {difference}");
                }
            }
        }
        assert_eq!(Some(adapter.scale), expected["scale"].as_f64());
        assert_eq!(Some(adapter.base.as_str()), expected["base"].as_str());
        assert_eq!(Some(adapter.rank as u64), expected["rank"].as_u64());
    }
    for (name, path, expected) in cases("adapter_error") {
        let message = PickledAdapter::load(&path).err().unwrap_or_else(|| panic!("{name}: loaded")).to_string();
        assert_contains_all(&name, &message, &strings(&expected, "contains"));
    }
}

#[test]
fn missing_file_and_missing_param_errors_name_what_is_missing() {
    let nowhere = Path::new("/nonexistent/needle/ckpt.pkl");
    let err = Checkpoint::load(nowhere).unwrap_err();
    assert!(
        matches!(err, CheckpointError::Io { .. }) && err.to_string().contains("/nonexistent/needle/ckpt.pkl"),
        "{err}"
    );

    let path = Path::new(PICKLES).join("checkpoint_v2.pkl");
    let ckpt = Checkpoint::load(&path).expect("mini checkpoint");
    let message = ckpt.param("stack/layers/block/self_attn/k_proj/kernel").unwrap_err().to_string();
    assert!(message.contains("`stack/layers/block/self_attn/k_proj/kernel`"), "{message}");
    assert!(message.contains("checkpoint_v2.pkl"), "{message}");
}

/// The reference-made fixture checkpoints against the parameter list and config the reference itself
/// reported in `golden/<stem>/meta.json`, and each golden adapter against its LoRA target list.
#[test]
fn reference_fixture_checkpoints_and_adapters_match_their_meta() {
    for stem in ["tiny_f32", "tiny_f16", "pretrained"] {
        let golden = Path::new(FIXTURES).join("golden").join(stem);
        let meta_path = golden.join("meta.json");
        let meta_bytes = std::fs::read(&meta_path).unwrap_or_else(|e| panic!("{}: {e}", meta_path.display()));
        let meta: J = serde_json::from_slice(&meta_bytes).expect("meta.json is JSON");
        let ckpt = Checkpoint::load(&Path::new(FIXTURES).join("models").join(format!("{stem}.pkl")))
            .unwrap_or_else(|e| panic!("{e}"));
        let listed = meta["params"].as_array().expect("params list");
        assert_eq!(ckpt.params.len(), listed.len(), "{stem}");
        for entry in listed {
            let array = ckpt.param(entry["path"].as_str().expect("path")).unwrap_or_else(|e| panic!("{e}"));
            let shape: Vec<usize> = serde_json::from_value(entry["shape"].clone()).expect("shape");
            assert_eq!(array.shape, shape, "{stem} {}", entry["path"]);
            assert_eq!(Some(array.dtype.name()), entry["dtype"].as_str(), "{stem} {}", entry["path"]);
        }
        let count: usize = ckpt.params.values().map(NdArray::len).sum();
        assert_eq!(Some(count as u64), meta["param_count"].as_u64(), "{stem}");
        let config: ModelConfig = serde_json::from_value(meta["config"].clone()).expect("meta config");
        assert_eq!(ckpt.config, config, "{stem}");

        let adapter = PickledAdapter::load(&golden.join("adapter.pkl")).unwrap_or_else(|e| panic!("{e}"));
        let targets: Vec<String> = strings(&meta, "lora_target_paths");
        assert_eq!(adapter.lora.keys().cloned().collect::<Vec<_>>(), sorted(targets), "{stem}");
        for (target, factors) in &adapter.lora {
            let weight = ckpt.param(target).expect("adapted weight exists");
            assert!(weight.shape.len() >= 2, "{stem} {target}: {:?} is not a matrix stack", weight.shape);
            let (lead, matrix) = weight.shape.split_at(weight.shape.len() - 2);
            assert_eq!(factors.a.shape, [lead, &[matrix[0], adapter.rank]].concat(), "{stem} {target} A");
            assert_eq!(factors.b.shape, [lead, &[adapter.rank, matrix[1]]].concat(), "{stem} {target} B");
        }
    }
}

/// The checkpoints `make_hostile.py` writes to ask a careless reader for hundreds of GB, a 4 TiB
/// allocation or a division by zero: each is refused at load, naming the file, the place and the
/// expectation, with nothing large allocated (the suite passes under `ulimit -v 4000000`).
#[test]
fn hostile_checkpoints_are_refused_at_load_with_the_place_and_the_limit() {
    let hostile = Path::new(FIXTURES).join("hostile");
    for (name, needles) in [
        // 150 000 `_codecs.encode` calls on one memoized 768 KiB text: 115 GB of copies.
        (
            "pickle-amplification.pkl",
            &["is not a readable pickle: at byte ", "_codecs.encode would take", "past 7194704 bytes"][..],
        ),
        // 40 000 arrays BUILT from one memoized 256 KiB buffer: 10 GB of copies.
        ("pickle-build-amplification.pkl", &["at byte ", "BUILD would take", "past 3377864 bytes"]),
        ("config-huge-lanes.pkl", &["config value `mhc_lanes` is 1099511627776; it must be in 1..=64"]),
        (
            "config-engram-heads-wrap.pkl",
            &["config value `engram_heads` is 4611686018427387904; it must be in 0..=1024"],
        ),
        (
            "build-zero-sized-huge-dims.pkl",
            &["parameter `confidence_head/proj/kernel` has shape [0, 1099511627776], which holds no elements"],
        ),
    ] {
        let path = hostile.join(name);
        let message = Checkpoint::load(&path).err().unwrap_or_else(|| panic!("{name}: loaded")).to_string();
        assert!(message.contains(&path.display().to_string()), "{name}: {message}");
        for needle in needles {
            assert!(message.contains(needle), "{name}: {message:?} lacks {needle:?}");
        }
    }
}

#[test]
fn an_empty_lora_factor_is_refused_by_name() {
    let empty = NdArray { dtype: DType::F32, shape: vec![1 << 40, 0], data: Vec::new() };
    let b = NdArray { dtype: DType::F32, shape: vec![1, 1], data: vec![0; 4] };
    let target = "stack/layers/block/self_attn/q_proj/kernel".to_string();
    let adapter = PickledAdapter {
        source: PathBuf::new(),
        lora: BTreeMap::from([(target, LoraFactors { a: empty, b })]),
        scale: 1.0,
        base: "base.pkl".into(),
        rank: 1,
    };
    let file = tempfile::NamedTempFile::new().expect("temporary file");
    std::fs::write(file.path(), writer::adapter_pickle(&adapter)).expect("written");
    let message = PickledAdapter::load(file.path()).unwrap_err().to_string();
    assert!(
        message.contains("parameter `lora/stack/layers/block/self_attn/q_proj/kernel/A` has shape [1099511627776, 0]"),
        "{message}"
    );
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

/// Structure-aware mutations of a real checkpoint: byte flips, insertions, deletions and truncations.
fn mutated_checkpoint() -> impl Strategy<Value = Vec<u8>> {
    let original = std::fs::read(Path::new(PICKLES).join("checkpoint_v2_f16_p2.pkl")).expect("fixture");
    let len = original.len();
    let edit = (0..len, any::<u8>(), 0u8..4);
    (proptest::collection::vec(edit, 1..8), 0..=len).prop_map(move |(edits, cut)| {
        let mut bytes = original.clone();
        for (at, byte, kind) in edits {
            let at = at.min(bytes.len().saturating_sub(1));
            match kind {
                0 => bytes[at] = byte,
                1 => bytes.insert(at, byte),
                2 if !bytes.is_empty() => {
                    bytes.remove(at);
                }
                _ => bytes[at] ^= 1 << (byte % 8),
            }
        }
        bytes.truncate(cut.max(1));
        bytes
    })
}

/// Short programs of real opcodes with small operands: reaches VM states that byte noise rarely does.
fn opcode_soup() -> impl Strategy<Value = Vec<u8>> {
    const OPCODES: &[u8] = b"(.012JKMNRXabc}ehjl]qrstu)G\x80\x81\x85\x86\x87\x88\x89\x8a\x8b\x8c\x8d\x8e\x8f\x90\x91\x92\x93\x94\x95\x96BC";
    let token = (proptest::sample::select(OPCODES), proptest::collection::vec(0u8..4, 0..5));
    proptest::collection::vec(token, 0..64).prop_map(|tokens| {
        let mut bytes = b"\x80\x04".to_vec();
        for (opcode, operand) in tokens {
            bytes.push(opcode);
            bytes.extend(operand);
        }
        bytes
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn mutated_checkpoints_never_panic(bytes in mutated_checkpoint()) {
        // Ok or Err are both fine; a panic fails the property.
        let _ = pickle::parse(&bytes);
    }

    #[test]
    fn opcode_soup_never_panics(bytes in opcode_soup()) {
        let _ = pickle::parse(&bytes);
    }
}

#[test]
fn the_generation_is_told_from_the_file() {
    let read = |name: &str| std::fs::read(Path::new(FIXTURES).join("models").join(name)).unwrap();
    assert_eq!(generation(&read("tiny_f32.pkl")), Some(Generation::Needle2));
    assert_eq!(generation(&read("needle3_tiny.safetensors")), Some(Generation::Needle3));
    assert_eq!(generation(b"{\"lora\": 1}"), None);
}

#[test]
fn a_files_generation_is_read_from_its_first_bytes() {
    let at = |rel: &str| Path::new(FIXTURES).join(rel);
    assert_eq!(file_generation(&at("models/tiny_f32.pkl")), Some(Generation::Needle2));
    assert_eq!(file_generation(&at("models/needle3_tiny.safetensors")), Some(Generation::Needle3));
    // A safetensors file without the checkpoint metadata (an adapter), a tokenizer, nothing at all.
    assert_eq!(file_generation(&at("golden/needle3_tiny/lora.safetensors")), None);
    assert_eq!(file_generation(&at("models/tokenizer.model")), None);
    assert_eq!(file_generation(&at("models/absent.pkl")), None);
}

#[test]
fn a_bfloat16_needle3_checkpoint_keeps_its_type_and_widens_exactly() {
    use safetensors::tensor::{Dtype, SafeTensors, TensorView};
    let path = Path::new(FIXTURES).join("models/needle3_tiny.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let (_, header) = SafeTensors::read_metadata(&bytes).unwrap();
    let source = SafeTensors::deserialize(&bytes).unwrap();
    // Each float32 value cut to its top 16 bits: a bfloat16 whose widening is exact.
    let halves: Vec<(String, Vec<usize>, Vec<u8>)> = source
        .tensors()
        .into_iter()
        .map(|(name, view)| {
            let top = view.data().chunks_exact(4).flat_map(|b| [b[2], b[3]]).collect();
            (name, view.shape().to_vec(), top)
        })
        .collect();
    let views = halves
        .iter()
        .map(|(name, shape, data)| (name.clone(), TensorView::new(Dtype::BF16, shape.clone(), data).unwrap()));
    let dir = tempfile::tempdir().unwrap();
    let bf16 = dir.path().join("needle3_bf16.safetensors");
    safetensors::serialize_to_file(views, header.metadata(), &bf16).unwrap();

    let (wide, narrow) = (Checkpoint::load(&path).unwrap(), Checkpoint::load(&bf16).unwrap());
    assert_eq!(narrow.config, wide.config);
    for (name, array) in &narrow.params {
        // Kept as stored, so `needle build` can merge an adapter in bfloat16 as 3.x does.
        assert_eq!(array.dtype, DType::BF16, "{name}");
        assert_eq!(array.data, halves.iter().find(|(n, ..)| n == name).unwrap().2, "{name}");
        let cut: Vec<f32> =
            wide.params[name].to_f32().iter().map(|v| f32::from_bits(v.to_bits() & 0xFFFF_0000)).collect();
        assert_eq!(array.to_f32(), cut, "{name}");
    }
}

#[test]
fn needle3_checkpoints_read_as_the_reference_wrote_them() {
    for stem in ["needle3_tiny", "needle3_tiny_out"] {
        let checkpoint = Checkpoint::load(&Path::new(FIXTURES).join(format!("models/{stem}.safetensors"))).unwrap();
        let meta: J = serde_json::from_str(
            &std::fs::read_to_string(Path::new(FIXTURES).join(format!("golden/{stem}/meta.json"))).unwrap(),
        )
        .unwrap();
        let config = &checkpoint.config;
        assert_eq!(config.generation, Generation::Needle3);
        let want = &meta["config"];
        let count = |key: &str| want[key].as_u64().unwrap() as usize;
        let list =
            |key: &str| want[key].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as usize).collect::<Vec<_>>();
        assert_eq!(
            (config.d_model, config.qk_head_dim(), config.v_head_dim(), config.sliding_window, config.qkv_conv_taps),
            (
                count("d_model"),
                count("qk_head_dim"),
                count("v_head_dim"),
                count("sliding_window"),
                count("qkv_conv_taps")
            )
        );
        assert_eq!((config.out_vocab, config.engram_seed_heads), (count("out_vocab"), count("engram_seed_heads")));
        assert_eq!(
            (config.global_layers.clone(), config.engram_layers.clone()),
            (list("global_layers"), list("engram_layers"))
        );
        let params: Vec<(String, Vec<usize>)> =
            checkpoint.params.iter().map(|(path, array)| (path.clone(), array.shape.clone())).collect();
        let want: Vec<(String, Vec<usize>)> = meta["params"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| {
                let shape = p["shape"].as_array().unwrap().iter().map(|d| d.as_u64().unwrap() as usize).collect();
                (p["path"].as_str().unwrap().to_string(), shape)
            })
            .collect();
        assert_eq!(params, want, "{stem}");
        assert_eq!(checkpoint.step, Some(0));
    }
}
