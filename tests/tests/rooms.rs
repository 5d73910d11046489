//! The engine's and the CLI's rooms, checked from their source as the app's are
//! (`src-tauri/tests/rooms.rs`, the same checker): no import from a module that contains the
//! importer, no circle between files of different folders, a circle inside one folder only where a
//! note below says why, a ground floor that imports nothing above it, and the two compute paths
//! importing neither each other.

use std::collections::BTreeMap;
use std::path::Path;

use needle_tests::rooms::{crate_modules, violations, Paths, Rules};

fn crate_src(relative: &str) -> BTreeMap<String, String> {
    crate_modules(&Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(relative))
}

/// The engine's stack (its floors: `crates/engine/src/lib.rs`).
const ENGINE: Rules = Rules {
    paths: Paths::Relative,
    circles: &[(
        &["checkpoint::pickle::callables", "checkpoint::pickle::machine", "checkpoint::pickle::tree"],
        // One stack machine with its value types, cut in three rooms: the machine runs the opcodes
        // over its arena, hands a global's call to the allow-list (whose interpreters, an array's
        // BUILD or `_codecs.encode`, work on that arena and budget as the opcodes do), and at STOP
        // has the tree turn the arena into values, counting its copies against the same budget.
        "the pickle machine, the callables it interprets and the tree it ends in",
    )],
    // `level_log` is the tests' record of the quantizers' levels, which `quant` feeds.
    ground: &["generation", "level_log", "quant", "simd"],
    apart: &[("model::fast", "model::san")],
    // Top-level folders still importing each other round a circle, though no two of their files
    // do: cact, calls, confidence and train (the confidence head is fitted with train's optimizer
    // and calls' reliability, shipped by cact's export, read by calls' scoring and trained by train).
    folders: false,
};

/// The CLI: one command per file over the engine.
const CLI: Rules = Rules { paths: Paths::Relative, circles: &[], ground: &[], apart: &[], folders: true };

/// `rules` hold in the crate under `relative`, which has `more_than` modules and `module`.
fn holds(relative: &str, rules: &Rules, more_than: usize, module: &str) {
    let modules = crate_src(relative);
    assert!(modules.len() > more_than && modules.contains_key(module), "{:?}", modules.keys());
    let found = violations(&modules, rules);
    assert!(found.is_empty(), "{relative}:\n{}", found.join("\n"));
}

#[test]
fn the_engine_is_a_stack() {
    holds("crates/engine/src", &ENGINE, 100, "model::fast::attention");
}

#[test]
fn the_cli_is_a_stack() {
    holds("crates/cli/src", &CLI, 10, "eval");
}

/// Each rule fails on the real engine with one violation planted in it.
#[test]
fn a_planted_violation_fails_the_engine() {
    let plants = [
        ("model::fast::mat", "use crate::model::san::network::Network;", "model::fast and model::san"),
        ("generation", "use crate::cact::format::TAG;", "on the ground floor"),
        ("dataset::lines", "use crate::train::finetune::Session;", "different folders"),
        ("model::san::conv", "use crate::model::san;", "contains this module"),
        ("checkpoint::pickle::op", "use super::machine::Machine;", "no note allows"),
    ];
    for (module, import, says) in plants {
        let mut modules = crate_src("crates/engine/src");
        let text = modules.get_mut(module).unwrap_or_else(|| panic!("no module {module}"));
        *text = format!("{import}\n{text}");
        let found = violations(&modules, &ENGINE);
        assert!(found.iter().any(|v| v.contains(says)), "{import} in {module}: {found:?}");
    }
}
