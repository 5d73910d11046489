//! The rooms of a crate, read from its source: which module imports which, and the imports that break
//! the stack. One checker for every crate of the workspace (the app's `src-tauri/tests/rooms.rs`, the
//! engine's and the CLI's `tests/tests/rooms.rs`), each test choosing what it forbids on top of the
//! rules every crate keeps:
//!
//! - no import from a module that contains the importer (a parent's own items, `crate::lock` from
//!   `train/job.rs`), and no `super::` but a test module's `use super::*;`, so a path names its room;
//! - no grouped `crate::{…}`: one path per use, which names the room it comes from.
//!
//! An import through a re-export counts as an import of the module that defines the item: `pub use
//! reader::CactFile` in `cact/mod.rs` makes `crate::cact::CactFile` an import of `cact::reader`, so
//! the graph is the one the code has, not the one its façades show. A visibility (`pub(in
//! crate::model)`) says who may look, not what is used, and is no import. Comments and string
//! literals are left out; a path inside a macro's arguments counts like any other.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A module and the modules it imports.
pub type Graph = BTreeMap<String, BTreeSet<String>>;

/// Every file under `dir` whose name ends `.extension`, sorted.
pub fn files(dir: &Path, extension: &str) -> Vec<PathBuf> {
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

/// The lines of `text` that are code: comment lines (and doc comments, whose links name modules) dropped.
pub fn code_lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.lines().enumerate().map(|(i, line)| (i + 1, line)).filter(|(_, line)| !line.trim_start().starts_with("//"))
}

/// `src/train/job.rs` → `train::job`; `src/train/mod.rs` → `train`; `src/lib.rs` → the crate root, "".
pub fn rust_module(src: &Path, file: &Path) -> String {
    let relative = file.strip_prefix(src).expect("under src").with_extension("");
    let parts: Vec<String> = relative.iter().map(|part| part.to_string_lossy().into_owned()).collect();
    match parts.as_slice() {
        [lib] if lib == "lib" => String::new(),
        [dirs @ .., last] if last == "mod" => dirs.join("::"),
        all => all.join("::"),
    }
}

/// The library's modules under `src` and their text; the binary (`main.rs`) is a crate of its own, over
/// the library's public items.
pub fn crate_modules(src: &Path) -> BTreeMap<String, String> {
    files(src, "rs")
        .into_iter()
        .filter(|file| file.file_name().is_some_and(|name| name != "main.rs"))
        .map(|file| (rust_module(src, &file), std::fs::read_to_string(&file).unwrap()))
        .collect()
}

/// Whether `ancestor` contains `module` (the crate root contains every module).
pub fn contains(ancestor: &str, module: &str) -> bool {
    ancestor != module && (ancestor.is_empty() || module.starts_with(&format!("{ancestor}::")))
}

/// The module that holds `module`'s file: `model::san::attention` → `model::san`; a top-level module
/// → the crate root, "".
pub fn folder(module: &str) -> &str {
    module.rsplit_once("::").map_or("", |(parent, _)| parent)
}

