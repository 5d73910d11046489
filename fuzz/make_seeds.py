#!/usr/bin/env python3
"""Writes fuzz/seeds/<target>/: small hand-made hostile inputs for each of the seven fuzz targets, beside the
fixtures that seed them too (fuzz/run.sh copies both into its corpus). Each is a committed fixture cut, or with
one field made to lie, or a few bytes written by hand; crates/engine/tests/fuzz_regressions.rs replays every
one and names the error each must be refused with.

Only the standard library, so the files are byte-for-byte reproducible: python3 fuzz/make_seeds.py
"""

import json
import struct
from pathlib import Path

FUZZ = Path(__file__).resolve().parent
FIXTURES = FUZZ.parent / "tests" / "fixtures"

# .cact: u32 tag, u32 num_tensors, ...; Needle 2's `num_engram_orders` count is its header's 20th word
# (crates/engine/src/cact/format.rs, FIELDS_V2), a count of at most 4 slots.
CACT_NUM_TENSORS_AT = 4
CACT_V2_ENGRAM_ORDERS_AT = 4 * 19
CACT_V2_HEADER = 4 * 24
TAG_V2 = 0x05E12A83


def fixture(relative):
    return (FIXTURES / relative).read_bytes()


def with_word(data, at, value):
    """`data` with the little-endian u32 at byte `at` replaced."""
    return data[:at] + struct.pack("<I", value) + data[at + 4 :]


def safetensors(header, data=b""):
    """A safetensors file of a header dict (written as is, so it may lie) and its data."""
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


def count(shape):
    values = 1
    for dim in shape:
        values *= dim
    return values


def f32_tensor(shape):
    """A float32 tensor's header entry, its data at the start of the data section."""
    return {"dtype": "F32", "shape": shape, "data_offsets": [0, 4 * count(shape)]}


# The Needle 3 fixture adapter, whose metadata and first factor the adapter seeds borrow.
NEEDLE3_ADAPTER = FIXTURES / "golden" / "needle3_heads" / "adapter.safetensors"


def adapter_header():
    (size,) = struct.unpack("<Q", NEEDLE3_ADAPTER.read_bytes()[:8])
    return json.loads(NEEDLE3_ADAPTER.read_bytes()[8 : 8 + size])


def seeds():
    tiny_pickle = fixture("models/tiny_f16.pkl")
    w4 = fixture("golden/tiny_f32/w4.cact")
    v3 = fixture("golden/needle3_heads/base.cact")
    needle3 = fixture("models/needle3_tiny.safetensors")
    header = adapter_header()
    first_a = next(name for name in header if name.endswith("/A"))
    a_shape = header[first_a]["shape"]
    lora_metadata = header["__metadata__"]
    return {
        "pickle": {
            "empty.pkl": b"",
            "protocol-99.pkl": b"\x80\x63" + tiny_pickle[2:64],
            "cut-in-header.pkl": tiny_pickle[:100],
            # 20 000 MARKs and no STOP: the stack grows with the file, never past it.
            "marks-without-stop.pkl": b"\x80\x02" + b"(" * 20000,
            # BINGET 5 from an empty memo.
            "memo-get-unset.pkl": b"\x80\x02h\x05.",
        },
        "dataset_jsonl": {
            "empty.jsonl": b"",
            "not-json.jsonl": b"{not json\n[1, 2\n",
            "array-rows.jsonl": b"[1, 2, 3]\n[]\n",
            "deep-nesting.jsonl": b"[" * 5000 + b"]" * 5000 + b"\n",
            # No line has a query string.
            "missing-fields.jsonl": b'{"tools": "[]"}\n{"answers": "[]"}\n{"query": 5}\n',
        },
        "tokenizer_model": {
            "empty.model": b"",
            # Field 1 (a piece), its length a varint that never ends.
            "varint-overflow.model": b"\x0a" + b"\xff" * 11,
            # A piece that claims 65 535 bytes where 10 follow.
            "length-past-end.model": b"\x0a\xff\xff\x03" + b"x" * 10,
            # Wire type 7 does not exist.
            "wrong-wire-type.model": b"\x0f\x00",
            "cut-in-header.model": fixture("tokenizer/variants/base.model")[:40],
        },
        "cact": {
            "empty.cact": b"",
            "tag-only.cact": struct.pack("<I", TAG_V2),
            "wrong-tag.cact": b"NOPE" + w4[4:4096],
            "header-cut.cact": w4[:64],
            "huge-count.cact": with_word(w4, CACT_NUM_TENSORS_AT, 0xFFFFFFFF)[:4096],
            "engram-orders-overflow.cact": with_word(w4[:4096], CACT_V2_ENGRAM_ORDERS_AT, 9),
            "directory-cut.cact": w4[: CACT_V2_HEADER + 44 + 20],
        },
        "cact_v3": {
            "tag-only.cact": v3[:4],
            "header-cut.cact": v3[:100],
            "huge-count.cact": with_word(v3, CACT_NUM_TENSORS_AT, 0xFFFFFFFF)[:4096],
            "directory-cut.cact": v3[: 196 + 44 + 20],
            "needle2-tag.cact": struct.pack("<I", TAG_V2) + v3[4:4096],
        },
        "safetensors_checkpoint": {
            "empty.safetensors": b"",
            "header-length-huge.safetensors": struct.pack("<Q", 1 << 62) + b"{}",
            "header-not-json.safetensors": struct.pack("<Q", 8) + b"notjson!",
            "no-metadata.safetensors": safetensors({"embedding/embedding": f32_tensor([4, 4])}, bytes(64)),
            "offsets-past-end.safetensors": safetensors(
                {"__metadata__": {"format": "needle3"}, "embedding/embedding": f32_tensor([1024, 1024])}, bytes(64)
            ),
            "cut-in-data.safetensors": needle3[: len(needle3) // 3],
        },
        "safetensors_adapter": {
            "empty.safetensors": b"",
            "header-not-json.safetensors": struct.pack("<Q", 8) + b"notjson!",
            # Metadata and not one factor: merged, it would pass the base off as the fine-tuned model.
            "no-factors.safetensors": safetensors({"__metadata__": lora_metadata}),
            # An A factor and no B for it.
            "a-without-b.safetensors": safetensors(
                {"__metadata__": lora_metadata, first_a: f32_tensor(a_shape)}, bytes(4 * count(a_shape))
            ),
            "offsets-past-end.safetensors": safetensors(
                {"__metadata__": lora_metadata, first_a: f32_tensor([4096, 4096])}, bytes(64)
            ),
        },
    }


def main():
    for target, files in seeds().items():
        folder = FUZZ / "seeds" / target
        folder.mkdir(parents=True, exist_ok=True)
        for stale in folder.iterdir():
            stale.unlink()
        for name, data in files.items():
            (folder / name).write_bytes(data)
        print(f"{target}: {len(files)} seeds, {sum(map(len, files.values()))} bytes")


if __name__ == "__main__":
    main()
