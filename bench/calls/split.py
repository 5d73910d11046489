"""Seeded train / held-out split for bench/calls_side_by_side.sh.

    python3 bench/calls/split.py DATA OUTDIR [--heldout 0.2] [--seed 0]

Rows without a "query" (which both fine-tunes skip anyway) are dropped; the rest are shuffled
with random.Random(seed) and the first round(heldout * n) go to OUTDIR/heldout.jsonl, the others
to OUTDIR/train.jsonl. Lines are copied verbatim. Prints one summary line.
"""
import argparse
import json
import os
import random
from collections import Counter

ap = argparse.ArgumentParser()
ap.add_argument("data")
ap.add_argument("outdir")
ap.add_argument("--heldout", type=float, default=0.2)
ap.add_argument("--seed", type=int, default=0)
args = ap.parse_args()

lines = [l.rstrip("\n") for l in open(args.data, encoding="utf-8") if l.strip()]
rows = [(l, json.loads(l)) for l in lines]
kept = [(l, r) for l, r in rows if "query" in r]
random.Random(args.seed).shuffle(kept)
n_held = round(args.heldout * len(kept))
for name, part in (("heldout", kept[:n_held]), ("train", kept[n_held:])):
    with open(os.path.join(args.outdir, name + ".jsonl"), "w", encoding="utf-8") as f:
        f.writelines(l + "\n" for l, _ in part)


def tools(part):
    return dict(Counter(a["name"] for _, r in part for a in r.get("answers", r.get("function_calls", []))))


print(f"[split] {len(kept)} rows ({len(rows) - len(kept)} without query skipped): "
      f"train {len(kept) - n_held}, heldout {n_held}  heldout calls {tools(kept[:n_held])}")
