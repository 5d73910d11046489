#!/usr/bin/env bash
# Wall time and peak RSS of `needle eval`: on the largest fixture checkpoint over the fixture
# dataset, and on a random-init full-size Needle 2 at 16 examples × 256 tokens.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build -q -p needle-cli --bin needle
cargo build -q -p needle-engine --example eval_full_size
fixtures=tests/fixtures
echo "== needle eval, pretrained fixture (largest), batch 16"
/usr/bin/time -f "wall %e s, peak RSS %M KB" \
  target/debug/needle eval "$fixtures/data/tool_calls.jsonl" --checkpoint "$fixtures/models/pretrained.pkl" --json
echo "== random-init full-size Needle 2, 16 x 256"
/usr/bin/time -f "wall %e s, peak RSS %M KB" target/debug/examples/eval_full_size
