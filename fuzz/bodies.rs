// The bodies of the seven fuzz targets, shared by the libFuzzer binaries (fuzz/fuzz_targets/*.rs)
// and by the regression replay that `cargo test` runs (crates/engine/tests/fuzz_regressions.rs).
// Textually included (`include!`), so the including file must define
//
//     const REPO_ROOT: &str = /* the repository root, where tests/fixtures lives */;
//
// Each body feeds the bytes to the engine's public reader the CLI uses on a user's file, then
// drives whatever a command does next with what was read (tokenize, build the network, verify).
// It returns `Ok` when the command would go through and `Err` with the first refusal, the error's
// sources included, when the reader or a step after it refuses the input; a fuzz target ignores
// the value, the replay checks that the error names the problem. A panic, an abort, an allocation over libFuzzer's limit or a hang
// is the bug being looked for.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use needle_engine::cact::format::TAG_V3;
use needle_engine::cact::CactFile;
use needle_engine::checkpoint::pickle;
use needle_engine::checkpoint::{file_generation, generation, Checkpoint};
use needle_engine::dataset::Dataset;
use needle_engine::generation::Generation;
use needle_engine::lora::{load_adapter, merge_into_checkpoint, merge_into_params};
use needle_engine::model::{Device, Network, Params};
use needle_engine::tokenizer::Tokenizer;

/// Text every tokenizer that loads is asked to encode: chat markers, a tool call, whitespace runs,
/// non-ASCII (byte fallback) and an unpaired marker prefix.
const FUZZ_SAMPLE_TEXT: &str = "<|im_start|>user\nTurn on the  lights\t in the kitchen, s'il vous plaît 🙂\
<|im_end|>\n<|im_start|>assistant\n<think>ok</think><tool_call>[{\"name\": \"set_light\", \"arguments\": \
{\"room\": \"kitchen\", \"on\": true}}]</tool_call><|im_end|>   <|im_ <0x41> ▁▁x \u{0}\r\n";

/// The fixture tokenizer the dataset body tokenizes with (what `needle data --tokenizer` loads).
const FUZZ_TOKENIZER_FIXTURE: &str = "tests/fixtures/models/tokenizer.model";
/// The base checkpoint adapters are merged into (the one `tests/fixtures/golden/tiny_f16/adapter.pkl`
/// was trained on).
const FUZZ_BASE_FIXTURE: &str = "tests/fixtures/models/tiny_f16.pkl";

/// The Needle 3 base Needle 3 adapters are merged into (the one
/// `tests/fixtures/golden/needle3_heads/adapter.safetensors` was trained on).
const FUZZ_NEEDLE3_BASE_FIXTURE: &str = "tests/fixtures/models/needle3_heads.safetensors";

/// A prompt the networks that load decode from: BOS and two ordinary tokens.
const FUZZ_PROMPT: [u32; 3] = [2, 20, 21];

/// A reader's refusal as the user reads it: the error's message, then each of its sources'.
fn fuzz_refusal<E: std::error::Error>(error: E) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

fn fuzz_fixture(relative: &str) -> PathBuf {
    PathBuf::from(REPO_ROOT).join(relative)
}

/// Writes `data` to `name` in a scratch directory of this thread (for the readers that only take a
/// path) and returns the path. One directory per thread, so replay tests may run in parallel.
fn fuzz_scratch_file(name: &str, data: &[u8]) -> PathBuf {
    thread_local! {
        static SCRATCH: tempfile::TempDir = tempfile::Builder::new()
            .prefix("needle-fuzz-")
            .tempdir()
            .expect("cannot create a scratch directory for the fuzz inputs");
    }
    let path = SCRATCH.with(|dir| dir.path().join(name));
    std::fs::write(&path, data).expect("cannot write the fuzz input to the scratch directory");
    path
}

fn fuzz_fixture_tokenizer() -> &'static Tokenizer {
    static TOKENIZER: OnceLock<Tokenizer> = OnceLock::new();
    TOKENIZER.get_or_init(|| {
        let path = fuzz_fixture(FUZZ_TOKENIZER_FIXTURE);
        Tokenizer::load(&path).unwrap_or_else(|e| panic!("fixture tokenizer {}: {e}", path.display()))
    })
}

fn fuzz_base_checkpoint() -> &'static Checkpoint {
    static BASE: OnceLock<Checkpoint> = OnceLock::new();
    BASE.get_or_init(|| fuzz_load_fixture(FUZZ_BASE_FIXTURE))
}

