//! Agreement with the reference exporters: every Needle 2 fixture checkpoint, W4 and W2, with and
//! without its adapter, against the `.cact` goldens 2.0.8's `write_export` produced, and the Needle 3
//! build fixture as 3.2.8's `needle build` exports it — whole, with an adapter, and as a rung of the
//! depth ladder — and the bfloat16 Needle 3 fixture, whole and with an adapter, which must agree
//! byte for byte (see tests/fixtures/README.md).
//!
//! Header, codebooks, directory, FP16 and RAW blobs must be byte-identical. CQ indices may differ
//! only where two correct float32 Hadamard rotations round a coordinate onto opposite sides of a
//! decision boundary (the reference multiplies by a dense matrix, we run a butterfly): ≥ 99.999%
//! identical, and every fp16 norm within 1 ulp.

use std::path::{Path, PathBuf};

use half::f16;

use super::format::header_len;
use super::layout::HEADS_MANIFEST;
use super::{build_cact, export, Bits, BitsChoice, CactFile, ExportEvent, ExportOptions, TensorKind};
use crate::checkpoint::{Checkpoint, DType, NdArray, PickledAdapter};
use crate::confidence::{companion_path, Calibration, ConfidenceHead, Reading, TrainedHead};
use crate::config::ModelConfig;
use crate::generation::Generation;
use crate::lora::{load_adapter, merge_into_checkpoint, save_adapter, AdapterMeta, Lora};
use crate::model::Params;
use crate::quant::{cq_split, header_codebooks};
use crate::tokenizer::Tokenizer;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures");

fn fixture(rel: &str) -> PathBuf {
    Path::new(FIXTURES).join(rel)
}

/// Difference of two fp16 values in units in the last place (same-sign finite values).
fn ulp_distance(a: f16, b: f16) -> u16 {
    a.to_bits().abs_diff(b.to_bits())
}

/// Compares our image with the golden one; `label` names the case in failures.
fn assert_agrees(ours: &CactFile, gold: &CactFile, label: &str) {
    assert_eq!(ours.preamble(), gold.preamble(), "{label}: header/codebooks/directory differ");
    assert_blobs_agree(ours, gold, (0..gold.records.len()).map(|i| (i, i)), label);
}

/// Compares the blobs of our records with the golden ones they are paired with (`(ours, gold)`
/// indices): FP16, FP32 and RAW byte for byte, CQ as [`assert_agrees`] allows.
fn assert_blobs_agree(ours: &CactFile, gold: &CactFile, pairs: impl Iterator<Item = (usize, usize)>, label: &str) {
    let (mut same, mut total) = (0usize, 0usize);
    for (o, g) in pairs {
        let r = &gold.records[g];
        assert_eq!((&ours.records[o].name, ours.records[o].kind), (&r.name, r.kind), "{label}: records differ");
        let (a, b) = (ours.blob(o).unwrap(), gold.blob(g).unwrap());
        match r.kind {
            TensorKind::Cq(bits) => {
                let (out, in_dim) = (r.shape[0] as usize, r.shape[1] as usize);
                let a = cq_split(a, out, in_dim, bits).unwrap();
                let b = cq_split(b, out, in_dim, bits).unwrap();
                total += a.indices.len();
                same += a.indices.iter().zip(&b.indices).filter(|(x, y)| x == y).count();
                for (g, (x, y)) in a.norms.iter().zip(&b.norms).enumerate() {
                    assert!(ulp_distance(*x, *y) <= 1, "{label}: {} norm {g}: {x} vs {y}", r.name);
                }
            }
            _ => assert!(a == b, "{label}: {} ({}) blob differs", r.name, r.kind.label()),
        }
    }
    let agreement = same as f64 / total as f64;
    assert!(agreement >= 0.99999, "{label}: only {same}/{total} CQ indices agree");
}

