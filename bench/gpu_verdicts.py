#!/usr/bin/env python3
"""The verdicts of bench/gpu_check.sh, each a function of what the runs wrote, so that they can be tried on
made-up outputs without a GPU (bench/test_gpu_verdicts.py). Each prints one line, "agree"/"pass" or
"DIFFER"/"FAILED" with the reason, and exits non-zero on a failure.

  gpu_verdicts.py gradients DEVICE CPU GOLDEN LOSS_TOL GRAD_TOL
      `needle gradients` outputs (safetensors) on the device and on the CPU against the reference's golden
      (tests/fixtures/golden/<stem>/lora.safetensors). The golden names what must be there: `loss` and every
      `<weight>/grad_A`, `<weight>/grad_B` it holds, each of its shape. A gradient an output lacks, has with
      another shape, or has that the golden does not, fails, whatever the numbers of the others.
  gpu_verdicts.py losses "A..." "B..."
      Two lists of losses (eval, a fine-tune's steps): the same length, at least one, each pair to 1e-3.
  gpu_verdicts.py bench DEVICE_JSON CPU_JSON
      One `needle bench --json` line on the device and one on the CPU at the same shape: the device must be at
      least as fast (a step's median time, or decoding's tokens/s), and, on a GPU, say its memory.
"""

import array
import json
import struct
import sys


def read_safetensors(path):
    """{name: (shape, flat float32 values)} of a safetensors file's F32 tensors."""
    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header, data = json.loads(f.read(size)), f.read()
    tensors = {}
    for name, t in header.items():
        if name != "__metadata__" and t["dtype"] == "F32":
            begin, end = t["data_offsets"]
            tensors[name] = (list(t["shape"]), array.array("f", data[begin:end]))
    return tensors


def relative_off(got, want):
    """max |got - want| / max |want|, the parity tests' measure; the lengths must already agree."""
    return max(abs(g - w) for g, w in zip(got, want)) / max(max(abs(w) for w in want), 1e-30)


def gradients(device, cpu, golden, loss_tol, grad_tol):
    """(ok, line) for the device's gradients against the CPU's and the golden's, each {name: (shape, values)}."""
    wanted = sorted(n for n in golden if "/grad_" in n)
    if not wanted or "loss" not in golden:
        return False, "DIFFER: the golden has no loss or no gradients"
    problems = []
    for run, label in ((device, "device"), (cpu, "cpu")):
        if "loss" not in run:
            problems.append(f"{label} wrote no loss")
        have = {n for n in run if "/grad_" in n}
        problems += [f"{label} lacks {n}" for n in wanted if n not in have]
        problems += [f"{label} has {n}, which the golden has not" for n in sorted(have - set(wanted))]
        for n in sorted(have & set(wanted)):
            shape, values = run[n]
            if shape != golden[n][0] or len(values) != len(golden[n][1]):
                problems.append(f"{label} {n}: shape {shape} ({len(values)} values), the golden's {golden[n][0]}")
    if problems:
        return False, f"DIFFER ({len(wanted)} gradients in the golden): " + "; ".join(problems)
    ok, worst = True, []
    for other, label in ((cpu, "cpu"), (golden, "reference")):
        loss = abs(device["loss"][1][0] - other["loss"][1][0]) / abs(other["loss"][1][0])
        grad = max(relative_off(device[n][1], other[n][1]) for n in wanted)
        ok = ok and loss <= loss_tol and grad <= grad_tol
        worst.append(f"vs {label}: loss {loss:.1e}, gradients {grad:.1e}")
    tolerances = f"tolerances {loss_tol:g}, {grad_tol:g}"
    return ok, ("agree" if ok else "DIFFER") + f" ({len(wanted)} gradients; " + "; ".join(worst) + f"; {tolerances})"


def losses(a, b):
    """(ok, line) for two lists of losses."""
    ok = len(a) == len(b) > 0 and all(abs(x - y) <= 1e-3 * max(abs(x), abs(y), 1e-6) for x, y in zip(a, b))
    return ok, "agree" if ok else f"DIFFER: {a} vs {b}"


def one_precision(report):
    """A `needle bench --decode --precision P --json` report's one precision, with the report's own fields."""
    figures = report.get("precisions") or [{}]
    return {**report, **figures[0]}


def bench(device, cpu):
    """(ok, line) for one bench on the device and on the CPU, each the report `needle bench --json` printed."""
    device, cpu = one_precision(device), one_precision(cpu)
    if "decode_tokens_per_s" in cpu:
        what, mine, theirs = "decoding", device.get("decode_tokens_per_s"), cpu["decode_tokens_per_s"]
        faster = mine is not None and mine >= theirs
        speed = f"{mine} against {theirs} tokens/s"
    else:
        what, mine, theirs = "a step", device.get("step_s"), cpu["step_s"]
        faster = mine is not None and mine <= theirs
        speed = f"{mine} against {theirs} s (median)"
    memory = f"peak RSS {device.get('peak_rss_mb')} MB, GPU memory {device.get('device_memory_mb')} MB"
    problems = [] if faster else [f"{what} is slower on the device than on the CPU"]
    if device.get("backend") not in (None, "cpu") and device.get("device_memory_mb") is None and what == "a step":
        problems.append("the device's memory is not stated")
    ok = not problems
    return ok, ("pass" if ok else "FAILED: " + "; ".join(problems)) + f" ({speed}; {memory})"


def main(argv):
    kind, args = argv[1], argv[2:]
    if kind == "gradients":
        try:
            runs = [read_safetensors(p) for p in args[:3]]
        except (OSError, ValueError, KeyError, struct.error) as e:
            print(f"DIFFER: {e}")
            return 1
        ok, line = gradients(*runs, float(args[3]), float(args[4]))
    elif kind == "losses":
        ok, line = losses(*([float(x) for x in s.split()] for s in args))
    elif kind == "bench":
        try:
            reports = [json.loads(open(p).read().strip().splitlines()[-1]) for p in args]
        except (OSError, ValueError, IndexError) as e:
            print(f"FAILED: {e}")
            return 1
        ok, line = bench(*reports)
    else:
        print(f"unknown verdict {kind}: gradients, losses or bench")
        return 2
    print(line)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
