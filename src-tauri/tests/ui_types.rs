//! The window's types, generated from the Rust ones: `ui/ground/types.d.ts` is written here from the
//! app's commands (found from the `#[tauri::command]` functions themselves): `Commands`, each command's
//! name, its arguments as Tauri reads them and its answer, which `ui/ground/api.js`'s one `invoke` is
//! typed with; and every type those reach, as serde writes them. The window's JavaScript is
//! type-checked against it (`tsc --noEmit --checkJs`), so a serde field, a command or a command's
//! argument renamed in Rust fails here until the UI follows it.
//!
//! The types are read from their source with `syn`, serde attributes included, rather than derived
//! (`ts-rs`, `specta`): most of what the window reads is the engine's (the plan, the dataset report, the
//! training events, the scores), and a derive there would put the desktop UI's concern into the
//! engine, and into every crate the engine uses. `NEEDLE_UI_TYPES=write cargo test -p needle-studio
//! --test ui_types` writes the file again after a change.
//!
//! Beside it, `ui/ground/elements.d.ts` is written from `ui/index.html`: each id there and the tag of the
//! element that has it, which `ui/ground/dom.js`'s `$` returns, so an id the page does not have, or an
//! element used as another kind (an `<input>` as a `<canvas>`), fails the same type check.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};
use std::process::Command;

use syn::{Attribute, Fields, GenericArgument, Item, PathArguments, ReturnType, Type};

/// Types whose `Serialize` is written by hand, which the generator cannot read: what they write,
/// and the types that names. A type listed here that derives `Serialize` again fails the test.
const HAND_WRITTEN: &[(&str, &str, &[&str])] =
    &[("Problem", "{ line: number; issue: Issue; skipped: boolean; message: string }", &["Issue"])];

/// Commands that answer with JSON the worker printed, passed on as it was (`serde_json::Value`), and
/// the type that JSON is.
const PASSED_THROUGH: &[(&str, &str)] = &[("load_dataset", "DatasetReport")];

/// Command arguments that are Tauri's, not the window's.
const TAURI_ARGUMENTS: &[&str] = &["State", "AppHandle", "Window", "WebviewWindow"];

fn repo(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(relative)
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())).flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(rust_files(&path));
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            found.push(path);
        }
    }
    found.sort();
    found
}

/// The sources the types are read from: the app's and the engine's, as (file, text).
fn sources() -> Vec<(PathBuf, String)> {
    [repo("src-tauri/src"), repo("crates/engine/src")]
        .iter()
        .flat_map(|dir| rust_files(dir))
        .map(|file| {
            let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            (file, text)
        })
        .collect()
}

// ---------- serde's attributes ----------

/// The serde attributes of an item, a field or a variant that change what is written.
#[derive(Default)]
struct Serde {
    rename: Option<String>,
    rename_all: Option<String>,
    tag: Option<String>,
    content: Option<String>,
    untagged: bool,
    flatten: bool,
    transparent: bool,
    default: bool,
    skip_serializing: bool,
    skip_deserializing: bool,
    optional: bool,
    /// An attribute that makes what is written unreadable from the type (`serialize_with`, `into`).
    opaque: Option<String>,
}

fn serde_of(attrs: &[Attribute]) -> Serde {
    let mut serde = Serde::default();
    for attr in attrs.iter().filter(|attr| attr.path().is_ident("serde")) {
        attr.parse_nested_meta(|meta| {
            let key = meta.path.get_ident().map(ToString::to_string).unwrap_or_default();
            let value = if meta.input.peek(syn::Token![=]) {
                match meta.value()?.parse::<syn::Expr>()? {
                    syn::Expr::Lit(syn::ExprLit { lit: syn::Lit::Str(text), .. }) => Some(text.value()),
                    _ => None,
                }
            } else {
                None
            };
            match key.as_str() {
                "rename" => serde.rename = value,
                "rename_all" => serde.rename_all = value,
                "tag" => serde.tag = value,
                "content" => serde.content = value,
                "untagged" => serde.untagged = true,
                "flatten" => serde.flatten = true,
                "transparent" => serde.transparent = true,
                "default" => serde.default = true,
                "skip" => (serde.skip_serializing, serde.skip_deserializing) = (true, true),
                "skip_serializing" => serde.skip_serializing = true,
                "skip_deserializing" => serde.skip_deserializing = true,
                "skip_serializing_if" => serde.optional = true,
                "serialize_with" | "with" | "into" | "from" | "try_from" | "remote" | "getter" => {
                    serde.opaque = Some(key)
                }
                // Reading only: what is written does not change.
                _ => {}
            }
            Ok(())
        })
        .unwrap_or_else(|e| panic!("a serde attribute the generator cannot read: {e}"));
    }
    serde
}

