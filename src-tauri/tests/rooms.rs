//! The app's rooms, checked from their source: no import runs back up to a module that contains the
//! importer (in Rust a parent module's own items, `crate::lock` from `train/job.rs`; in the UI a file
//! in a folder above, `../main.js`), no two modules import each other round a circle, no two step
//! panels of the UI import each other, and no worker flag is spelled by hand (the CLI's own argument
//! types write them: `worker::job`).

use std::path::{Path, PathBuf};

use needle_tests::rooms::{circle, code_lines, crate_modules, files, violations, Graph, Paths, Rules};

fn root(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(relative)
}

#[test]
fn no_rust_import_runs_back_up_a_level_or_round_a_circle() {
    let modules = crate_modules(&root("src"));
    assert!(modules.len() > 20 && modules.contains_key("train::job"), "{:?}", modules.keys());
    // Paths from the crate root only; no circle at all, of modules or of top-level folders.
    let rules =
        Rules { paths: Paths::FromTheRoot, circles: &[], ground: &[], apart: &[], folders: true };
    let found = violations(&modules, &rules);
    assert!(found.is_empty(), "{}", found.join("\n"));
}

#[test]
fn no_worker_flag_is_spelled_by_hand() {
    let mut spelled = Vec::new();
    for file in files(&root("src"), "rs") {
        let text = std::fs::read_to_string(&file).unwrap();
        // The app's code, that is: a test module (last in its file) may name the flags it expects.
        let code = text.split("#[cfg(test)]").next().unwrap_or_default();
        for (number, line) in code_lines(code) {
            // `"--checkpoint"`, `"--query={}"`; the `"--"` that ends the flags is no flag.
            let flag = line
                .match_indices("\"--")
                .any(|(at, _)| line[at + 3..].chars().next().is_some_and(|c| c.is_ascii_alphabetic()));
            if flag {
                spelled.push(format!("{}:{number}: {}", file.display(), line.trim()));
            }
        }
    }
    assert!(spelled.is_empty(), "flags written by hand; build a worker::job::Job instead:\n{}", spelled.join("\n"));
}

// ---------- the web UI ----------

/// Every module `text` imports (`import … from './x.js'` and JSDoc's `import('./x.js')`), as written.
fn js_imports(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for (_, line) in code_lines(text) {
        for marker in [" from '", "import('"] {
            for (at, _) in line.match_indices(marker) {
                let rest = &line[at + marker.len()..];
                if let Some(end) = rest.find('\'') {
                    found.push(rest[..end].to_string());
                }
            }
        }
    }
    found
}

/// `path` with its `..` resolved.
fn normal(path: &Path) -> PathBuf {
    PathBuf::from_iter(path.components().fold(Vec::new(), |mut parts, part| {
        match part {
            std::path::Component::ParentDir => drop(parts.pop()),
            other => parts.push(other),
        }
        parts
    }))
}

#[test]
fn no_ui_import_runs_back_up_a_level_or_round_a_circle_and_no_panel_imports_another() {
    let ui = normal(&root("../ui"));
    let mut graph = Graph::new();
    let mut problems = Vec::new();
    let name = |file: &Path| file.strip_prefix(&ui).unwrap().to_string_lossy().into_owned();
    for file in files(&ui, "js") {
        let dir = file.parent().unwrap();
        let imports = graph.entry(name(&file)).or_default();
        for import in js_imports(&std::fs::read_to_string(&file).unwrap()) {
            let target = normal(&dir.join(&import));
            // A type import of `./types.js` is TypeScript's name for the declarations in `./types.d.ts`.
            let declared = target.with_extension("d.ts");
            let target = if !target.is_file() && declared.is_file() { declared } else { target };
            let at = format!("{} imports {import}", name(&file));
            if !target.is_file() {
                problems.push(format!("{at}: no such file"));
                continue;
            }
            let target_dir = target.parent().unwrap();
            if target_dir != dir && dir.starts_with(target_dir) {
                problems.push(format!("{at}: a file in a folder above it"));
            }
            if target_dir == ui.join("steps") && dir == ui.join("steps") {
                problems.push(format!("{at}: one step's panel imports another's; tell it through ground/state.js"));
            }
            imports.insert(name(&target));
        }
    }
    assert!(graph.len() > 10 && graph.contains_key("steps/train.js"), "{:?}", graph.keys());
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    assert_eq!(circle(&graph), None, "UI modules importing each other round a circle");
}

// ---------- the checks themselves ----------
// The Rust checks test themselves with the checker (`needle_tests::rooms`); the UI's reader is this file's.

#[test]
fn the_ui_check_reads_both_kinds_of_import() {
    assert_eq!(
        js_imports("import { $ } from '../ground/dom.js';\n/** @typedef {import('./types.js').X} X */"),
        ["../ground/dom.js", "./types.js"]
    );
}
