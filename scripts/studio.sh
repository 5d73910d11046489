#!/usr/bin/env bash
# Sets up (scripts/setup.sh) and starts Needle Studio on the bundled example: the smart-home dataset and
# the tiny pre-trained base model of the test fixtures, so the whole flow runs in a minute on any CPU.
# Arguments replace the example, e.g. scripts/studio.sh --dataset mine.jsonl --checkpoint needle.pkl
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
scripts/setup.sh
args=("$@")
((${#args[@]})) || args=(--dataset examples/smart_home.jsonl --checkpoint tests/fixtures/models/pretrained.pkl --preset quick)
# The build the test command (`cargo test --workspace`) makes, app included: built by either README
# command, it is reused by the other. (`cargo run -p needle-studio` would resolve the app's crates with
# other features than the tests' — tauri's `test`, tokio's net and macros — and rebuild nearly all of them.)
cargo test --workspace --no-run
exec "${CARGO_TARGET_DIR:-target}/debug/needle-studio" "${args[@]}"