/// `name` as serde's `rename_all = rule` writes it.
fn renamed(name: &str, rule: Option<&str>) -> String {
    let words: Vec<String> = if name.contains('_') {
        name.split('_').map(str::to_lowercase).collect()
    } else {
        let mut words = Vec::new();
        for c in name.chars() {
            if c.is_uppercase() || words.is_empty() {
                words.push(String::new());
            }
            words.last_mut().unwrap().extend(c.to_lowercase());
        }
        words
    };
    let capitalised = |word: &String| word[..1].to_uppercase() + &word[1..];
    match rule {
        None => name.to_string(),
        Some("snake_case") => words.join("_"),
        Some("kebab-case") => words.join("-"),
        Some("lowercase") => words.concat(),
        Some("UPPERCASE") => words.concat().to_uppercase(),
        Some("SCREAMING_SNAKE_CASE") => words.join("_").to_uppercase(),
        Some("PascalCase") => words.iter().map(capitalised).collect(),
        Some("camelCase") => {
            words.first().cloned().unwrap_or_default() + &words[1..].iter().map(capitalised).collect::<String>()
        }
        Some(other) => panic!("rename_all = {other:?} is not known to the generator"),
    }
}

fn derives(attrs: &[Attribute], name: &str) -> bool {
    attrs.iter().filter(|attr| attr.path().is_ident("derive")).any(|attr| {
        let mut found = false;
        let _ = attr.parse_nested_meta(|meta| {
            found |= meta.path.segments.last().is_some_and(|last| last.ident == name);
            Ok(())
        });
        found
    })
}

fn docs(attrs: &[Attribute], indent: &str) -> String {
    let lines: Vec<String> = attrs
        .iter()
        .filter_map(|attr| match &attr.meta {
            syn::Meta::NameValue(doc) if doc.path.is_ident("doc") => match &doc.value {
                syn::Expr::Lit(syn::ExprLit { lit: syn::Lit::Str(text), .. }) => Some(text.value()),
                _ => None,
            },
            _ => None,
        })
        .map(|line| line.trim().replace("*/", "*\\/"))
        .collect();
    match lines.as_slice() {
        [] => String::new(),
        [one] => format!("{indent}/** {one} */\n"),
        many => {
            let lines: String = many
                .iter()
                .map(|l| if l.is_empty() { format!("{indent} *\n") } else { format!("{indent} * {l}\n") })
                .collect();
            format!("{indent}/**\n{lines}{indent} */\n")
        }
    }
}

// ---------- the generator ----------

/// Which way a struct travels: read by the app (`Deserialize`: the window or a file may leave out a
/// field with a default), or only read (then also an `Option`, or any field of a type defaulted whole).
#[derive(Default, Clone)]
struct Sent {
    read: bool,
    input: bool,
    all_default: bool,
    /// An internally tagged variant's tag, written first.
    tag: Option<String>,
}

/// A `#[tauri::command]` function as the window calls it.
struct CommandFn {
    name: String,
    attrs: Vec<Attribute>,
    /// The window's arguments, Tauri's own (`State`, `AppHandle`, …) left out: the key the window
    /// sends each under, and its type.
    arguments: Vec<(String, Type)>,
    /// What it returns; `None` for nothing.
    output: Option<Type>,
}

/// A type definition found in the sources.
enum Definition {
    Struct(syn::ItemStruct),
    Enum(syn::ItemEnum),
    Alias(syn::ItemType),
}

struct Generator {
    /// Every public type of the sources, by name, with its file (a name may have several: the one
    /// meant is the one in the file that names it).
    definitions: BTreeMap<String, Vec<(PathBuf, Definition)>>,
    /// Types with a `Serialize` written by hand.
    hand_written: BTreeSet<String>,
    /// The app's commands.
    commands: Vec<CommandFn>,
    /// Types to write, each with the file that named it.
    queue: VecDeque<(String, PathBuf)>,
    seen: BTreeSet<String>,
    /// The file of the type being written.
    file: PathBuf,
}

impl Generator {
    fn new(sources: &[(PathBuf, String)]) -> Self {
        let mut generator = Self {
            definitions: BTreeMap::new(),
            hand_written: BTreeSet::new(),
            commands: Vec::new(),
            queue: VecDeque::new(),
            seen: BTreeSet::new(),
            file: PathBuf::new(),
        };
        for (file, text) in sources {
            let parsed = syn::parse_file(text).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            let in_app = file.starts_with(repo("src-tauri/src"));
            generator.collect(file, &parsed.items, in_app);
        }
        generator.commands.sort_by(|a, b| a.name.cmp(&b.name));
        generator
    }