fn fuzz_needle3_base_checkpoint() -> &'static Checkpoint {
    static BASE: OnceLock<Checkpoint> = OnceLock::new();
    BASE.get_or_init(|| fuzz_load_fixture(FUZZ_NEEDLE3_BASE_FIXTURE))
}

fn fuzz_load_fixture(relative: &str) -> Checkpoint {
    let path = fuzz_fixture(relative);
    Checkpoint::load(&path).unwrap_or_else(|e| panic!("fixture checkpoint {}: {e}", path.display()))
}

/// What a command does with a tokenizer once it loaded: encode (`needle tokenize`), decode
/// (generation previews, including ids past the vocabulary) and the `.cact` blob round trip
/// (`needle build`).
fn fuzz_exercise_tokenizer(tokenizer: &Tokenizer) {
    let ids = tokenizer.encode(FUZZ_SAMPLE_TEXT);
    let _ = tokenizer.decode(&ids);
    // The vocabulary's own pieces glued together: exercises merges and user-defined matching.
    let spelled: String = tokenizer.pieces().iter().take(64).map(|p| p.text.as_str()).collect();
    let ids = tokenizer.encode(&spelled);
    let _ = tokenizer.decode(&ids);
    let vocab = u32::try_from(tokenizer.vocab_size()).unwrap_or(u32::MAX);
    let _ = tokenizer.decode(&[0, 1, 2, 3, vocab.saturating_sub(1), vocab, u32::MAX]);
    let _ = (tokenizer.add_dummy_prefix(), tokenizer.byte_fallback(), tokenizer.remove_extra_whitespaces());
    let blob = tokenizer.to_cact_blob(Generation::Needle2);
    if let Ok(again) = Tokenizer::from_cact_blob(&blob) {
        let _ = again.encode(FUZZ_SAMPLE_TEXT);
    }
}

/// What `needle run --checkpoint` does with a checkpoint file, to its first refusal: the file
/// loaded, its parameters in f32, the network built from its config, and a few greedy tokens (whose
/// rotary tables are sized by what is decoded, whatever the config's `max_seq_len`).
fn fuzz_run_checkpoint(path: &Path) -> Result<(), String> {
    let checkpoint = Checkpoint::load(path).map_err(fuzz_refusal)?;
    let _ = checkpoint.param("embedding/embedding");
    let params = Params::from_checkpoint(&checkpoint, &Device::Cpu).map_err(fuzz_refusal)?;
    let network = Network::load(&checkpoint.config, &params).map_err(fuzz_refusal)?;
    network.generate(&FUZZ_PROMPT, 2).map_err(fuzz_refusal)?;
    Ok(())
}

/// What a command does with an adapter file, to its first refusal: the file loaded, then merged
/// into `base` both ways a command merges, into f32 params (`needle run --lora`, `needle eval
/// --lora`) and into the checkpoint's own arrays (`needle build --lora`).
fn fuzz_merge_adapter(path: &Path, base: &Checkpoint) -> Result<(), String> {
    let adapter = load_adapter(path).map_err(fuzz_refusal)?;
    let mut params = Params::from_checkpoint(base, &Device::Cpu).map_err(fuzz_refusal)?;
    merge_into_params(&mut params, &adapter).map_err(fuzz_refusal)?;
    merge_into_checkpoint(&mut base.clone(), &adapter).map_err(fuzz_refusal)
}

/// A pickle: the safe parser itself, then the file both as a checkpoint ([`fuzz_run_checkpoint`])
/// and as a Needle 2 adapter merged into the fixture base ([`fuzz_merge_adapter`]); refused when
/// the parser refuses it or when it is neither.
pub fn fuzz_pickle(data: &[u8]) -> Result<(), String> {
    pickle::parse(data).map_err(fuzz_refusal)?;
    let path = fuzz_scratch_file("input.pkl", data);
    match (fuzz_run_checkpoint(&path), fuzz_merge_adapter(&path, fuzz_base_checkpoint())) {
        (Err(checkpoint), Err(adapter)) => Err(format!("as a checkpoint: {checkpoint}; as an adapter: {adapter}")),
        _ => Ok(()),
    }
}

