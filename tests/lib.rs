//! Helpers shared by the cross-crate tests in `tests/tests/`: where the fixtures are, how to read them,
//! how to run the `needle` binary, and a model hub on loopback ([`fake_hub`]).

pub mod fake_hub;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

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

/// A command running the `needle` CLI, built once per test binary in the profile the tests use.
pub fn needle() -> Command {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    let mut command = Command::new(BIN.get_or_init(|| binary("needle-cli", "needle")));
    // Tests must not depend on the caller's backend choice, and never touch the internet: a test that
    // wants a hub starts one on loopback (`fake_hub`) and says so.
    command.env_remove("NEEDLE_DEVICE").env("HF_HUB_OFFLINE", "1");
    command
}

/// The desktop app's binary (`needle-studio`), built in the profile the tests use.
pub fn needle_studio() -> PathBuf {
    binary("needle-studio", "needle-studio")
}

/// Builds `bin` of workspace package `package` and says where it is.
///
/// The binary belongs to another package of the workspace, so cargo does not hand its path to these
/// tests; escargot asks cargo to build it (a no-op when it is fresh) and says where it is. No `--target`:
/// that would move the build to another directory and rebuild every dependency.
fn binary(package: &str, bin: &str) -> PathBuf {
    let build = escargot::CargoBuild::new()
        .package(package)
        .bin(bin)
        .manifest_path(Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.toml"))
        .current_release()
        .run()
        .unwrap_or_else(|e| panic!("cannot build the {bin} binary: {e}"));
    build.path().to_path_buf()
}