    fn collect(&mut self, file: &Path, items: &[Item], in_app: bool) {
        for item in items {
            let name = match item {
                Item::Struct(item) => Some((item.ident.to_string(), Definition::Struct(item.clone()))),
                Item::Enum(item) => Some((item.ident.to_string(), Definition::Enum(item.clone()))),
                Item::Type(item) => Some((item.ident.to_string(), Definition::Alias(item.clone()))),
                Item::Impl(item) => {
                    let serialize = item
                        .trait_
                        .as_ref()
                        .is_some_and(|(_, path, _)| path.segments.last().is_some_and(|last| last.ident == "Serialize"));
                    if let (true, Type::Path(own)) = (serialize, &*item.self_ty) {
                        self.hand_written.extend(own.path.segments.last().map(|last| last.ident.to_string()));
                    }
                    None
                }
                Item::Mod(module) if !module.attrs.iter().any(|attr| attr.path().is_ident("cfg")) => {
                    if let Some((_, items)) = &module.content {
                        self.collect(file, items, in_app);
                    }
                    None
                }
                Item::Fn(function) if in_app && is_command(&function.attrs) => {
                    self.commands.push(command_fn(function));
                    None
                }
                _ => None,
            };
            if let Some((name, definition)) = name {
                // Public definitions only: a private helper type of the same name is no concern here.
                let public = match &definition {
                    Definition::Struct(item) => matches!(item.vis, syn::Visibility::Public(_)),
                    Definition::Enum(item) => matches!(item.vis, syn::Visibility::Public(_)),
                    Definition::Alias(item) => matches!(item.vis, syn::Visibility::Public(_)),
                };
                if public {
                    self.definitions.entry(name).or_default().push((file.to_path_buf(), definition));
                }
            }
        }
    }

    /// `types.d.ts`: the commands, then every type they reach, in name order.
    fn generate(mut self) -> String {
        let commands = self.commands_map();
        let mut written = BTreeMap::new();
        while let Some((name, named_in)) = self.queue.pop_front() {
            if !self.seen.insert(name.clone()) {
                continue;
            }
            let text = self.definition(&name, &named_in);
            written.insert(name, text);
        }
        let mut out = String::from(
            "// The types the window's commands and channels carry, generated from the Rust types by\n\
             // src-tauri/tests/ui_types.rs; do not edit (NEEDLE_UI_TYPES=write cargo test -p needle-studio\n\
             // --test ui_types writes it again).\n",
        );
        out.push_str(CHANNEL);
        out.push_str(&commands);
        for text in written.values() {
            out.push('\n');
            out.push_str(text);
        }
        out
    }

    /// `Commands`: each command's arguments as the window sends them and the answer it gets.
    fn commands_map(&mut self) -> String {
        let commands = std::mem::take(&mut self.commands);
        let mut lines = Vec::new();
        for command in &commands {
            let arguments: Vec<String> = command
                .arguments
                .iter()
                .map(|(key, ty)| match channel_of(ty) {
                    Some(message) => format!("{key}: Channel<{}>", self.ts(message)),
                    None => format!("{key}: {}", self.ts(ty)),
                })
                .collect();
            let passed = PASSED_THROUGH.iter().find(|(name, _)| *name == command.name);
            let answer = match (passed, command.output.as_ref().map(answered)) {
                (Some((_, passed)), _) => {
                    self.queue.push_back((passed.to_string(), PathBuf::new()));
                    passed.to_string()
                }
                (None, Some(ty)) => self.ts(&ty),
                (None, None) => "null".into(),
            };
            let arguments = if arguments.is_empty() {
                "Record<string, never>".into()
            } else {
                format!("{{ {} }}", arguments.join("; "))
            };
            lines.push(format!(
                "{}  {}: {{ args: {arguments}; answer: {answer} }};",
                docs(&command.attrs, "  "),
                command.name
            ));
        }
        self.commands = commands;
        format!(
            "\n/** Every command the window may call: the arguments it sends (as Tauri names them) and the answer. */\n\
             export type Commands = {{\n{}\n}};\n",
            lines.join("\n")
        )
    }

