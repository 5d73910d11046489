use super::*;

fn err(bytes: &[u8]) -> PickleError {
    parse(bytes).unwrap_err()
}

#[test]
fn memoized_dict_sees_later_setitems() {
    // {'a': d, 'b': d} where d = {} is filled after being memoized and fetched again.
    let bytes =
        b"\x80\x02}q\x00(X\x01\x00\x00\x00aq\x01}q\x02X\x01\x00\x00\x00bq\x03h\x02uh\x02X\x01\x00\x00\x00kK\x07s0.";
    // Stack walk: outer dict, MARK, 'a', inner dict, 'b', inner again, SETITEMS -> outer = {a: inner, b: inner};
    // BINGET 2 pushes inner, SETITEM inner['k'] = 7, POP leaves outer for STOP.
    let inner = PyValue::Dict(vec![(PyValue::Str("k".into()), PyValue::Int(7))]);
    let expected = PyValue::Dict(vec![(PyValue::Str("a".into()), inner.clone()), (PyValue::Str("b".into()), inner)]);
    assert_eq!(parse(bytes).unwrap(), expected);
}

#[test]
fn shared_objects_are_copied_into_every_place() {
    // l = [1]; [l, l]
    let bytes = b"\x80\x02](]q\x00K\x01ah\x00e.";
    let one = PyValue::List(vec![PyValue::Int(1)]);
    assert_eq!(parse(bytes).unwrap(), PyValue::List(vec![one.clone(), one]));
}

#[test]
fn self_containing_list_is_refused() {
    // l = []; l.append(l)
    let e = err(b"\x80\x02]q\x00h\x00a.");
    assert_eq!(e.kind, PickleErrorKind::TooDeep);
}

#[test]
fn exponential_sharing_hits_the_expansion_limit() {
    // x0 = 'aaaa...' (1 KiB); x(n+1) = (xn, xn) forty times: 2**40 KiB if copied naively.
    let mut bytes = b"\x80\x04".to_vec();
    bytes.push(op::BINUNICODE);
    bytes.extend_from_slice(&1024u32.to_le_bytes());
    bytes.extend(std::iter::repeat_n(b'a', 1024));
    for _ in 0..40 {
        bytes.extend_from_slice(&[op::MEMOIZE, op::DUP, op::TUPLE2]);
    }
    bytes.push(op::STOP);
    assert!(matches!(err(&bytes).kind, PickleErrorKind::OverBudget { what, .. } if what.contains("shared")));
}

/// A pickle that memoizes `setup`'s result, then pushes `call` `count` times into a list: the shape
/// of every amplification attack (each call copies the memoized object again).
fn repeated(setup: &[u8], call: &[u8], count: usize) -> Vec<u8> {
    let mut bytes = b"\x80\x02".to_vec();
    bytes.extend_from_slice(setup);
    bytes.extend_from_slice(&[op::EMPTY_LIST, op::MARK]);
    for _ in 0..count {
        bytes.extend_from_slice(call);
    }
    bytes.extend_from_slice(&[op::APPENDS, op::STOP]);
    bytes
}

/// Asserts the read stops at one of the repeated calls, naming `what` and the limit.
fn assert_over_budget(bytes: &[u8], what: &str, opcode: u8) {
    let e = err(bytes);
    let PickleErrorKind::OverBudget { what: named, file_len, limit } = e.kind else { panic!("{e}") };
    assert_eq!((named, file_len), (what, bytes.len()), "{e}");
    assert_eq!(limit, bytes.len() * BUDGET_FACTOR + BUDGET_ALLOWANCE);
    assert_eq!(bytes[e.offset], opcode, "{e}");
    let message = e.to_string();
    assert!(message.contains(what) && message.contains(&format!("past {limit} bytes")), "{message}");
}

fn text(len: usize) -> Vec<u8> {
    let mut bytes = vec![op::BINUNICODE];
    bytes.extend_from_slice(&(len as u32).to_le_bytes());
    bytes.extend(std::iter::repeat_n(b'a', len));
    bytes
}

#[test]
fn encoding_one_memoized_text_again_and_again_hits_the_budget() {
    // e = _codecs.encode; args = ('a' * 64 KiB, 'latin1'); [e(*args) for _ in range(1000)]: 64 MB of copies.
    let mut setup = b"c_codecs\nencode\nq\x00".to_vec();
    setup.extend(text(64 << 10));
    setup.extend_from_slice(b"X\x06\x00\x00\x00latin1\x86q\x01");
    let bytes = repeated(&setup, b"h\x00h\x01R", 1000);
    assert_over_budget(&bytes, "_codecs.encode", op::REDUCE);
}

#[test]
fn turning_one_memoized_list_into_sets_again_and_again_hits_the_budget() {
    // l = [1] * 10000; [set(l) for _ in range(1000)]: 160 MB of copied items.
    let mut setup = b"c__builtin__\nset\nq\x00(K\x01".to_vec();
    setup.extend(std::iter::repeat_n(op::DUP, 9999));
    setup.extend_from_slice(b"l\x85q\x01");
    let bytes = repeated(&setup, b"h\x00h\x01R", 1000);
    assert_over_budget(&bytes, "builtins.set", op::REDUCE);
}

