"""The report of bench/calls_side_by_side.sh: a markdown table from the files in WORKDIR.

    python3 bench/calls/table.py WORKDIR

Reads WORKDIR/{base,ours_tuned,ours_cact,ref_tuned,ref_cact}.json (one `needle eval --json
--accuracy` line each; a missing or empty file shows as "—") and {ours,ref}.time (wall seconds).
"""
import json
import os
import sys

work = sys.argv[1]


def load(name):
    try:
        with open(os.path.join(work, name)) as f:
            return json.loads(f.read().strip().splitlines()[-1])
    except (OSError, ValueError, IndexError):
        return None


def cells(r):
    if not r:
        return ["—", "—", "—"]
    a = r["accuracy"]
    return [f"{r['loss']:.4f}", f"{a['exact']}/{a['examples']} ({a['exact_rate']:.0%})", f"{a['parse_rate']:.0%}"]


def wall(name):
    try:
        return open(os.path.join(work, name)).read().split()[-1] + " s"
    except (OSError, IndexError):
        return "—"


base = load("base.json")
rows = [("base", base, base), ("tuned (LoRA)", load("ours_tuned.json"), load("ref_tuned.json")),
        (".cact (W4)", load("ours_cact.json"), load("ref_cact.json"))]
print("| model | ours loss | ours exact calls | ours parse | ref loss | ref exact calls | ref parse |")
print("|---|---:|---:|---:|---:|---:|---:|")
for label, ours, ref in rows:
    print("| " + " | ".join([label] + cells(ours) + cells(ref)) + " |")
# Exact hits on rows that expect no call (`answers: []`) say nothing about calling a tool.
calls = []
for label, ours, ref in rows:
    for side, r in (("ours", ours), ("ref", ref)):
        if r and not (label == "base" and side == "ref"):
            tools = {k: v for k, v in r["accuracy"]["per_tool"].items() if k != "(no call)"}
            calls.append(f"{label if label == 'base' else side + ' ' + label} "
                         f"{sum(v['right'] for v in tools.values())}/{sum(v['total'] for v in tools.values())}")
print()
print("exact on rows that expect a call: " + ", ".join(calls))
print(f"fine-tune wall time (whole process): ours {wall('ours.time')}, reference {wall('ref.time')}")