    fn definition(&mut self, name: &str, named_in: &Path) -> String {
        let hand = HAND_WRITTEN.iter().find(|(hand, _, _)| *hand == name);
        let by_hand = self.hand_written.contains(name);
        match (hand, by_hand) {
            (Some((_, text, uses)), true) => {
                let (file, attrs) = match self.definitions.get(name).map(Vec::as_slice) {
                    Some([(file, Definition::Struct(item))]) => (file.clone(), item.attrs.clone()),
                    _ => panic!("{name}, written by hand, must be one public struct"),
                };
                self.queue.extend(uses.iter().map(|used| (used.to_string(), file.clone())));
                return format!("{}export type {name} = {text};\n", docs(&attrs, ""));
            }
            (Some(_), false) => panic!("{name} is listed in HAND_WRITTEN but derives its Serialize now: remove it"),
            (None, true) => panic!("{name}'s Serialize is written by hand: add what it writes to HAND_WRITTEN"),
            (None, false) => {}
        }
        let mut found = self.definitions.remove(name).unwrap_or_default();
        if found.len() > 1 {
            // Of several types of one name, the one written for the window (a type the app never sends,
            // such as the settings table's `Kind`, derives no Serialize), then the one in the file naming it.
            let sent = |definition: &Definition| match definition {
                Definition::Struct(item) => derives(&item.attrs, "Serialize"),
                Definition::Enum(item) => derives(&item.attrs, "Serialize"),
                Definition::Alias(_) => true,
            };
            if !self.hand_written.contains(name) {
                found.retain(|(_, definition)| sent(definition));
            }
        }
        if found.len() > 1 {
            found.retain(|(file, _)| file == named_in);
        }
        let (file, definition) = match (found.pop(), found.is_empty()) {
            (Some(definition), true) => definition,
            (None, _) => panic!("the window's types reach {name}, which has no public definition in the sources"),
            (Some(_), false) => panic!("the window's types reach {name}, and several public Rust types have that name"),
        };
        self.file = file;
        match definition {
            Definition::Alias(item) => {
                format!("{}export type {name} = {};\n", docs(&item.attrs, ""), self.ts(&item.ty))
            }
            Definition::Struct(item) => {
                let serde = serde_of(&item.attrs);
                let read = derives(&item.attrs, "Deserialize");
                let input = read && !derives(&item.attrs, "Serialize");
                let body = match &item.fields {
                    Fields::Unnamed(fields) if fields.unnamed.len() == 1 => self.ts(&fields.unnamed[0].ty),
                    Fields::Unnamed(fields) => {
                        let parts: Vec<String> = fields.unnamed.iter().map(|field| self.ts(&field.ty)).collect();
                        format!("[{}]", parts.join(", "))
                    }
                    Fields::Unit => "null".into(),
                    Fields::Named(fields) if serde.transparent => self.ts(&fields.named[0].ty),
                    Fields::Named(fields) => {
                        let sent = Sent { read, input, all_default: serde.default, tag: None };
                        self.object(&fields.named, serde.rename_all.as_deref(), sent, "")
                    }
                };
                format!("{}export type {name} = {body};\n", docs(&item.attrs, ""))
            }
            Definition::Enum(item) => {
                let serde = serde_of(&item.attrs);
                assert!(serde.opaque.is_none(), "{name}: serde({}) is not readable", serde.opaque.unwrap_or_default());
                let mut variants = Vec::new();
                for variant in &item.variants {
                    let own = serde_of(&variant.attrs);
                    if own.skip_serializing {
                        continue;
                    }
                    let tag_value = own
                        .rename
                        .clone()
                        .unwrap_or_else(|| renamed(&variant.ident.to_string(), serde.rename_all.as_deref()));
                    let quoted = format!("{tag_value:?}");
                    let doc = docs(&variant.attrs, "  ");
                    let text = match (&serde, &variant.fields) {
                        (Serde { untagged: true, .. }, Fields::Unit) => "null".into(),
                        (Serde { untagged: true, .. }, Fields::Unnamed(fields)) => self.ts(&fields.unnamed[0].ty),
                        (Serde { untagged: true, .. }, Fields::Named(fields)) => {
                            self.object(&fields.named, None, Sent::default(), "  ")
                        }
                        (Serde { tag: Some(tag), content: Some(content), .. }, fields) => {
                            let inner = match fields {
                                Fields::Unit => None,
                                Fields::Unnamed(fields) => Some(self.ts(&fields.unnamed[0].ty)),
                                Fields::Named(fields) => Some(self.object(&fields.named, None, Sent::default(), "  ")),
                            };
                            match inner {
                                Some(inner) => format!("{{ {tag}: {quoted}; {content}: {inner} }}"),
                                None => format!("{{ {tag}: {quoted} }}"),
                            }
                        }
                        (Serde { tag: Some(tag), .. }, Fields::Unit) => format!("{{ {tag}: {quoted} }}"),
                        (Serde { tag: Some(tag), .. }, Fields::Unnamed(fields)) => {
                            format!("({{ {tag}: {quoted} }} & {})", self.ts(&fields.unnamed[0].ty))
                        }
                        (Serde { tag: Some(tag), .. }, Fields::Named(fields)) => {
                            let sent = Sent { tag: Some(format!("{tag}: {quoted};")), ..Sent::default() };
                            self.object(&fields.named, None, sent, "  ")
                        }
                        (_, Fields::Unit) => quoted,
                        (_, Fields::Unnamed(fields)) => format!("{{ {quoted}: {} }}", self.ts(&fields.unnamed[0].ty)),
                        (_, Fields::Named(fields)) => {
                            format!("{{ {quoted}: {} }}", self.object(&fields.named, None, Sent::default(), "  "))
                        }
                    };
                    variants.push(format!("{doc}  | {text}"));
                }
                format!("{}export type {name} =\n{};\n", docs(&item.attrs, ""), variants.join("\n"))
            }
        }
    }

