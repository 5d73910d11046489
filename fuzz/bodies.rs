// The bodies of the seven fuzz targets, shared by the libFuzzer binaries (fuzz/fuzz_targets/*.rs)
// and by the regression replay that `cargo test` runs (crates/engine/tests/fuzz_regressions.rs).
// Textually included (`include!`), so the including file must define
//
//     const REPO_ROOT: &str = /* the repository root, where tests/fixtures lives */;
//
// Each body feeds the bytes to the engine's public reader the CLI uses on a user's file, then
// drives whatever a command does next with what was read (tokenize, build the network, verify).
// It returns `Ok` when the top-level reader accepted the input and `Err` with the message when it
// refused it; a fuzz target ignores the value, the replay prints it. A panic, an abort, an
// allocation over libFuzzer's limit or a hang is the bug being looked for.

use std::path::PathBuf;
use std::sync::OnceLock;

use needle_engine::cact::format::TAG_V3;
use needle_engine::cact::CactFile;
use needle_engine::checkpoint::pickle::{self, PyValue};
use needle_engine::checkpoint::{file_generation, generation, Checkpoint};
use needle_engine::generation::Generation;
use needle_engine::dataset::Dataset;
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

/// A pickle: the safe parser itself, then, for a top-level dict, the checkpoint and the adapter
/// loaders with what `needle run --checkpoint .. --lora ..` does next (f32 params, the network
/// built from the checkpoint's config, the adapter merged into a base).
pub fn fuzz_pickle(data: &[u8]) -> Result<(), String> {
    let parsed = pickle::parse(data).map_err(|e| e.to_string())?;
    if !matches!(parsed, PyValue::Dict(_)) {
        // Checkpoint::load and load_adapter refuse anything else before looking at it.
        return Ok(());
    }
    let path = fuzz_scratch_file("input.pkl", data);
    if let Ok(checkpoint) = Checkpoint::load(&path) {
        let _ = checkpoint.param("embedding/embedding");
        if let Ok(params) = Params::from_checkpoint(&checkpoint, &Device::Cpu) {
            let _ = Network::load(&checkpoint.config, &params);
        }
    }
    if let Ok(adapter) = load_adapter(&path) {
        if let Ok(mut base) = Params::from_checkpoint(fuzz_base_checkpoint(), &Device::Cpu) {
            let _ = merge_into_params(&mut base, &adapter);
        }
    }
    Ok(())
}

/// A Needle 3 checkpoint: the generation sniffing the app and the hub do (`generation`,
/// `file_generation`), `Checkpoint::load` of a `.safetensors` file (its structure, metadata,
/// config and every tensor), then what `needle run --checkpoint ..` does next: f32 params, the
/// network built from the config, and a few greedy tokens (whose rotary tables are sized by what
/// is decoded, whatever the config's `max_seq_len`).
pub fn fuzz_safetensors_checkpoint(data: &[u8]) -> Result<(), String> {
    let _ = generation(data);
    let path = fuzz_scratch_file("checkpoint.safetensors", data);
    let _ = file_generation(&path);
    let checkpoint = Checkpoint::load(&path).map_err(|e| e.to_string())?;
    let _ = checkpoint.param("embedding/embedding");
    if let Ok(params) = Params::from_checkpoint(&checkpoint, &Device::Cpu) {
        if let Ok(network) = Network::load(&checkpoint.config, &params) {
            let _ = network.generate(&FUZZ_PROMPT, 2);
        }
    }
    Ok(())
}

/// A Needle 3 adapter: `load_adapter` of a `.safetensors` file, then merged into the Needle 3
/// fixture base both ways a command merges: into f32 params (`needle run --lora`, `needle eval
/// --lora`) and into the checkpoint's own arrays (`needle build --lora`).
pub fn fuzz_safetensors_adapter(data: &[u8]) -> Result<(), String> {
    let path = fuzz_scratch_file("adapter.safetensors", data);
    let adapter = load_adapter(&path).map_err(|e| e.to_string())?;
    let base = fuzz_needle3_base_checkpoint();
    if let Ok(mut params) = Params::from_checkpoint(base, &Device::Cpu) {
        let _ = merge_into_params(&mut params, &adapter);
    }
    let _ = merge_into_checkpoint(&mut base.clone(), &adapter);
    Ok(())
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
    let dataset = Dataset::load(&path, Generation::Needle2).map_err(|e| e.to_string())?;
    let tokenizer = fuzz_fixture_tokenizer();
    for cap in [2, 512] {
        if let Ok(prepared) = dataset.prepare(tokenizer, cap) {
            for row in prepared.rows() {
                let _ = row;
            }
            let _ = serde_json::to_string(&prepared.report);
        }
    }
    let _ = dataset.prepare(tokenizer, 1);
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
    model.map(|_| ()).map_err(|e| e.to_string())
}

/// A `.cact`: `CactFile::parse` (what `CactFile::open`, `needle inspect` and `needle run --weights`
/// read), the inspect summary, `verify`, and the weights load (`model_config`, `params`, the
/// network, the carried tokenizer).
pub fn fuzz_cact(data: &[u8]) -> Result<(), String> {
    let file = CactFile::parse(data.to_vec()).map_err(|e| e.to_string())?;
    let _ = (file.size(), file.preamble().len(), file.tokenizer_pieces());
    let _ = serde_json::to_string(&file.header);
    let _ = serde_json::to_string(&file.records);
    for (index, record) in file.records.iter().enumerate() {
        let _ = (record.bits(), file.blob(index).map(<[u8]>::len));
        let _ = file.values(index);
    }
    let _ = file.verify();
    let config = file.model_config();
    if let Ok(params) = file.params(&Device::Cpu) {
        let _ = Network::load(&config, &params);
    }
    if let Some(blob) = file.tokenizer_index().and_then(|i| file.blob(i)) {
        if let Ok(tokenizer) = Tokenizer::from_cact_blob(blob) {
            fuzz_exercise_tokenizer(&tokenizer);
        }
    }
    Ok(())
}