/// `text` with its comments and the insides of its string and character literals blanked out, line
/// breaks kept, so that what is left is code and every offset keeps its line.
fn code(text: &str) -> Vec<u8> {
    let bytes = text.as_bytes();
    let mut out = bytes.to_vec();
    let blank = |out: &mut Vec<u8>, from: usize, to: usize| {
        for byte in &mut out[from..to] {
            if *byte != b'\n' {
                *byte = b' ';
            }
        }
    };
    let ident = |byte: u8| byte.is_ascii_alphanumeric() || byte == b'_';
    let mut i = 0;
    while i < bytes.len() {
        let rest = &bytes[i..];
        if rest.starts_with(b"//") {
            let end = rest.iter().position(|&b| b == b'\n').map_or(bytes.len(), |n| i + n);
            blank(&mut out, i, end);
            i = end;
        } else if rest.starts_with(b"/*") {
            let (mut depth, mut j) = (0usize, i);
            while j < bytes.len() {
                if bytes[j..].starts_with(b"/*") {
                    depth += 1;
                    j += 2;
                } else if bytes[j..].starts_with(b"*/") {
                    depth -= 1;
                    j += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    j += 1;
                }
            }
            blank(&mut out, i, j);
            i = j;
        } else if (rest.starts_with(b"r\"") || rest.starts_with(b"r#") || rest.starts_with(b"br"))
            && (i == 0 || !ident(bytes[i - 1]))
            && {
                let after_r = if rest[0] == b'b' { 2 } else { 1 };
                rest.get(after_r..).is_some_and(|tail| {
                    let hashes = tail.iter().take_while(|&&b| b == b'#').count();
                    tail.get(hashes) == Some(&b'"')
                })
            }
        {
            // A raw string: `r#"…"#` ends at the quote followed by as many hashes.
            let start = i + if rest[0] == b'b' { 2 } else { 1 };
            let hashes = bytes[start..].iter().take_while(|&&b| b == b'#').count();
            let body = start + hashes + 1;
            let closing: Vec<u8> = std::iter::once(b'"').chain(std::iter::repeat_n(b'#', hashes)).collect();
            let end = (body..bytes.len()).find(|&j| bytes[j..].starts_with(&closing)).unwrap_or(bytes.len());
            blank(&mut out, body, end);
            i = end + closing.len();
        } else if rest[0] == b'"' {
            let mut j = i + 1;
            while j < bytes.len() && bytes[j] != b'"' {
                j += if bytes[j] == b'\\' { 2 } else { 1 };
            }
            blank(&mut out, i + 1, j.min(bytes.len()));
            i = j + 1;
        } else if rest[0] == b'\'' {
            // A character literal (`'x'`, `'\n'`, `'\u{1F600}'`), or a lifetime (`'a`), which is code.
            let literal_end = if rest.get(1) == Some(&b'\\') {
                rest.iter().skip(2).position(|&b| b == b'\'').map(|n| i + 2 + n)
            } else {
                let width = text[i + 1..].chars().next().map_or(1, char::len_utf8);
                (rest.get(1 + width) == Some(&b'\'')).then_some(i + 1 + width)
            };
            match literal_end {
                Some(end) => {
                    blank(&mut out, i + 1, end);
                    i = end + 1;
                }
                None => i += 1,
            }
        } else {
            i += 1;
        }
    }
    out
}

/// A path as written from `at` (`crate::cact::{reader::CactFile, Bits}`), every leaf of its use tree
/// in full (`["crate", "cact", "reader", "CactFile"]`, `["crate", "cact", "Bits"]`), and where it ends.
fn path_tree(code: &[u8], at: usize) -> (Vec<Vec<String>>, usize) {
    fn skip_space(code: &[u8], i: &mut usize) {
        while *i < code.len() && code[*i].is_ascii_whitespace() {
            *i += 1;
        }
    }
    fn word(code: &[u8], i: &mut usize) -> Option<String> {
        let start = *i;
        while *i < code.len() && (code[*i].is_ascii_alphanumeric() || code[*i] == b'_') {
            *i += 1;
        }
        (*i > start).then(|| String::from_utf8_lossy(&code[start..*i]).into_owned())
    }
    fn tree(code: &[u8], i: &mut usize, mut prefix: Vec<String>, leaves: &mut Vec<Vec<String>>) {
        loop {
            skip_space(code, i);
            if code.get(*i) == Some(&b'{') {
                *i += 1;
                loop {
                    skip_space(code, i);
                    match code.get(*i) {
                        Some(b'}') => {
                            *i += 1;
                            break;
                        }
                        Some(b',') => *i += 1,
                        None => return,
                        _ => {
                            let before = *i;
                            tree(code, i, prefix.clone(), leaves);
                            if *i == before {
                                *i += 1;
                            }
                        }
                    }
                }
                return;
            }
            if code.get(*i) == Some(&b'*') {
                *i += 1;
                prefix.push("*".to_string());
                leaves.push(prefix);
                return;
            }
            match word(code, i) {
                Some(segment) if segment == "self" && !prefix.is_empty() => {}
                Some(segment) => prefix.push(segment),
                None => {
                    leaves.push(prefix);
                    return;
                }
            }
            let mut j = *i;
            skip_space(code, &mut j);
            if code[j..].starts_with(b"::") && !code[j + 2..].starts_with(b"<") {
                *i = j + 2;
                continue;
            }
            // `reader::Record as Entry`: the leaf keeps its new name after an `as`.
            if code[j..].starts_with(b"as") && code.get(j + 2).is_some_and(u8::is_ascii_whitespace) {
                let mut k = j + 2;
                skip_space(code, &mut k);
                if let Some(alias) = word(code, &mut k) {
                    prefix.extend(["as".to_string(), alias]);
                    *i = k;
                }
            }
            leaves.push(prefix);
            return;
        }
    }
    let mut leaves = Vec::new();
    let mut i = at;
    tree(code, &mut i, Vec::new(), &mut leaves);
    leaves.retain(|leaf| !leaf.is_empty());
    (leaves, i)
}

