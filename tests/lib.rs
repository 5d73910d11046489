//! Helpers shared by the cross-crate tests in `tests/tests/`: where the fixtures are, how to read them,
//! how to run the `needle` binary, a model hub on loopback ([`fake_hub`]) and an OpenAI-compatible chat
//! endpoint on loopback ([`fake_llm`]), and the checker of every crate's rooms ([`rooms`]).

pub mod fake_hub;
pub mod fake_llm;
pub mod rooms;

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A path under `tests/fixtures/`.
pub fn fixture(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures").join(relative)
}

/// A fixture's bytes; a missing fixture fails the test with its path.
pub fn read(relative: &str) -> Vec<u8> {
    let path = fixture(relative);
    std::fs::read(&path).unwrap_or_else(|e| panic!("cannot read fixture {}: {e}", path.display()))
}

/// A JSON fixture.
pub fn json(relative: &str) -> serde_json::Value {
    serde_json::from_slice(&read(relative)).unwrap_or_else(|e| panic!("fixture {relative} is not JSON: {e}"))
}

/// A JSONL fixture, one value per non-empty line.
pub fn jsonl(relative: &str) -> Vec<serde_json::Value> {
    let text = String::from_utf8(read(relative)).unwrap_or_else(|e| panic!("fixture {relative} is not UTF-8: {e}"));
    text.lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("a line of {relative} is not JSON: {e}")))
        .collect()
}

/// A command running the `needle` CLI that cargo built for the calling test: the test must be a target
/// of `needle-cli`, the package that owns the binary, so that cargo sets `CARGO_BIN_EXE_needle` for it.
#[macro_export]
macro_rules! needle {
    () => {
        $crate::needle_at(env!("CARGO_BIN_EXE_needle"))
    };
}

/// A command running the `needle` binary at `bin`, as every test runs it ([`needle!`]).
pub fn needle_at(bin: impl AsRef<OsStr>) -> Command {
    let mut command = Command::new(bin);
    // Tests must not depend on the caller's backend choice, and never touch the internet: a test that
    // wants a hub starts one on loopback (`fake_hub`) and says so.
    command.env_remove("NEEDLE_DEVICE").env("HF_HUB_OFFLINE", "1");
    command
}
