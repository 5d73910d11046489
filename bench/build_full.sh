#!/usr/bin/env bash
# Times building a full-size float16 Needle 2 .cact (random init, deterministic seed) in release mode.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo run --release -p needle-engine --example cact_build_full