/// Where a path of a crate leads.
struct Modules {
    /// Every module, a file's or one written inline (`mod tests { … }`), with the file that holds it.
    file_of: BTreeMap<String, String>,
    /// A module's re-exported names (`pub use reader::CactFile`) and the full paths they stand for; a
    /// glob (`pub use reader::*`) under the name `*`, one path per glob.
    reexports: BTreeMap<(String, String), Vec<Vec<String>>>,
    /// Each file's code, to tell which of a module's globs brings a name.
    codes: BTreeMap<String, Vec<u8>>,
}

impl Modules {
    /// The absolute path (crate root first, without `crate`) that `path`, written in `module`, names;
    /// `None` for a path that does not start in this crate (`std::…`, a local's name).
    fn absolute(&self, module: &str, path: &[String]) -> Option<Vec<String>> {
        let mut here: Vec<String> = module.split("::").filter(|p| !p.is_empty()).map(String::from).collect();
        let (first, rest) = path.split_first()?;
        match first.as_str() {
            "crate" => here.clear(),
            "self" => {}
            "super" => {
                here.pop();
                let mut rest = rest;
                while rest.first().is_some_and(|p| p == "super") {
                    here.pop();
                    rest = &rest[1..];
                }
                here.extend(rest.iter().cloned());
                return Some(here);
            }
            child => {
                let mut inside = here.clone();
                inside.push(child.to_string());
                if !self.file_of.contains_key(&inside.join("::")) {
                    return None;
                }
                here.push(child.to_string());
            }
        }
        here.extend(rest.iter().cloned());
        Some(here)
    }

    /// The file whose module defines what `path` (absolute) names, following re-exports; `None` for
    /// a re-export of another crate's item (`pub use candle_core::Device`).
    fn defining_file(&self, path: &[String]) -> Option<String> {
        let mut path = path.to_vec();
        for _ in 0..16 {
            let module = (0..=path.len()).rev().map(|n| path[..n].join("::")).find(|m| self.file_of.contains_key(m));
            let module = module.unwrap_or_default();
            let depth = if module.is_empty() { 0 } else { module.split("::").count() };
            let Some(name) = path.get(depth) else { return Some(self.file_of[&module].clone()) };
            let named = self.reexports.get(&(module.clone(), name.clone())).and_then(|targets| targets.first());
            // Through a glob: the module it names that defines `name` (its own items come first).
            let globbed = || {
                let defines = |module: &str| {
                    self.file_of
                        .get(module)
                        .and_then(|file| self.codes.get(file))
                        .is_some_and(|code| defines(code, name))
                };
                let globs = self.reexports.get(&(module.clone(), "*".to_string()))?;
                if defines(&module) {
                    return None;
                }
                globs
                    .iter()
                    .filter(|target| !target.is_empty())
                    .find(|target| defines(&target[..target.len() - 1].join("::")))
                    .map(|target| {
                        let mut target = target[..target.len() - 1].to_vec();
                        target.push(name.clone());
                        target
                    })
            };
            match named.cloned().or_else(globbed) {
                Some(target) if target.is_empty() => return None,
                Some(target) => path = target.into_iter().chain(path[depth + 1..].iter().cloned()).collect(),
                None => return Some(self.file_of[&module].clone()),
            }
        }
        panic!("re-exports of {} go round a circle", path.join("::"))
    }
}