    /// A struct's (or a variant's) named fields as an object type, with the flattened ones joined.
    fn object(
        &mut self,
        fields: &syn::punctuated::Punctuated<syn::Field, syn::Token![,]>,
        rename_all: Option<&str>,
        sent: Sent,
        indent: &str,
    ) -> String {
        let Sent { read, input, all_default, tag } = sent;
        let mut lines: Vec<String> = tag.into_iter().map(|tag| format!("{indent}  {tag}")).collect();
        let mut flattened = Vec::new();
        for field in fields {
            let serde = serde_of(&field.attrs);
            let ident = field.ident.as_ref().expect("a named field").to_string();
            assert!(
                serde.opaque.is_none(),
                "field {ident}: serde({}) is not readable",
                serde.opaque.unwrap_or_default()
            );
            if (!input && serde.skip_serializing) || (input && serde.skip_deserializing) {
                continue;
            }
            if serde.flatten {
                flattened.push(self.ts(&field.ty));
                continue;
            }
            let key = serde.rename.unwrap_or_else(|| renamed(&ident, rename_all));
            // What the window may leave out when it sends the type, or may not find (left out when empty).
            let optional = serde.optional
                || (read && serde.default)
                || (input && (all_default || outer(&field.ty) == Some("Option")));
            let mark = if optional { "?" } else { "" };
            lines.push(format!(
                "{}{indent}  {key}{mark}: {};",
                docs(&field.attrs, &format!("{indent}  ")),
                self.ts(&field.ty)
            ));
        }
        let object = if lines.is_empty() { "{}".to_string() } else { format!("{{\n{}\n{indent}}}", lines.join("\n")) };
        std::iter::once(object).chain(flattened).collect::<Vec<_>>().join(" & ")
    }

    /// A Rust type as TypeScript writes what serde makes of it.
    fn ts(&mut self, ty: &Type) -> String {
        match ty {
            Type::Reference(reference) => self.ts(&reference.elem),
            Type::Paren(inner) => self.ts(&inner.elem),
            Type::Group(inner) => self.ts(&inner.elem),
            Type::Slice(slice) => format!("{}[]", self.element(&slice.elem)),
            Type::Array(array) => format!("{}[]", self.element(&array.elem)),
            Type::Tuple(tuple) if tuple.elems.is_empty() => "null".into(),
            Type::Tuple(tuple) => {
                let parts: Vec<String> = tuple.elems.iter().map(|elem| self.ts(elem)).collect();
                format!("[{}]", parts.join(", "))
            }
            Type::Path(path) => {
                let last = path.path.segments.last().expect("a type name");
                let arguments: Vec<&Type> = match &last.arguments {
                    PathArguments::AngleBracketed(args) => args
                        .args
                        .iter()
                        .filter_map(|arg| match arg {
                            GenericArgument::Type(ty) => Some(ty),
                            _ => None,
                        })
                        .collect(),
                    _ => Vec::new(),
                };
                match (last.ident.to_string().as_str(), arguments.as_slice()) {
                    ("String" | "str" | "PathBuf" | "Path" | "OsString" | "char", _) => "string".into(),
                    ("bool", _) => "boolean".into(),
                    (
                        "u8" | "u16" | "u32" | "u64" | "u128" | "usize" | "i8" | "i16" | "i32" | "i64" | "i128"
                        | "isize" | "f32" | "f64",
                        _,
                    ) => "number".into(),
                    ("Value", _) => "unknown".into(),
                    ("Option", [inner]) => format!("{} | null", self.ts(inner)),
                    ("Vec" | "VecDeque" | "BTreeSet" | "HashSet", [inner]) => format!("{}[]", self.element(inner)),
                    ("Box" | "Arc" | "Rc" | "Cow", [.., inner]) => self.ts(inner),
                    ("BTreeMap" | "HashMap" | "Map", [_, value]) => format!("Record<string, {}>", self.ts(value)),
                    (name, []) => {
                        self.queue.push_back((name.to_string(), self.file.clone()));
                        name.to_string()
                    }
                    (name, _) => panic!("the generic type {name}<…> is not known to the generator"),
                }
            }
            _ => panic!("a type the generator cannot write (not a path, reference, slice, array or tuple)"),
        }
    }

    /// An element type, in parentheses where `[]` would bind to its last part.
    fn element(&mut self, ty: &Type) -> String {
        let text = self.ts(ty);
        if text.contains(' ') {
            format!("({text})")
        } else {
            text
        }
    }
}

fn outer(ty: &Type) -> Option<&'static str> {
    match ty {
        Type::Path(path) if path.path.segments.last().is_some_and(|last| last.ident == "Option") => Some("Option"),
        _ => None,
    }
}

fn command_attribute(attrs: &[Attribute]) -> Option<&Attribute> {
    attrs.iter().find(|attr| attr.path().segments.last().is_some_and(|last| last.ident == "command"))
}

fn is_command(attrs: &[Attribute]) -> bool {
    command_attribute(attrs).is_some()
}