fn check_fixture(stem: &str) {
    let base = Checkpoint::load(&fixture(&format!("models/{stem}.pkl"))).unwrap();
    let mut merged = base.clone();
    merge_into_checkpoint(&mut merged, &PickledAdapter::load(&fixture(&format!("golden/{stem}/adapter.pkl"))).unwrap())
        .unwrap();
    let tokenizer = Tokenizer::load(&fixture("models/tokenizer.model")).unwrap().to_cact_blob(Generation::Needle2);
    for (golden, ckpt, bits) in [
        ("w4", &base, Bits::Four),
        ("w2", &base, Bits::Two),
        ("w4_lora", &merged, Bits::Four),
        ("w2_lora", &merged, Bits::Two),
    ] {
        let built = build_cact(ckpt, &BitsChoice::Uniform(bits), &tokenizer).unwrap();
        let ours = CactFile::parse(built.bytes).unwrap();
        let gold = CactFile::open(&fixture(&format!("golden/{stem}/{golden}.cact"))).unwrap();
        assert_agrees(&ours, &gold, &format!("{stem}/{golden}"));
        ours.verify().unwrap();
    }
}

#[test]
fn tiny_f32_agrees_with_the_reference() {
    check_fixture("tiny_f32");
}

#[test]
fn tiny_f16_agrees_with_the_reference() {
    check_fixture("tiny_f16");
}

#[test]
fn pretrained_agrees_with_the_reference() {
    check_fixture("pretrained");
}

#[test]
fn codebook_constants_are_the_reference_header_codebooks() {
    let stored: Vec<u8> = header_codebooks().iter().flat_map(|c| c.to_le_bytes()).collect();
    for (golden, generation) in
        [("golden/tiny_f32/w4.cact", Generation::Needle2), ("golden/needle3_heads/base.cact", Generation::Needle3)]
    {
        let gold = std::fs::read(fixture(golden)).unwrap();
        let at = header_len(generation);
        assert_eq!(gold[at..at + stored.len()], stored[..], "{golden}");
    }
}

/// The bytes `needle build` writes for the Needle 3 fixture `stem` (which has probe heads), with
/// its adapter or as a rung of the depth ladder.
fn build_needle3_bytes(stem: &str, lora: bool, layers: Option<usize>) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let options = ExportOptions {
        checkpoint: fixture(&format!("models/{stem}.safetensors")),
        lora: lora.then(|| fixture(&format!("golden/{stem}/adapter.safetensors"))),
        tokenizer: fixture("models/tokenizer.model"),
        bits: None,
        layers,
        out: dir.path().join("needle3.cact"),
    };
    export(&options, drop).unwrap();
    std::fs::read(&options.out).unwrap()
}

/// [`build_needle3_bytes`] of the float32 build fixture, read back.
fn build_needle3(lora: bool, layers: Option<usize>) -> CactFile {
    CactFile::parse(build_needle3_bytes("needle3_heads", lora, layers)).unwrap()
}

#[test]
fn a_needle3_build_agrees_with_the_reference_whole_tuned_and_as_a_rung() {
    for (golden, lora, layers) in [("base", false, None), ("lora", true, None), ("layers3", false, Some(3))] {
        let ours = build_needle3(lora, layers);
        let gold = CactFile::open(&fixture(&format!("golden/needle3_heads/{golden}.cact"))).unwrap();
        assert_eq!(ours.header.generation, Generation::Needle3);
        assert_agrees(&ours, &gold, &format!("needle3_heads/{golden}"));
        ours.verify().unwrap();
    }
}

#[test]
fn a_needle3_build_drops_the_confidence_head_with_an_adapter_and_keeps_the_rungs_rows() {
    let names = |file: &CactFile| file.records.iter().map(|r| r.name.clone()).collect::<Vec<_>>();
    let base = names(&build_needle3(false, None));
    assert!(
        base.contains(&"confidence_head.probes".to_string()) && base.contains(&"router_head.calibration".to_string())
    );
    assert!(!names(&build_needle3(true, None)).iter().any(|n| n.starts_with("confidence_head.")));
    let rung = build_needle3(false, Some(3));
    assert_eq!(rung.header.num_layers, 3);
    // Blocks 0, 1 and 3 of four: the engram sites at 1 and 3 stay (renumbered), the one at 2 goes,
    // and so does the only global layer.
    assert_eq!(rung.header.engram_layers, [1, 2]);
    assert_eq!(rung.header.global_layers, 0);
    let probes = rung.records.iter().find(|r| r.name == "embedding_head.probes").unwrap();
    assert_eq!(probes.shape[0] % 4, 0, "a row per depth (embedding and three blocks) of 4 probes each");
}