/// Whether `code` defines an item called `name` (`fn name`, `struct name`, `const name`, …).
fn defines(code: &[u8], name: &str) -> bool {
    let text = String::from_utf8_lossy(code);
    ["fn", "struct", "enum", "type", "const", "static", "trait", "union", "mod", "macro_rules!"].iter().any(|kind| {
        text.match_indices(&format!("{kind} {name}")).any(|(at, _)| {
            let before = text[..at].chars().next_back().is_none_or(|c| !c.is_alphanumeric() && c != '_');
            let after = text[at + kind.len() + 1 + name.len()..]
                .chars()
                .next()
                .is_none_or(|c| !c.is_alphanumeric() && c != '_');
            before && after
        })
    })
}

/// The inline modules of a file (`mod tests { … }`) and where each one's braces start and end.
fn inline_modules(code: &[u8]) -> Vec<(String, usize, usize)> {
    let mut found = Vec::new();
    let mut open: Vec<(Option<String>, usize)> = Vec::new();
    let mut i = 0;
    // The word that ends just before `end`, whitespace before it skipped, and where it starts.
    let word_before = |end: usize| {
        let end = (0..end).rev().find(|&j| !code[j].is_ascii_whitespace()).map_or(0, |j| j + 1);
        let start = (0..end).rev().find(|&j| !is_ident(code[j])).map_or(0, |j| j + 1);
        (&code[start..end], start)
    };
    while i < code.len() {
        match code[i] {
            b'{' => {
                let (name, start) = word_before(i);
                let name = (!name.is_empty() && word_before(start).0 == b"mod")
                    .then(|| String::from_utf8_lossy(name).into_owned());
                open.push((name, i));
            }
            b'}' => {
                if let Some((Some(name), start)) = open.pop() {
                    found.push((name, start, i));
                }
            }
            _ => {}
        }
        i += 1;
    }
    found
}

/// The module written at `offset` of `file`'s text: the file's, or an inline one inside it.
fn module_at(file: &str, inline: &[(String, usize, usize)], offset: usize) -> String {
    let mut enclosing: Vec<&(String, usize, usize)> =
        inline.iter().filter(|(_, start, end)| *start < offset && offset < *end).collect();
    enclosing.sort_by_key(|(_, start, _)| *start);
    let mut module: Vec<&str> = file.split("::").filter(|p| !p.is_empty()).collect();
    module.extend(enclosing.iter().map(|(name, _, _)| name.as_str()));
    module.join("::")
}

fn is_ident(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || byte == b'_'
}

/// How a crate may write a path to another module.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Paths {
    /// From the crate root only (`crate::train::job`): `super::` is refused but in a test module's
    /// `use super::*;` (the app).
    FromTheRoot,
    /// Relative ones too (`super::format::Header`), each followed to where it leads like any other.
    Relative,
}