#[test]
fn building_arrays_from_one_memoized_buffer_hits_the_budget() {
    // args = (b'\0' * 64 KiB, dtype('u1'), (65536,), 'C'); [_frombuffer(*args) for _ in range(1000)].
    let mut setup = b"cnumpy.core.numeric\n_frombuffer\nq\x00(B\x00\x00\x01\x00".to_vec();
    setup.extend(std::iter::repeat_n(0u8, 64 << 10));
    setup.extend_from_slice(
        b"cnumpy\ndtype\nX\x02\x00\x00\x00u1\x89\x88\x87RJ\x00\x00\x01\x00\x85X\x01\x00\x00\x00Ctq\x01",
    );
    let bytes = repeated(&setup, b"h\x00h\x01R", 1000);
    assert_over_budget(&bytes, "numpy.core.numeric._frombuffer", op::REDUCE);
    // The same buffer built into 1000 reconstructed arrays: each BUILD copies it too.
    let mut setup = b"B\x00\x00\x01\x00".to_vec();
    setup.extend(std::iter::repeat_n(0u8, 64 << 10));
    setup.extend_from_slice(b"q\x00");
    let call = b"cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\nK\x00\x85C\x01b\x87R\
        (K\x01J\x00\x00\x01\x00\x85cnumpy\ndtype\nX\x02\x00\x00\x00u1\x89\x88\x87R\x89h\x00tb";
    let bytes = repeated(&setup, call, 1000);
    assert_over_budget(&bytes, "BUILD", op::BUILD);
}

#[test]
fn reading_one_memoized_tuple_again_and_again_hits_the_budget() {
    // A dtype rebuilt 10000 times from one 20000-item state tuple: nothing is kept, but each BUILD
    // reads (copies) the whole tuple, 3 GB of work for a 50 KB file.
    let mut bytes = b"\x80\x02cnumpy\ndtype\nX\x02\x00\x00\x00u1\x89\x88\x87R(NX\x01\x00\x00\x00<".to_vec();
    bytes.extend(std::iter::repeat_n(op::NONE, 20_000));
    bytes.extend_from_slice(b"tq\x000");
    for _ in 0..10_000 {
        bytes.extend_from_slice(b"h\x00b");
    }
    bytes.push(op::STOP);
    assert_over_budget(&bytes, "BUILD", op::BUILD);
}

#[test]
fn a_helper_reports_the_opcode_that_called_it() {
    // An array whose BUILD state gives the shape as the int 5: the shape is read by the same helper
    // REDUCE's calls use, and the error must still name BUILD and its offset.
    let bytes = b"\x80\x02cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\nK\x00\x85C\x01b\x87R\
        (K\x01K\x05cnumpy\ndtype\nX\x02\x00\x00\x00u1\x89\x88\x87R\x89C\x00tb.";
    let e = err(bytes);
    let expected = PickleErrorKind::WrongType { opcode: "BUILD", expected: "a tuple", found: "int" };
    assert_eq!((bytes[e.offset], e.kind), (op::BUILD, expected));
}

#[test]
fn pop_cannot_reach_below_a_mark() {
    let e = err(b"\x80\x02K\x01(0.");
    assert_eq!((e.offset, e.kind), (5, PickleErrorKind::StackUnderflow { opcode: "POP" }));
}

#[test]
fn huge_declared_length_is_refused_before_allocating() {
    let mut bytes = b"\x80\x04\x8e".to_vec();
    bytes.extend_from_slice(&(u64::MAX - 1).to_le_bytes());
    let e = err(&bytes);
    assert_eq!(e.offset, 2);
    assert!(matches!(e.kind, PickleErrorKind::Truncated { opcode: "BINBYTES8", available: 0, .. }));
}

#[test]
fn memo_miss_names_the_slot() {
    let e = err(b"\x80\x02j\x10\x27\x00\x00.");
    assert_eq!((e.offset, e.kind), (2, PickleErrorKind::MemoMiss { opcode: "LONG_BINGET", index: 10000 }));
}

#[test]
fn text_protocol_opcodes_are_refused_with_a_reason() {
    let e = err(b"I42\n.");
    assert!(matches!(e.kind, PickleErrorKind::UnsupportedOpcode { opcode: "INT", .. }));
}

#[test]
fn newobj_builds_an_ordered_dict_and_nothing_else() {
    let ok = b"\x80\x02ccollections\nOrderedDict\n)\x81X\x01\x00\x00\x00kK\x01s.";
    assert_eq!(parse(ok).unwrap().get("k"), Some(&PyValue::Int(1)));
    let e = err(b"\x80\x02cnumpy\ndtype\n)\x81.");
    assert!(matches!(e.kind, PickleErrorKind::BadArguments { callable: "numpy.dtype", .. }));
}

#[test]
fn big_ints_are_kept_as_bytes() {
    // 2**64 as LONG1.
    let v = parse(b"\x80\x02\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x00\x01.").unwrap();
    assert_eq!(v, PyValue::BigInt(vec![0, 0, 0, 0, 0, 0, 0, 0, 1]));
}
