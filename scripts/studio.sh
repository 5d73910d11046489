#!/usr/bin/env bash
# Sets up (scripts/setup.sh) and starts Needle Studio on the bundled example (examples/demo): a smart-home
# app's dataset and a small Needle 3 base pre-trained to call tools (its tokenizer beside it), with the
# Quick preset, so a first run that visibly learns the app takes a minute or two on any CPU.
# `scripts/studio.sh --generation 2` opens the Needle 2 example instead; other arguments replace the
# example, e.g. scripts/studio.sh --dataset mine.jsonl --checkpoint needle.safetensors (the end-to-end
# test starts the app with the default arguments line below, so keep that on one line)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
scripts/setup.sh
args=("$@")
if [[ "${args[*]-}" == "--generation 2" ]]; then
  args=(--dataset examples/demo/smart_home.jsonl --checkpoint examples/demo/base.pkl --preset quick)
fi
((${#args[@]})) || args=(--dataset examples/demo/smart_home.jsonl --checkpoint examples/demo/needle3/base.safetensors --preset quick)
# The build the test command (`cargo test --workspace`) makes, app included: built by either README
# command, it is reused by the other. (`cargo run -p needle-studio` would resolve the app's crates with
# other features than the tests' — tauri's `test`, tokio's net and macros — and rebuild nearly all of them.)
cargo test --workspace --no-run
exec "${CARGO_TARGET_DIR:-target}/debug/needle-studio" "${args[@]}"