/// Each module's imports of other modules of the crate (file to file), or the problems found on the
/// way: a path into a module that contains the importer (a test module's `use super::*;` excepted),
/// a `super::` where `paths` refuses one, a grouped `crate::{…}`.
pub fn rust_imports(files: &BTreeMap<String, String>, paths: Paths) -> (Graph, Vec<String>) {
    let codes: BTreeMap<&String, Vec<u8>> = files.iter().map(|(module, text)| (module, code(text))).collect();
    let inline: BTreeMap<&String, Vec<(String, usize, usize)>> =
        codes.iter().map(|(module, code)| (*module, inline_modules(code))).collect();
    let mut modules = Modules {
        file_of: BTreeMap::new(),
        reexports: BTreeMap::new(),
        codes: codes.iter().map(|(module, code)| ((*module).clone(), code.clone())).collect(),
    };
    for (file, blocks) in &inline {
        modules.file_of.insert((*file).clone(), (*file).clone());
        for (_, start, _) in blocks {
            modules.file_of.insert(module_at(file, blocks, start + 1), (*file).clone());
        }
    }
    // Every `pub use` (of any visibility: `pub(crate) use` re-exports within the crate), read first so
    // that a path through one can be followed whichever file comes first.
    for (file, code) in &codes {
        let text = String::from_utf8_lossy(code);
        for (at, _) in text.match_indices("use ") {
            if at > 0 && is_ident(code[at - 1]) {
                continue;
            }
            // `pub use`, `pub(crate) use`, `pub(in crate::model) use`: whatever follows the last `pub`
            // before the `use` is its visibility and nothing else.
            let head = text[..at].trim_end();
            let visibility = head.rfind("pub").map(|p| &head[p + 3..]);
            let exported = visibility.is_some_and(|v| {
                v.is_empty() || v.starts_with('(') && v.ends_with(')') && v.matches(['(', ')']).count() == 2
            });
            if !exported || head.rfind("pub").is_some_and(|p| p > 0 && is_ident(code[p - 1])) {
                continue;
            }
            let module = module_at(file, &inline[file], at);
            for leaf in path_tree(code, at + 4).0 {
                let (leaf, alias) = match leaf.iter().position(|p| p == "as") {
                    Some(n) => (leaf[..n].to_vec(), leaf[n + 1..].first().cloned()),
                    None => (leaf.clone(), leaf.last().cloned()),
                };
                // Another crate's item stands for no module of this one: an empty path.
                if let Some(name) = alias {
                    let target = modules.absolute(&module, &leaf).unwrap_or_default();
                    modules.reexports.entry((module.clone(), name)).or_default().push(target);
                }
            }
        }
    }
    let mut graph = Graph::new();
    let mut problems = Vec::new();
    for (file, code) in &codes {
        let imports = graph.entry((*file).clone()).or_default();
        let line_of = |at: usize| code[..at].iter().filter(|&&b| b == b'\n').count() + 1;
        let name = if file.is_empty() { "lib" } else { file.as_str() };
        let text = String::from_utf8_lossy(code);
        for (number, line) in text.lines().enumerate() {
            if paths == Paths::FromTheRoot && line.contains("super::") && line.trim() != "use super::*;" {
                problems.push(format!(
                    "{name} line {}: `super::` reaches the module that contains this one: {}",
                    number + 1,
                    line.trim()
                ));
            }
        }
        let mut at = 0;
        while at < code.len() {
            let starts = at == 0 || !is_ident(code[at - 1]) && code[at - 1] != b':';
            let word_end = (at..code.len()).find(|&j| !is_ident(code[j])).unwrap_or(code.len());
            if !starts || word_end == at || !code[word_end..].starts_with(b"::") {
                at = if starts && word_end > at { word_end } else { at + 1 };
                continue;
            }
            let module = module_at(file, &inline[file], at);
            let (leaves, end) = path_tree(code, at);
            let visibility = String::from_utf8_lossy(&code[at.saturating_sub(16)..at]).trim_end().ends_with("(in");
            if &code[at..word_end] == b"crate" && code[word_end + 2..].starts_with(b"{") {
                problems.push(format!("{name} line {}: a grouped `crate::{{…}}`; write one path per use", line_of(at)));
            }
            for leaf in leaves.iter().filter(|_| !visibility) {
                let leaf: Vec<String> = leaf.iter().take_while(|p| *p != "as").cloned().collect();
                let Some(path) = modules.absolute(&module, &leaf) else { continue };
                let Some(target) = modules.defining_file(&path) else { continue };
                // A test module's `use super::*;` imports the file it tests (its own, or the one above a
                // test file); a `super::` the crate refuses was reported above, and leads where it leads.
                let glob_of_super = leaf == ["super", "*"];
                let reported = paths == Paths::FromTheRoot;
                if target == **file || leaf[0] == "super" && contains(&target, file) && (glob_of_super || reported) {
                    continue;
                }
                if contains(&target, file) {
                    let named = if target.is_empty() { "the crate root" } else { &target };
                    problems.push(format!(
                        "{name} line {}: `{}` imports from {named}, which contains this module",
                        line_of(at),
                        leaf.join("::")
                    ));
                } else {
                    imports.insert(target);
                }
            }
            at = end.max(at + 1);
        }
    }
    (graph, problems)
}