/// A build of the Needle 3 build fixture with its golden adapter copied into `dir`, so that a head
/// file can be put beside it.
fn tuned_needle3_build(dir: &Path) -> ExportOptions {
    let adapter = dir.join("adapter.safetensors");
    std::fs::copy(fixture("golden/needle3_heads/adapter.safetensors"), &adapter).unwrap();
    ExportOptions {
        checkpoint: fixture("models/needle3_heads.safetensors"),
        lora: Some(adapter),
        tokenizer: fixture("models/tokenizer.model"),
        bits: None,
        layers: None,
        out: dir.join("tuned.cact"),
    }
}

#[test]
fn a_trained_confidence_head_ships_in_the_build_as_the_reference_writes_a_head() {
    // The adapter with the head `needle finetune --confidence` keeps beside it; 3.2.8's
    // write_export of the same merged params with that head (its calibration folded into the
    // projection) in place of the base's made the golden.
    let dir = tempfile::tempdir().unwrap();
    let options = tuned_needle3_build(dir.path());
    let head = companion_path(options.lora.as_ref().unwrap());
    std::fs::copy(fixture("golden/needle3_heads/trained_head.safetensors"), &head).unwrap();
    let mut events = Vec::new();
    export(&options, |event| events.push(event)).unwrap();
    assert!(events.iter().any(|e| matches!(e, ExportEvent::Merged { head: Some(h), .. } if *h == head)), "{events:?}");
    let ours = CactFile::open(&options.out).unwrap();
    let gold = CactFile::open(&fixture("golden/needle3_heads/lora_head.cact")).unwrap();
    assert_agrees(&ours, &gold, "needle3_heads/lora_head");
    ours.verify().unwrap();
    assert!(ours.records.iter().any(|r| r.name == "confidence_head.probes"));
}

#[test]
fn a_head_fitted_to_another_shape_is_refused_by_name() {
    // needle3_heads' adapter with a head of a smaller Needle 3's shape beside it.
    let dir = tempfile::tempdir().unwrap();
    let options = tuned_needle3_build(dir.path());
    let cfg = ModelConfig { d_model: 8, num_layers: 2, ..ModelConfig::needle3_defaults() };
    let head = ConfidenceHead::initial(&cfg, &candle_core::Device::Cpu, 1).unwrap();
    let trained = TrainedHead { head, calibration: Calibration::IDENTITY, reads: Reading::Prompt };
    trained.save(&companion_path(options.lora.as_ref().unwrap())).unwrap();
    let err = export(&options, drop).unwrap_err().to_string();
    assert!(err.contains("adapter.safetensors.head.safetensors") && err.contains("does not fit"), "{err}");
    assert!(!options.out.exists(), "nothing written");
}

#[test]
fn a_head_fitted_to_the_prompt_alone_is_refused_by_name() {
    // A `.cact` records no reading and its head is read on the prompt and the answer, so a head an
    // earlier run fitted to the prompt alone would be read the wrong way.
    let dir = tempfile::tempdir().unwrap();
    let options = tuned_needle3_build(dir.path());
    let path = companion_path(options.lora.as_ref().unwrap());
    let mut trained = TrainedHead::load(&fixture("golden/needle3_heads/trained_head.safetensors")).unwrap();
    trained.reads = Reading::Prompt;
    trained.save(&path).unwrap();
    let err = export(&options, drop).unwrap_err().to_string();
    assert!(err.contains("head.safetensors") && err.contains("reads the prompt alone"), "{err}");
    assert!(!options.out.exists(), "nothing written");
}

/// The adapter Needle Studio's writer writes for the Needle 3 build fixture, and 3.2.8's own
/// `needle build --lora` of it (`build_main`, run by make_needle3_fixtures.py's
/// `make_studio_adapter_build_golden` with our trained head's companion file beside the adapter,
/// which 3.2.8 must ignore).
const STUDIO_ADAPTER: &str = "golden/needle3_heads/studio_adapter.safetensors";
const STUDIO_LORA_CACT: &str = "golden/needle3_heads/studio_lora.cact";
/// Set, the adapter test writes [`STUDIO_ADAPTER`] anew before comparing (then run
/// `regen.sh --needle3` for 3.2.8's build of it).
const WRITE_STUDIO_ADAPTER: &str = "NEEDLE_WRITE_STUDIO_ADAPTER";