/// A command as the window calls it. Tauri reads each argument under its name in camelCase, unless the
/// attribute says otherwise (`#[tauri::command(rename_all = "snake_case")]`).
fn command_fn(function: &syn::ItemFn) -> CommandFn {
    let mut rename_all = "camelCase".to_string();
    let listed = command_attribute(&function.attrs).filter(|attr| matches!(attr.meta, syn::Meta::List(_)));
    if let Some(attribute) = listed {
        attribute
            .parse_nested_meta(|meta| {
                if meta.path.is_ident("rename_all") {
                    rename_all = meta.value()?.parse::<syn::LitStr>()?.value();
                }
                Ok(())
            })
            .unwrap_or_else(|e| panic!("{}: a command attribute the generator cannot read: {e}", function.sig.ident));
    }
    let arguments = function
        .sig
        .inputs
        .iter()
        .filter_map(|input| match input {
            syn::FnArg::Typed(argument) => Some(argument),
            syn::FnArg::Receiver(_) => None,
        })
        .filter(|argument| !generic_name(&argument.ty).is_some_and(|name| TAURI_ARGUMENTS.contains(&name.as_str())))
        .map(|argument| {
            let syn::Pat::Ident(ident) = &*argument.pat else {
                panic!("{}: an argument that is not a plain name", function.sig.ident)
            };
            (renamed(&ident.ident.to_string(), Some(&rename_all)), (*argument.ty).clone())
        })
        .collect();
    let output = match &function.sig.output {
        ReturnType::Type(_, ty) => Some((**ty).clone()),
        ReturnType::Default => None,
    };
    CommandFn { name: function.sig.ident.to_string(), attrs: function.attrs.clone(), arguments, output }
}

/// The last name of a path type (`State` of `tauri::State<'_, X>`).
fn generic_name(ty: &Type) -> Option<String> {
    match ty {
        Type::Path(path) => path.path.segments.last().map(|last| last.ident.to_string()),
        _ => None,
    }
}

/// The first type argument of a path type (`X` of `Channel<X>`).
fn first_argument(ty: &Type) -> Option<&Type> {
    let Type::Path(path) = ty else { return None };
    match &path.path.segments.last()?.arguments {
        PathArguments::AngleBracketed(args) => args.args.iter().find_map(|arg| match arg {
            GenericArgument::Type(ty) => Some(ty),
            _ => None,
        }),
        _ => None,
    }
}

/// The messages of a channel argument.
fn channel_of(ty: &Type) -> Option<&Type> {
    (generic_name(ty).as_deref() == Some("Channel")).then(|| first_argument(ty)).flatten()
}

/// What the window gets from a command returning `ty`: the value of an `Answer<T>` or `Result<T, E>`
/// (its error is the sentence the promise rejects with).
fn answered(ty: &Type) -> Type {
    match generic_name(ty).as_deref() {
        Some("Answer" | "Result") => first_argument(ty).cloned().expect("a result's value type"),
        _ => ty.clone(),
    }
}

/// How the window's side of a channel is typed: what `new Channel()` makes, given its handler.
const CHANNEL: &str = "\n/** A channel a command sends its messages on (Tauri's `Channel`). */\n\
                       export type Channel<T> = { onmessage: (message: T) => void };\n";

fn generated(sources: &[(PathBuf, String)]) -> String {
    Generator::new(sources).generate()
}

const TYPES: &str = "ui/ground/types.d.ts";

// ---------- the page's elements ----------

const PAGE: &str = "ui/index.html";
const ELEMENTS: &str = "ui/ground/elements.d.ts";

/// Each element of `html` with an id, as (id, tag), in the page's order. A page that gives one id to two
/// elements is refused: `$` would return only the first.
fn page_ids(html: &str) -> Vec<(String, String)> {
    let mut found: Vec<(String, String)> = Vec::new();
    let mut rest = html;
    while let Some(open) = rest.find('<') {
        rest = &rest[open + 1..];
        if let Some(comment) = rest.strip_prefix("!--") {
            rest = comment.split_once("-->").map_or("", |(_, after)| after);
            continue;
        }
        let name_len = rest.find(|c: char| !c.is_ascii_alphanumeric()).unwrap_or(rest.len());
        if name_len == 0 || !rest.starts_with(|c: char| c.is_ascii_alphabetic()) {
            continue; // a closing tag or a doctype
        }
        let end =
            rest.find('>').unwrap_or_else(|| panic!("{PAGE}: a tag that is never closed: <{}", &rest[..name_len]));
        let (tag, attributes) = (rest[..name_len].to_ascii_lowercase(), &rest[name_len..end]);
        let id = attributes
            .split(|c: char| c.is_ascii_whitespace())
            .find_map(|attribute| attribute.strip_prefix("id=\""))
            .and_then(|value| value.split('"').next());
        if let Some(id) = id {
            assert!(!found.iter().any(|(seen, _)| seen == id), "{PAGE}: the id {id:?} is given twice");
            found.push((id.to_string(), tag));
        }
        rest = &rest[end..];
    }
    found
}