/// The modules of the first circle found in `graph`, if any.
pub fn circle(graph: &Graph) -> Option<Vec<String>> {
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

/// Every set of two or more modules that import each other round a circle (the graph's strongly
/// connected components), each sorted.
pub fn circles(graph: &Graph) -> Vec<BTreeSet<String>> {
    let reaches = |from: &str| {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.to_string()];
        while let Some(node) = todo.pop() {
            for next in graph.get(&node).into_iter().flatten() {
                if seen.insert(next.clone()) {
                    todo.push(next.clone());
                }
            }
        }
        seen
    };
    let reach: BTreeMap<&String, BTreeSet<String>> = graph.keys().map(|node| (node, reaches(node))).collect();
    let mut found: Vec<BTreeSet<String>> = Vec::new();
    for node in graph.keys() {
        let component: BTreeSet<String> = reach[node]
            .iter()
            .filter(|other| reach.get(other).is_some_and(|back| back.contains(node)))
            .cloned()
            .collect();
        if component.len() > 1 && !found.contains(&component) {
            found.push(component);
        }
    }
    found
}

/// The same imports between top-level folders (`train::job` → `worker::process` is `train` → `worker`).
pub fn by_folder(graph: &Graph) -> Graph {
    let top = |module: &str| module.split("::").next().unwrap_or_default().to_string();
    let mut folders = Graph::new();
    for (module, imports) in graph {
        let from = folders.entry(top(module)).or_default();
        from.extend(imports.iter().map(|import| top(import)).filter(|to| *to != top(module)));
    }
    folders
}

/// What a crate's stack must keep, beyond the rules every crate keeps ([`rust_imports`]).
pub struct Rules<'a> {
    pub paths: Paths,
    /// Sets of modules of one folder that may import each other round a circle, each with why.
    /// Every other circle is refused, and so is a listed one that is no longer there.
    pub circles: &'a [(&'a [&'a str], &'a str)],
    /// The ground floor: modules that import nothing of the crate but each other (and their own
    /// children).
    pub ground: &'a [&'a str],
    /// Pairs of folders neither of which imports the other (`model::fast` and `model::san`).
    pub apart: &'a [(&'a str, &'a str)],
    /// Whether the top-level folders, too, import each other round no circle.
    pub folders: bool,
}

