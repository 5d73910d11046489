//! A pickle reader that builds a value tree and never executes anything.
//!
//! `pickle.load` runs whatever callables a file names, so a checkpoint from the internet could run any code.
//! This reader interprets the binary opcodes of protocols 2–5 as a pure stack machine over its own value
//! types. The only callables it understands are an allow-list of numpy array/dtype/scalar constructors
//! (numpy 1.x and 2.x spellings), `_codecs.encode` and the `bytes`/`bytearray`/`set`/`frozenset` builtins
//! (how protocols 2–4 spell those types) and `collections.OrderedDict`; each is interpreted here, never
//! imported. Any other global is refused with its `module.name` and the byte offset of the opcode that
//! named it.
//!
//! Objects live in an arena and the stack holds references to them, because pickles mutate objects after
//! memoizing them (`EMPTY_DICT MEMOIZE ... SETITEMS`, a dtype `BUILD` after its `BINPUT`), and later
//! `BINGET`s must see the mutated object. The arena is turned into a plain [`PyValue`] tree at `STOP`.
//!
//! Every opcode makes at most a constant number of values, but a few steps copy an object the file
//! names only once: the allowed calls (`set(list)`, `_codecs.encode(text)`, an array's BUILD or
//! `_frombuffer`, any tuple they read) and the tree's copies of memoized objects shared by several
//! places. Each such copy is counted against one `Budget`, a small multiple of the file's size,
//! before it is made; so reading takes time and memory linear in the file, and a 1 MB file that asks
//! for hundreds of GB of copies is refused at the opcode that asks.
//!
//! `op` names the opcodes, `machine` runs them, `callables` interprets the allow-listed globals (the
//! numpy array reconstruction among them) and `tree` turns the arena into the result.

mod callables;
mod machine;
pub(crate) mod op;
#[cfg(test)]
mod tests;
mod tree;
mod value;

pub use value::*;

use machine::Machine;

/// Reads a whole pickle into a [`PyValue`]. Bytes after the STOP opcode are ignored, as `pickle.load` does.
pub fn parse(bytes: &[u8]) -> Result<PyValue, PickleError> {
    let mut machine = Machine::new(bytes);
    let root = machine.run()?;
    machine.into_tree(root)
}