/// A Needle 3 checkpoint: the generation sniffing the app and the hub do (`generation`,
/// `file_generation`), then [`fuzz_run_checkpoint`] on a `.safetensors` file (its structure,
/// metadata, config and every tensor, and on).
pub fn fuzz_safetensors_checkpoint(data: &[u8]) -> Result<(), String> {
    let _ = generation(data);
    let path = fuzz_scratch_file("checkpoint.safetensors", data);
    let _ = file_generation(&path);
    fuzz_run_checkpoint(&path)
}

/// A Needle 3 adapter: [`fuzz_merge_adapter`] of a `.safetensors` file into the Needle 3 fixture base.
pub fn fuzz_safetensors_adapter(data: &[u8]) -> Result<(), String> {
    let path = fuzz_scratch_file("adapter.safetensors", data);
    fuzz_merge_adapter(&path, fuzz_needle3_base_checkpoint())
}

/// A Needle 3 `.cact` (the v3 tag): everything [`fuzz_cact`] reads, for the inputs that keep the
/// tag, so that the search stays in the v3 header and layout its seeds start from.
pub fn fuzz_cact_v3(data: &[u8]) -> Result<(), String> {
    if data.get(..4) != Some(TAG_V3.to_le_bytes().as_slice()) {
        return Err("not a Needle 3 .cact: the first four bytes are not its tag".into());
    }
    fuzz_cact(data)
}

/// A JSONL dataset: `Dataset::load` (what `needle data` and `needle finetune` read), then every
/// example tokenized with the fixture tokenizer, the rows encoded and the report serialised.
pub fn fuzz_dataset_jsonl(data: &[u8]) -> Result<(), String> {
    let path = fuzz_scratch_file("input.jsonl", data);
    let dataset = Dataset::load(&path, Generation::Needle2).map_err(fuzz_refusal)?;
    let tokenizer = fuzz_fixture_tokenizer();
    // Caps too small for any example, exercised; 512, `needle data`'s, decides.
    for cap in [1, 2] {
        if let Ok(prepared) = dataset.prepare(tokenizer, cap) {
            let _ = (prepared.rows().count(), serde_json::to_string(&prepared.report));
        }
    }
    let prepared = dataset.prepare(tokenizer, 512).map_err(fuzz_refusal)?;
    let _ = (prepared.rows().count(), serde_json::to_string(&prepared.report));
    Ok(())
}

/// A tokenizer: the SentencePiece `.model` reader (`Tokenizer::load`, what `needle tokenize` and
/// `needle data` call) and, on the same bytes, the RAW `.cact` blob reader; each tokenizer that
/// loads is used.
pub fn fuzz_tokenizer_model(data: &[u8]) -> Result<(), String> {
    let path = fuzz_scratch_file("tokenizer.model", data);
    let model = Tokenizer::load(&path);
    if let Ok(tokenizer) = &model {
        fuzz_exercise_tokenizer(tokenizer);
    }
    if let Ok(tokenizer) = Tokenizer::from_cact_blob(data) {
        fuzz_exercise_tokenizer(&tokenizer);
    }
    model.map(|_| ()).map_err(fuzz_refusal)
}

/// A `.cact`: `CactFile::parse` (what `CactFile::open`, `needle inspect` and `needle run --weights`
/// read), the inspect summary, `verify`, and the weights load (`model_config`, `params`, the
/// network, the carried tokenizer).
pub fn fuzz_cact(data: &[u8]) -> Result<(), String> {
    let file = CactFile::parse(data.to_vec()).map_err(fuzz_refusal)?;
    let _ = (file.size(), file.preamble().len(), file.tokenizer_pieces());
    let _ = serde_json::to_string(&file.header);
    let _ = serde_json::to_string(&file.records);
    for (index, record) in file.records.iter().enumerate() {
        let _ = (record.bits(), file.blob(index).map(<[u8]>::len));
        let _ = file.values(index);
    }
    if let Some(blob) = file.tokenizer_index().and_then(|i| file.blob(i)) {
        if let Ok(tokenizer) = Tokenizer::from_cact_blob(blob) {
            fuzz_exercise_tokenizer(&tokenizer);
        }
    }
    // What `needle inspect --verify` and `needle run --weights` refuse.
    file.verify().map_err(fuzz_refusal)?;
    let params = file.params(&Device::Cpu).map_err(fuzz_refusal)?;
    Network::load(&file.model_config(), &params).map_err(fuzz_refusal)?;
    Ok(())
}