/// Everything in `modules` that breaks `rules`, one line each.
pub fn violations(modules: &BTreeMap<String, String>, rules: &Rules) -> Vec<String> {
    let (graph, mut found) = rust_imports(modules, rules.paths);
    let allowed: Vec<BTreeSet<String>> =
        rules.circles.iter().map(|(members, _)| members.iter().map(|m| m.to_string()).collect()).collect();
    let circles = circles(&graph);
    for circle in &circles {
        let folders: BTreeSet<&str> = circle.iter().map(|m| folder(m)).collect();
        let names = circle.iter().cloned().collect::<Vec<_>>().join(" → ");
        if folders.len() > 1 {
            found.push(format!("a circle between files of different folders: {names}"));
        } else if !allowed.contains(circle) {
            found.push(format!("a circle no note allows: {names}"));
        }
    }
    for listed in &allowed {
        if !circles.contains(listed) {
            found.push(format!("the allowed circle {listed:?} is no longer there; drop it from the list"));
        }
    }
    let inside = |module: &str, of: &str| module == of || contains(of, module);
    for (module, imports) in &graph {
        let Some(floor) = rules.ground.iter().find(|g| inside(module, g)) else { continue };
        for import in imports {
            if !rules.ground.iter().any(|g| inside(import, g)) {
                found.push(format!("{module} is on the ground floor ({floor}) but imports {import}"));
            }
        }
    }
    for (a, b) in rules.apart {
        for (from, to) in [(a, b), (b, a)] {
            for (module, imports) in graph.iter().filter(|(m, _)| inside(m, from)) {
                for import in imports.iter().filter(|i| inside(i, to)) {
                    found.push(format!("{module} imports {import}: {from} and {to} import neither each other"));
                }
            }
        }
    }
    if let Some(circle) = rules.folders.then(|| circle(&by_folder(&graph))).flatten() {
        found.push(format!("folders importing each other round a circle: {}", circle.join(" → ")));
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn crate_of(modules: &[(&str, &str)]) -> BTreeMap<String, String> {
        modules.iter().map(|(module, text)| (module.to_string(), text.to_string())).collect()
    }

    #[test]
    fn an_import_up_a_level_and_a_circle_are_found() {
        let modules = crate_of(&[
            ("", "mod train;\nfn lock() {}"),
            ("ground", "pub fn lock() {}"),
            ("train", "pub mod job;"),
            ("train::job", "use crate::lock;\nuse crate::worker::process::Worker;\nuse crate::ground::lock;"),
            ("worker", "pub mod process;"),
            ("worker::process", "use crate::train::job::start;\nuse super::Worker;"),
        ]);
        let (graph, problems) = rust_imports(&modules, Paths::FromTheRoot);
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].contains("train::job line 1") && problems[0].contains("the crate root"), "{problems:?}");
        assert!(problems[1].contains("worker::process line 2: `super::`"), "{problems:?}");
        assert_eq!(graph["train::job"], BTreeSet::from(["ground".to_string(), "worker::process".to_string()]));
        assert_eq!(circle(&graph).map(|c| c.len()), Some(3), "train::job → worker::process → train::job");
        assert_eq!(circles(&graph), [BTreeSet::from(["train::job".to_string(), "worker::process".to_string()])]);
        assert!(circle(&by_folder(&graph)).is_some());
    }

    #[test]
    fn a_re_export_is_followed_to_the_file_that_defines_the_item() {
        let modules = crate_of(&[
            ("", "pub mod cact;\npub mod model;"),
            ("cact", "mod reader;\npub use reader::{CactFile, Record as Entry};\npub(crate) use self::reader::Bits;"),
            ("cact::reader", "pub struct CactFile;\npub struct Record;\npub struct Bits;"),
            (
                "model",
                "pub mod params;\n/// `crate::cact::CactFile` in a comment, and in a string:\nconst A: &str = \"crate::cact::X\";",
            ),
            (
                "model::params",
                "use crate::cact::CactFile;\nfn f(b: crate::cact::Bits) -> crate::cact::Entry {\n    let c = 'x'; todo!()\n}",
            ),
        ]);
        let (graph, problems) = rust_imports(&modules, Paths::FromTheRoot);
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(graph["model::params"], BTreeSet::from(["cact::reader".to_string()]));
        assert_eq!(graph["cact"], BTreeSet::from(["cact::reader".to_string()]));
        assert_eq!(graph["model"], BTreeSet::new(), "comments and strings are no imports");
    }

    #[test]
    fn an_item_of_a_parent_through_a_group_or_a_child_path_is_an_import_and_a_visibility_is_not() {
        let modules = crate_of(&[
            ("", "pub mod model;\npub mod ground;"),
            ("ground", "pub struct G;"),
            ("model", "mod san;\nmod fast;\npub enum ModelError {}\nfn pick() { fast::run(); }"),
            (
                "model::san",
                "use crate::model::{\n    fast::Host,\n    ModelError,\n};\npub(in crate::model) struct S;\n\
                 #[cfg(test)]\nmod tests {\n    use super::*;\n    use crate::ground::G;\n}",
            ),
            ("model::fast", "pub fn run() {}\npub struct Host;"),
            ("other", "use crate::{ground::G};"),
        ]);
        let (graph, problems) = rust_imports(&modules, Paths::FromTheRoot);
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(
            problems[0].contains("model::san line 1") && problems[0].contains("`crate::model::ModelError`"),
            "{problems:?}"
        );
        assert!(problems[1].contains("other line 1: a grouped"), "{problems:?}");
        assert_eq!(graph["model"], BTreeSet::from(["model::fast".to_string()]));
        assert_eq!(graph["model::san"], BTreeSet::from(["ground".to_string(), "model::fast".to_string()]));
    }

    #[test]
    fn code_keeps_lines_and_drops_comments_and_literals() {
        let text = "let a = \"x::y\"; // crate::z\n/* crate::w\n */ let b = r#\"crate::v\"#; let c = '\"'; 'a: loop {}";
        let code = String::from_utf8(code(text)).unwrap();
        assert_eq!(code.lines().count(), text.lines().count());
        assert!(!code.contains("crate::") && !code.contains("x::y"), "{code}");
        assert!(code.contains("'a: loop"), "{code}");
    }
}
