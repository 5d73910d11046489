#!/usr/bin/env bash
# Seconds per LoRA training step (and peak RSS) on a random-init full-size Needle 2, batch 4 x seq 128.
# The reference takes 8.8 s/step (58 tokens/s) at this shape on this kind of machine (shared/NOTES.md).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build -q -p needle-engine --example train_full_size
/usr/bin/time -f "wall %e s, peak RSS %M KB" target/debug/examples/train_full_size