/// Writes to `path`, with `save_adapter` (what `needle finetune` saves with), an adapter of rank 4
/// and alpha 8 for the Needle 3 build fixture: a factor for every target `Lora::init` finds, each
/// of the shape it gives, the values a fixed integer pattern scaled into [-0.25, 0.25] for A and
/// [-0.05, 0.05] for B — no random generator, whose stream may change with the crate's version,
/// and no transcendental function, which may round differently on another platform, so that only
/// the writer decides the bytes. Every B is nonzero, so the merge moves every adapted weight.
fn write_studio_adapter(path: &Path) {
    let ckpt = Checkpoint::load(&fixture("models/needle3_heads.safetensors")).unwrap();
    let params = Params::from_checkpoint(&ckpt, &candle_core::Device::Cpu).unwrap();
    let (rank, alpha) = (4, 8.0);
    let pattern = |like: &candle_core::Tensor, seed: usize, size: f32| {
        let values = (0..like.elem_count()).map(|i| ((i * 7919 + seed * 104_729) % 2001) as f32 / 1000.0 - 1.0);
        candle_core::Tensor::from_vec(values.map(|v| v * size).collect(), like.dims(), &candle_core::Device::Cpu)
            .unwrap()
    };
    let shapes = Lora::init(&params, rank, alpha, 0).unwrap();
    let factors = shapes.factors.iter().enumerate().map(|(k, factor)| {
        let (a, b) = (factor.stacked_a().unwrap(), factor.stacked_b().unwrap());
        (factor.path.clone(), pattern(&a, 2 * k, 0.25), pattern(&b, 2 * k + 1, 0.05))
    });
    let lora = Lora::from_factors(&params, rank, alpha, factors.collect::<Vec<_>>()).unwrap();
    let meta = AdapterMeta {
        base: "needle3_heads.safetensors".into(),
        partial: false,
        generation: Generation::Needle3,
        seed: 0,
    };
    save_adapter(path, &lora, &meta).unwrap();
}

/// A safetensors file's header, read as JSON, and the tensor bytes after it.
fn header_and_data(bytes: &[u8]) -> (serde_json::Value, &[u8]) {
    let len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    (serde_json::from_slice(&bytes[8..8 + len]).unwrap(), &bytes[8 + len..])
}

#[test]
fn our_writer_writes_the_adapter_3_2_8_builds_from() {
    // Tensor for tensor and field for field: every tensor's name, dtype, shape and offsets and every
    // metadata field the same, and the tensor bytes byte for byte. Not the header's bytes: the
    // writer hands the safetensors crate its metadata in a HashMap, whose order (so the order of
    // the header's JSON keys) changes from one run to the next.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("adapter.safetensors");
    write_studio_adapter(&path);
    if std::env::var_os(WRITE_STUDIO_ADAPTER).is_some() {
        std::fs::copy(&path, fixture(STUDIO_ADAPTER)).unwrap();
    }
    let (ours, golden) = (std::fs::read(&path).unwrap(), std::fs::read(fixture(STUDIO_ADAPTER)).unwrap());
    let again = "if it changed on purpose, write it again with NEEDLE_WRITE_STUDIO_ADAPTER=1 and rebuild 3.2.8's \
                 build of it with `regen.sh --needle3`";
    let ((ours_header, ours_data), (golden_header, golden_data)) = (header_and_data(&ours), header_and_data(&golden));
    assert_eq!(ours_header, golden_header, "our writer no longer writes {STUDIO_ADAPTER}'s header; {again}");
    assert!(ours_data == golden_data, "our writer no longer writes {STUDIO_ADAPTER}'s tensors; {again}");
    assert_eq!(ours.len(), golden.len());
}

