//! Every opcode of protocols 0–5, named as in CPython's `pickletools`: the ones the machine interprets
//! (the writer emits a subset of them), then the ones [`refusal`] explains.

/// Defines one `u8` constant per opcode and `name`, its `pickletools` spelling for messages, from one table.
macro_rules! opcodes {
    ($($name:ident = $byte:expr,)*) => {
        $(pub const $name: u8 = $byte;)*

        /// The `pickletools` name of an opcode byte.
        pub fn name(byte: u8) -> &'static str {
            match byte {
                $($name => stringify!($name),)*
                _ => "an undefined opcode",
            }
        }
    };
}

opcodes! {
    MARK = b'(',
    STOP = b'.',
    POP = b'0',
    POP_MARK = b'1',
    DUP = b'2',
    BININT = b'J',
    BININT1 = b'K',
    BININT2 = b'M',
    NONE = b'N',
    REDUCE = b'R',
    BINUNICODE = b'X',
    APPEND = b'a',
    BUILD = b'b',
    GLOBAL = b'c',
    DICT = b'd',
    EMPTY_DICT = b'}',
    APPENDS = b'e',
    BINGET = b'h',
    LONG_BINGET = b'j',
    LIST = b'l',
    EMPTY_LIST = b']',
    BINPUT = b'q',
    LONG_BINPUT = b'r',
    SETITEM = b's',
    TUPLE = b't',
    EMPTY_TUPLE = b')',
    SETITEMS = b'u',
    BINFLOAT = b'G',
    PROTO = 0x80,
    NEWOBJ = 0x81,
    TUPLE1 = 0x85,
    TUPLE2 = 0x86,
    TUPLE3 = 0x87,
    NEWTRUE = 0x88,
    NEWFALSE = 0x89,
    LONG1 = 0x8a,
    LONG4 = 0x8b,
    BINBYTES = b'B',
    SHORT_BINBYTES = b'C',
    SHORT_BINUNICODE = 0x8c,
    BINUNICODE8 = 0x8d,
    BINBYTES8 = 0x8e,
    EMPTY_SET = 0x8f,
    ADDITEMS = 0x90,
    FROZENSET = 0x91,
    NEWOBJ_EX = 0x92,
    STACK_GLOBAL = 0x93,
    MEMOIZE = 0x94,
    FRAME = 0x95,
    BYTEARRAY8 = 0x96,

    INT = b'I',
    LONG = b'L',
    FLOAT = b'F',
    STRING = b'S',
    UNICODE = b'V',
    GET = b'g',
    PUT = b'p',
    INST = b'i',
    OBJ = b'o',
    BINSTRING = b'T',
    SHORT_BINSTRING = b'U',
    PERSID = b'P',
    BINPERSID = b'Q',
    EXT1 = 0x82,
    EXT2 = 0x83,
    EXT4 = 0x84,
    NEXT_BUFFER = 0x97,
    READONLY_BUFFER = 0x98,
}

/// Why an opcode that exists is refused, given to the user; None for the ones the machine interprets
/// and for bytes that are no opcode.
pub fn refusal(byte: u8) -> Option<&'static str> {
    Some(match byte {
        INT | LONG | FLOAT | STRING | UNICODE | GET | PUT | INST | OBJ => {
            "it belongs to text protocols 0/1; save with pickle protocol 2 or newer"
        }
        BINSTRING | SHORT_BINSTRING => "it is a Python 2 byte string; save the file again under Python 3",
        PERSID | BINPERSID => {
            "persistent ids need the saver's own loader (torch.save and the like); \
             save the arrays with plain pickle.dump"
        }
        EXT1 | EXT2 | EXT4 => "copyreg extension codes name code to run; save without copyreg extensions",
        NEXT_BUFFER | READONLY_BUFFER => "out-of-band buffers live outside the file; save without a buffer_callback",
        _ => return None,
    })
}