/// `ui/ground/elements.d.ts` for the page `html`: its ids and their elements' tags.
fn elements(html: &str) -> String {
    let mut out = String::from(
        "// The elements ui/index.html gives an id: each id and its element's tag (as HTMLElementTagNameMap\n\
         // names it), which ui/ground/dom.js's `$` returns. Generated from the page by\n\
         // src-tauri/tests/ui_types.rs; do not edit (NEEDLE_UI_TYPES=write cargo test -p needle-studio\n\
         // --test ui_types writes it again).\n\nexport type Elements = {\n",
    );
    for (id, tag) in page_ids(html) {
        out.push_str(&format!("  '{id}': '{tag}';\n"));
    }
    out.push_str("};\n");
    out
}

// ---------- the type check ----------

/// `tsc` where `scripts/setup.sh --test` installs it (the version it pins), else from the PATH; the test
/// fails (never skips) without it.
fn tsc() -> PathBuf {
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_default();
    // npm's launcher is a shell script elsewhere and a `.cmd` on Windows, which `Command` runs only by that name.
    let name = if cfg!(windows) { "tsc.cmd" } else { "tsc" };
    let installed = home.join(".cache/needle-studio/node/node_modules/.bin").join(name);
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::iter::once(installed)
        .chain(std::env::split_paths(&path).map(|dir| dir.join(name)))
        .find(|tsc| tsc.is_file())
        .unwrap_or_else(|| panic!("no tsc (TypeScript) to check ui/ with: scripts/setup.sh --test installs it"))
}

/// `tsc --noEmit --checkJs` over the UI in `ui`, as its `jsconfig.json` says; its output when it fails.
fn type_check(ui: &Path) -> Result<(), String> {
    let out = Command::new(tsc())
        .arg("-p")
        .arg(ui.join("jsconfig.json"))
        .output()
        .unwrap_or_else(|e| panic!("cannot run tsc: {e}"));
    match out.status.success() {
        true => Ok(()),
        false => Err(format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))),
    }
}

#[test]
fn the_ui_types_are_the_rust_types() {
    let generated = generated(&sources());
    let path = repo(TYPES);
    if std::env::var("NEEDLE_UI_TYPES").as_deref() == Ok("write") {
        std::fs::write(&path, &generated).unwrap();
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "{TYPES} is not what the Rust types say; write it again with \
         NEEDLE_UI_TYPES=write cargo test -p needle-studio --test ui_types, then fix what tsc says"
    );
    for name in ["Startup", "HistoryEntry", "TrainingMessage", "DatasetReport", "Plan", "TrainSettings"] {
        assert!(generated.contains(&format!("export type {name} =")), "{name} missing from the generated types");
    }
}

#[test]
fn the_page_elements_are_the_page_ids() {
    let page = std::fs::read_to_string(repo(PAGE)).unwrap();
    let generated = elements(&page);
    let path = repo(ELEMENTS);
    if std::env::var("NEEDLE_UI_TYPES").as_deref() == Ok("write") {
        std::fs::write(&path, &generated).unwrap();
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "{ELEMENTS} is not what {PAGE} says; write it again with \
         NEEDLE_UI_TYPES=write cargo test -p needle-studio --test ui_types, then fix what tsc says"
    );
    // Spread over the page: the header's, a panel's nested field's, a tag split over lines.
    for line in ["  'app-error': 'p';", "  'device-select': 'select';", "  'checkpoint-path': 'input';"] {
        assert!(generated.contains(line), "{line} missing from the page's elements:\n{generated}");
    }
}

#[test]
fn every_command_typed_is_one_the_app_registers() {
    let lib = std::fs::read_to_string(repo("src-tauri/src/lib.rs")).unwrap();
    let listed =
        lib.split("generate_handler![").nth(1).and_then(|rest| rest.split(']').next()).expect("lib.rs's handler");
    let registered: BTreeSet<&str> = listed
        .split(',')
        .map(|path| path.trim().rsplit("::").next().unwrap_or_default())
        .filter(|n| !n.is_empty())
        .collect();
    let typed: BTreeSet<String> = Generator::new(&sources()).commands.into_iter().map(|command| command.name).collect();
    assert_eq!(typed.iter().map(String::as_str).collect::<BTreeSet<_>>(), registered);
    assert!(typed.len() > 20, "{typed:?}");
}

#[test]
fn the_ui_type_checks_against_them() {
    type_check(&repo("ui")).unwrap_or_else(|errors| panic!("tsc over ui/:\n{errors}"));
}

/// The types generated again from the sources with `from` replaced by `to` in `file` (once: the change
/// must take), written into a copy of the UI, and what tsc then says of it.
fn type_check_changed(file: &str, from: &str, to: &str) -> (String, Result<(), String>) {
    let changed = repo(file);
    let sources: Vec<(PathBuf, String)> = sources()
        .into_iter()
        .map(|(path, text)| {
            if path != changed {
                return (path, text);
            }
            assert_eq!(text.matches(from).count(), 1, "{from:?} is not once in {file}");
            (path, text.replace(from, to))
        })
        .collect();
    let types = generated(&sources);
    let copy = tempfile::tempdir().unwrap();
    copy_ui(&repo("ui"), copy.path());
    std::fs::write(copy.path().join("ground/types.d.ts"), &types).unwrap();
    let checked = type_check(copy.path());
    (types, checked)
}

