//! The arena turned into the [`PyValue`] tree at STOP: each object moves out of the arena once, and only
//! objects that several places share are copied, each copy counted against the machine's budget.

use std::borrow::Cow;
use std::collections::HashMap;

use super::machine::{Budget, Obj, ObjId, Value};
use super::{PickleError, PickleErrorKind, PyValue, MAX_DEPTH};

/// Converts `root` and everything it reaches; `at` (the offset of STOP) is the place errors report.
pub(super) fn build(root: Value, objects: Vec<Obj<'_>>, budget: Budget, at: usize) -> Result<PyValue, PickleError> {
    let uses = count_uses(&objects, root);
    TreeBuilder { at, objects, uses, cache: HashMap::new(), budget }.value(root, 0)
}

/// How many references each reachable object has (one per container slot, plus the root).
fn count_uses(objects: &[Obj<'_>], root: Value) -> Vec<usize> {
    let mut uses = vec![0usize; objects.len()];
    let mut pending = vec![root];
    while let Some(value) = pending.pop() {
        if let Value::Obj(id) = value {
            uses[id] += 1;
            if uses[id] == 1 {
                pending.extend(children(&objects[id]));
            }
        }
    }
    uses
}

fn children(obj: &Obj<'_>) -> Vec<Value> {
    match obj {
        Obj::Tuple(items) | Obj::List(items) | Obj::Set(items) => items.clone(),
        Obj::Dict(pairs) => pairs.iter().flat_map(|&(k, v)| [k, v]).collect(),
        _ => Vec::new(),
    }
}

/// Builds the result tree; every object is converted once and cached until its last reference takes it.
struct TreeBuilder<'a> {
    /// Offset of STOP, the place reported for errors found while building the tree.
    at: usize,
    objects: Vec<Obj<'a>>,
    uses: Vec<usize>,
    /// Converted objects still awaiting further references, with their size in bytes.
    cache: HashMap<ObjId, (PyValue, usize)>,
    /// The machine's budget, still counting: the tree's copies add to the calls' copies.
    budget: Budget,
}

impl TreeBuilder<'_> {
    fn error(&self, kind: PickleErrorKind) -> PickleError {
        PickleError { offset: self.at, kind }
    }

    fn charge(&mut self, what: &'static str, bytes: usize) -> Result<(), PickleError> {
        self.budget.charge(what, bytes).map_err(|kind| self.error(kind))
    }

    fn value(&mut self, value: Value, depth: usize) -> Result<PyValue, PickleError> {
        Ok(match value {
            Value::None => PyValue::None,
            Value::Bool(b) => PyValue::Bool(b),
            Value::Int(i) => PyValue::Int(i),
            Value::Float(f) => PyValue::Float(f),
            Value::Global(_) => return Err(self.error(PickleErrorKind::NotData("a bare numpy/collections global"))),
            Value::Obj(id) => self.object(id, depth)?.0,
        })
    }

    /// The converted object and its size, copied unless this is its last reference.
    fn object(&mut self, id: ObjId, depth: usize) -> Result<(PyValue, usize), PickleError> {
        if depth > MAX_DEPTH {
            return Err(self.error(PickleErrorKind::TooDeep));
        }
        let converted = match self.cache.remove(&id) {
            Some(done) => done,
            None => self.convert(id, depth)?,
        };
        self.uses[id] = self.uses[id].saturating_sub(1);
        if self.uses[id] == 0 {
            return Ok(converted);
        }
        self.charge("STOP (a memoized object shared by several places)", converted.1)?;
        self.cache.insert(id, converted.clone());
        Ok(converted)
    }

    fn convert(&mut self, id: ObjId, depth: usize) -> Result<(PyValue, usize), PickleError> {
        // A container met again while its own conversion is under way contains itself: the arena slot
        // reads Taken, and the cache has no entry yet.
        let obj = std::mem::replace(&mut self.objects[id], Obj::Taken);
        const NODE: usize = 16;
        // Text and bytes still borrowed from the file are copied into the tree once; owned ones move.
        const COPY: &str = "STOP (text and bytes copied out of the file)";
        if let Obj::Str(Cow::Borrowed(text)) = &obj {
            self.charge(COPY, text.len())?;
        }
        if let Obj::Bytes(Cow::Borrowed(data)) | Obj::BigInt(data) = &obj {
            self.charge(COPY, data.len())?;
        }
        Ok(match obj {
            Obj::Str(s) => {
                let size = NODE + s.len();
                (PyValue::Str(s.into_owned()), size)
            }
            Obj::Bytes(b) => {
                let size = NODE + b.len();
                (PyValue::Bytes(b.into_owned()), size)
            }
            Obj::BigInt(b) => (PyValue::BigInt(b.to_vec()), NODE + b.len()),
            Obj::Array(a) => {
                let size = NODE + a.data.len();
                (PyValue::Array(a), size)
            }
            Obj::Tuple(items) => self.items(items, depth).map(|(v, s)| (PyValue::Tuple(v), s))?,
            Obj::List(items) => self.items(items, depth).map(|(v, s)| (PyValue::List(v), s))?,
            Obj::Set(items) => self.items(items, depth).map(|(v, s)| (PyValue::Set(v), s))?,
            Obj::Dict(pairs) => {
                let flat = pairs.into_iter().flat_map(|(k, v)| [k, v]).collect();
                let (mut flat, size) = self.items(flat, depth)?;
                let mut pairs = Vec::with_capacity(flat.len() / 2);
                while let (Some(v), Some(k)) = (flat.pop(), flat.pop()) {
                    pairs.push((k, v));
                }
                pairs.reverse();
                (PyValue::Dict(pairs), size)
            }
            Obj::DType(_) => return Err(self.error(PickleErrorKind::NotData("a numpy dtype outside an array"))),
            Obj::ArrayShell => {
                return Err(self.error(PickleErrorKind::NotData("a numpy array that was never given its data")))
            }
            Obj::Taken => return Err(self.error(PickleErrorKind::TooDeep)),
        })
    }

    fn items(&mut self, items: Vec<Value>, depth: usize) -> Result<(Vec<PyValue>, usize), PickleError> {
        let mut size: usize = 16;
        let mut out = Vec::with_capacity(items.len());
        for item in items {
            let (value, item_size) = match item {
                Value::Obj(id) => self.object(id, depth + 1)?,
                scalar => (self.value(scalar, depth + 1)?, 16),
            };
            size = size.saturating_add(item_size);
            out.push(value);
        }
        Ok((out, size))
    }
}
