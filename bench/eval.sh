#!/usr/bin/env bash
# Wall time, tokens/s and peak RSS of `needle eval` (release build) on the largest fixture checkpoint over
# the fixture dataset.
set -euo pipefail
cd "$(dirname "$0")/.."
target="${CARGO_TARGET_DIR:-target}"
cargo build --release -q -p needle-cli --bin needle
fixtures=tests/fixtures
echo "== needle eval, pretrained fixture (largest), batch 16"
/usr/bin/time -f "wall %e s, peak RSS %M KB" \
  "$target/release/needle" eval "$fixtures/data/tool_calls.jsonl" --checkpoint "$fixtures/models/pretrained.pkl" --json