#[test]
fn a_field_renamed_in_rust_fails_the_type_check() {
    // HistoryEntry's `final_loss` renamed in the Rust source: the panels that read `entry.final_loss`
    // no longer check.
    let (types, checked) = type_check_changed("src-tauri/src/record/trainings.rs", "pub final_loss:", "pub last_loss:");
    assert!(types.contains("last_loss: number | null;") && !types.contains("final_loss"), "the rename did not take");
    let errors = checked.expect_err("the UI still checks with a field renamed away");
    assert!(errors.contains("final_loss") && errors.contains("HistoryEntry"), "{errors}");
}

#[test]
fn a_command_argument_renamed_in_rust_fails_the_type_check() {
    // Build's `training_id` renamed: the window would send `trainingId`, which Tauri no longer reads.
    let (types, checked) = type_check_changed(
        "src-tauri/src/export/commands.rs",
        "training_id: String,\n    request: BuildRequest,",
        "run_id: String,\n    request: BuildRequest,",
    );
    assert!(types.contains("build_cact: { args: { runId: string;"), "the rename did not take");
    let errors = checked.expect_err("the UI still checks with a command argument renamed away");
    assert!(errors.contains("'trainingId' does not exist") && errors.contains("runId"), "{errors}");
}

#[test]
fn a_command_renamed_in_rust_fails_the_type_check() {
    let (types, checked) =
        type_check_changed("src-tauri/src/export/commands.rs", "pub async fn build_cact(", "pub async fn build_model(");
    assert!(types.contains("  build_model: {") && !types.contains("build_cact"), "the rename did not take");
    let errors = checked.expect_err("the UI still checks with a command renamed away");
    assert!(errors.contains("'\"build_cact\"'"), "{errors}");
}

#[test]
fn a_command_answering_another_type_fails_the_type_check() {
    // The ladder's refusal answered as a number: the wrapper that promises a sentence no longer checks.
    let (types, checked) =
        type_check_changed("src-tauri/src/export/commands.rs", "-> Answer<Option<String>>", "-> Answer<Option<u32>>");
    assert!(types.contains("answer: number | null };"), "the change did not take");
    let errors = checked.expect_err("the UI still checks with a command answering another type");
    assert!(errors.contains("Promise<number | null>"), "{errors}");
}

/// The page's elements written again from `ui/index.html` with `from` replaced by `to` (once: the change
/// must take) into a copy of the UI, and what tsc then says of it.
fn type_check_page_changed(from: &str, to: &str) -> (String, Result<(), String>) {
    let page = std::fs::read_to_string(repo(PAGE)).unwrap();
    assert_eq!(page.matches(from).count(), 1, "{from:?} is not once in {PAGE}");
    let elements = elements(&page.replace(from, to));
    let copy = tempfile::tempdir().unwrap();
    copy_ui(&repo("ui"), copy.path());
    std::fs::write(copy.path().join("ground/elements.d.ts"), &elements).unwrap();
    let checked = type_check(copy.path());
    (elements, checked)
}

#[test]
fn an_id_the_page_does_not_have_fails_the_type_check() {
    // Train's hint beside Start renamed in the page: train.js's `$('start-hint')` asks for an id no element has.
    let (elements, checked) = type_check_page_changed(r#"<span id="start-hint""#, r#"<span id="start-note""#);
    assert!(elements.contains("'start-note': 'span';") && !elements.contains("start-hint"), "the rename did not take");
    let errors = checked.expect_err("the UI still checks asking for an id the page does not have");
    assert!(errors.contains("'\"start-hint\"'"), "{errors}");
}

#[test]
fn an_element_of_another_kind_fails_the_type_check() {
    // Evaluate's threshold slider made a canvas: evaluate.js reads its `value`, which a canvas has not.
    let (elements, checked) =
        type_check_page_changed(r#"<input type="range" id="threshold-range""#, r#"<canvas id="threshold-range""#);
    assert!(elements.contains("'threshold-range': 'canvas';"), "the change did not take");
    let errors = checked.expect_err("the UI still checks with an input made a canvas");
    assert!(errors.contains("'value' does not exist on type 'HTMLCanvasElement'"), "{errors}");
}

/// The UI's scripts, types and `jsconfig.json`, copied into `to`.
fn copy_ui(from: &Path, to: &Path) {
    for entry in std::fs::read_dir(from).unwrap().flatten() {
        let (path, target) = (entry.path(), to.join(entry.file_name()));
        if path.is_dir() {
            std::fs::create_dir_all(&target).unwrap();
            copy_ui(&path, &target);
        } else if path.extension().is_some_and(|ext| ext == "js" || ext == "ts" || ext == "json") {
            std::fs::copy(&path, &target).unwrap();
        }
    }
}
