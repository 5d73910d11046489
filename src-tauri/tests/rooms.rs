//! The app's rooms, checked from their source: no import runs back up to a module that contains the
//! importer (in Rust a parent module's own items, `crate::lock` from `train/job.rs`; in the UI a file
//! in a folder above, `../main.js`), no two modules import each other round a circle, no two step
//! panels of the UI import each other, and no worker flag is spelled by hand (the CLI's own argument
//! types write them: `worker::job`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A module and the modules it imports.
type Graph = BTreeMap<String, BTreeSet<String>>;

fn root(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(relative)
}

fn files(dir: &Path, extension: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())).flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(files(&path, extension));
        } else if path.extension().is_some_and(|ext| ext == extension) {
            found.push(path);
        }
    }
    found.sort();
    found
}

/// The lines of `text` that are code: comments (and doc comments, whose links name modules) dropped.
fn code_lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.lines().enumerate().map(|(i, line)| (i + 1, line)).filter(|(_, line)| !line.trim_start().starts_with("//"))
}

// ---------- Rust ----------

/// `src/train/job.rs` → `train::job`; `src/train/mod.rs` → `train`; `src/lib.rs` → the crate root, "".
fn rust_module(src: &Path, file: &Path) -> String {
    let relative = file.strip_prefix(src).expect("under src").with_extension("");
    let parts: Vec<String> = relative.iter().map(|part| part.to_string_lossy().into_owned()).collect();
    match parts.as_slice() {
        [lib] if lib == "lib" => String::new(),
        [dirs @ .., last] if last == "mod" => dirs.join("::"),
        all => all.join("::"),
    }
}

/// Whether `ancestor` contains `module` (the crate root contains every module).
fn contains(ancestor: &str, module: &str) -> bool {
    ancestor != module && (ancestor.is_empty() || module.starts_with(&format!("{ancestor}::")))
}

/// Each module's imports of other modules of the crate, or the problems found on the way: a path
/// into a module that contains the importer, a `super::` other than a test module's `use super::*`,
/// a grouped `crate::{…}` (one path per use, so each can be checked).
fn rust_imports(modules: &BTreeMap<String, String>) -> (Graph, Vec<String>) {
    let mut graph = Graph::new();
    let mut problems = Vec::new();
    for (module, text) in modules {
        let imports = graph.entry(module.clone()).or_default();
        for (number, line) in code_lines(text) {
            let at = format!("{} line {number}", if module.is_empty() { "lib" } else { module });
            if line.contains("super::") && line.trim() != "use super::*;" {
                problems.push(format!("{at}: `super::` reaches the module that contains this one: {}", line.trim()));
            }
            for (start, _) in line.match_indices("crate::") {
                let path: String = line[start + "crate::".len()..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':' || *c == '{')
                    .collect();
                if path.starts_with('{') {
                    problems.push(format!("{at}: a grouped `crate::{{…}}`; write one path per use"));
                    continue;
                }
                // The longest prefix of the path that names a module is what is imported from.
                let parts: Vec<&str> = path.split("::").filter(|part| !part.is_empty()).collect();
                let target = (0..=parts.len())
                    .rev()
                    .map(|n| parts[..n].join("::"))
                    .find(|prefix| modules.contains_key(prefix))
                    .unwrap_or_default();
                if contains(&target, module) || target == *module {
                    let named = if target.is_empty() { "the crate root" } else { &target };
                    problems.push(format!("{at}: `crate::{path}` imports from {named}, which contains this module"));
                } else {
                    imports.insert(target);
                }
            }
        }
    }
    (graph, problems)
}

/// The modules of the first circle found in `graph`, if any.
fn circle(graph: &Graph) -> Option<Vec<String>> {
    fn visit(node: &str, graph: &Graph, path: &mut Vec<String>, done: &mut BTreeSet<String>) -> Option<Vec<String>> {
        if let Some(start) = path.iter().position(|seen| seen == node) {
            let mut found = path[start..].to_vec();
            found.push(node.to_string());
            return Some(found);
        }
        if !done.insert(node.to_string()) {
            return None;
        }
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(found) = visit(next, graph, path, done) {
                return Some(found);
            }
        }
        path.pop();
        None
    }
    let mut done = BTreeSet::new();
    graph.keys().find_map(|node| visit(node, graph, &mut Vec::new(), &mut done))
}

/// The same imports between top-level folders (`train::job` → `worker::process` is `train` → `worker`).
fn by_folder(graph: &Graph) -> Graph {
    let top = |module: &str| module.split("::").next().unwrap_or_default().to_string();
    let mut folders = Graph::new();
    for (module, imports) in graph {
        let from = folders.entry(top(module)).or_default();
        from.extend(imports.iter().map(|import| top(import)).filter(|to| *to != top(module)));
    }
    folders
}

fn app_modules() -> BTreeMap<String, String> {
    let src = root("src");
    files(&src, "rs")
        .into_iter()
        // The binary is a crate of its own, over the library's public items.
        .filter(|file| file.file_name().is_some_and(|name| name != "main.rs"))
        .map(|file| (rust_module(&src, &file), std::fs::read_to_string(&file).unwrap()))
        .collect()
}

#[test]
fn no_rust_import_runs_back_up_a_level_or_round_a_circle() {
    let modules = app_modules();
    assert!(modules.len() > 20 && modules.contains_key("train::job"), "{:?}", modules.keys());
    let (graph, problems) = rust_imports(&modules);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    assert_eq!(circle(&graph), None, "modules importing each other round a circle");
    assert_eq!(circle(&by_folder(&graph)), None, "folders importing each other round a circle");
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

#[test]
fn the_checks_find_an_import_up_a_level_and_a_circle() {
    let modules: BTreeMap<String, String> = [
        ("", "mod train;\nfn lock() {}"),
        ("ground", "pub fn lock() {}"),
        ("train", "pub mod job;"),
        ("train::job", "use crate::lock;\nuse crate::worker::process::Worker;\nuse crate::ground::lock;"),
        ("worker", "pub mod process;"),
        ("worker::process", "use crate::train::job::start;\nuse super::Worker;"),
    ]
    .into_iter()
    .map(|(module, text)| (module.to_string(), text.to_string()))
    .collect();
    let (graph, problems) = rust_imports(&modules);
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(problems[0].contains("train::job line 1") && problems[0].contains("the crate root"), "{problems:?}");
    assert!(problems[1].contains("worker::process line 2: `super::`"), "{problems:?}");
    assert_eq!(graph["train::job"], BTreeSet::from(["ground".to_string(), "worker::process".to_string()]));
    assert_eq!(circle(&graph).map(|c| c.len()), Some(3), "train::job → worker::process → train::job");
    assert!(circle(&by_folder(&graph)).is_some());
    assert_eq!(
        js_imports("import { $ } from '../ground/dom.js';\n/** @typedef {import('./types.js').X} X */"),
        ["../ground/dom.js", "./types.js"]
    );
}