#[test]
fn needle_build_of_our_adapter_is_3_2_8s_build_of_it_with_the_trained_head_added() {
    // 3.2.8 built the golden from our adapter with the trained head's companion file beside it:
    // it read the adapter, ignored the companion and dropped the base's confidence head. Ours,
    // without the companion, writes the same archive; with it, the same records and the head.
    let dir = tempfile::tempdir().unwrap();
    let adapter = dir.path().join("adapter.safetensors");
    std::fs::copy(fixture(STUDIO_ADAPTER), &adapter).unwrap();
    let options = ExportOptions {
        checkpoint: fixture("models/needle3_heads.safetensors"),
        lora: Some(adapter.clone()),
        tokenizer: fixture("models/tokenizer.model"),
        bits: None,
        layers: None,
        out: dir.path().join("tuned.cact"),
    };
    export(&options, drop).unwrap();
    let gold = CactFile::open(&fixture(STUDIO_LORA_CACT)).unwrap();
    let ours = CactFile::open(&options.out).unwrap();
    assert_agrees(&ours, &gold, "needle3_heads/studio_lora");
    ours.verify().unwrap();

    std::fs::copy(fixture("golden/needle3_heads/trained_head.safetensors"), companion_path(&adapter)).unwrap();
    export(&options, drop).unwrap();
    let shipped = CactFile::open(&options.out).unwrap();
    assert_eq!(gold.probe_heads(), ["embedding_head", "router_head"], "3.2.8 dropped the confidence head");
    assert_eq!(shipped.probe_heads(), ["embedding_head", "confidence_head", "router_head"]);
    // Every record of 3.2.8's build but the manifest, which lists one head more in ours.
    let pairs = (gold.records.iter().enumerate()).filter(|(_, r)| r.name != HEADS_MANIFEST).map(|(g, r)| {
        let o = shipped.records.iter().position(|o| o.name == r.name).unwrap_or_else(|| panic!("no {}", r.name));
        (o, g)
    });
    assert_blobs_agree(&shipped, &gold, pairs, "needle3_heads/studio_lora with the head");
    shipped.verify().unwrap();
}

/// How many bytes of two archives of one length differ.
fn differing_bytes(ours: &[u8], gold: &[u8]) -> usize {
    assert_eq!(ours.len(), gold.len(), "the archives differ in length");
    ours.iter().zip(gold).filter(|(a, b)| a != b).count()
}

#[test]
fn a_bfloat16_needle3_build_is_the_reference_build_byte_for_byte() {
    // The checkpoint is kept in bfloat16 and the adapter merged in it with 3.2.8's arithmetic
    // (see lora/merge.rs); everything else widens bfloat16 exactly, so the whole archive agrees —
    // the Hadamard rotations included, which disagree in a last bit elsewhere (`assert_agrees`)
    // but happen not to here.
    for (golden, lora) in [("base", false), ("lora", true)] {
        let ours = build_needle3_bytes("needle3_bf16", lora, None);
        let gold = std::fs::read(fixture(&format!("golden/needle3_bf16/{golden}.cact"))).unwrap();
        let differ = differing_bytes(&ours, &gold);
        assert!(differ == 0, "needle3_bf16/{golden}: {differ} of {} bytes differ", gold.len());
        CactFile::parse(ours).unwrap().verify().unwrap();
    }
}

#[test]
fn merged_in_float32_the_bfloat16_fixture_would_build_another_archive() {
    // What a build did before bfloat16 was kept: widened at load, merged in float32.
    let mut ckpt = Checkpoint::load(&fixture("models/needle3_bf16.safetensors")).unwrap();
    for array in ckpt.params.values_mut() {
        assert_eq!(array.dtype, DType::BF16, "the fixture is bfloat16 throughout");
        *array = NdArray::from_f32(array.shape.clone(), &array.to_f32());
    }
    let adapter = load_adapter(&fixture("golden/needle3_bf16/adapter.safetensors")).unwrap();
    merge_into_checkpoint(&mut ckpt, &adapter).unwrap();
    ckpt.params.retain(|path, _| !path.starts_with("confidence_head/"));
    let tokenizer = Tokenizer::load(&fixture("models/tokenizer.model")).unwrap().to_cact_blob(Generation::Needle3);
    let built = build_cact(&ckpt, &BitsChoice::Uniform(Bits::Four), &tokenizer).unwrap();
    let gold = std::fs::read(fixture("golden/needle3_bf16/lora.cact")).unwrap();
    let differ = differing_bytes(&built.bytes, &gold);
    assert!(differ > 100, "only {differ} bytes differ: the fixture would not tell the two merges apart");
}
