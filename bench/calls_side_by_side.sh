#!/usr/bin/env bash
# Fine-tune the tiny pre-trained fixture model on a tool-call dataset with our `needle finetune`
# and with the reference's finetune_local (cactus-needle 2.0.8, JAX on CPU), same settings; build
# a 4-bit .cact from each adapter (ours: `needle build`, reference: its build_main); then score
# base, both tuned models and both .cact files on a held-out split with OUR `needle eval
# --accuracy` (one ruler for both): masked answer loss, exact calls (greedy decode), parse rate.
#
#   bench/calls_side_by_side.sh [--epochs 8] [--lr 3e-3]
#
# Fixed: batch 8, LoRA rank 8 / alpha 16, max-len 512, no validation split, seed 0.
# Data: tests/fixtures/data/tool_calls.jsonl, split 80/20 by bench/calls/split.py (seeded; the
# row without "query" is dropped). Model: tests/fixtures/models/pretrained.pkl + tokenizer.model.
# Files stay in a fresh mktemp dir (printed): train/heldout.jsonl, ours/ ref/ (adapter.pkl,
# tuned.cact, train.log, build.log), *.json (eval lines), *.time (fine-tune wall seconds).
#
# Needs python3 with cactus-needle 2.0.8 (jax, flax, optax, sentencepiece) and a release build of
# `needle`: $NEEDLE, else $CARGO_TARGET_DIR/release/needle (CARGO_TARGET_DIR defaults to
# $HOME/.cache/needle-studio/target), built with `cargo build --release -p needle-cli` if missing.
# Ours runs on NEEDLE_DEVICE / auto (a GPU if there is one); the reference on CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
here=$repo/bench/calls
# The reference's finetune_local and build_main, driven as bench/finetune_side_by_side.sh drives them.
reference=$repo/bench/finetune/reference_finetune.py

epochs=8 lr=3e-3 batch=8 rank=8 alpha=16 max_len=512
while [ $# -gt 0 ]; do
  case "$1" in
    --epochs) epochs=$2; shift 2 ;;
    --lr) lr=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done

export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/needle-studio/target}
NEEDLE=${NEEDLE:-$CARGO_TARGET_DIR/release/needle}
if [ ! -x "$NEEDLE" ]; then
  echo "[calls] no $NEEDLE: building it" >&2
  cargo build --release -p needle-cli
fi
export JAX_PLATFORMS=${JAX_PLATFORMS:-cpu}

data=$repo/tests/fixtures/data/tool_calls.jsonl
ckpt=$repo/tests/fixtures/models/pretrained.pkl
tok=$repo/tests/fixtures/models/tokenizer.model
work=$(mktemp -d -t needle-calls.XXXXXX)
echo "[calls] working in $work (epochs $epochs, lr $lr, batch $batch, rank $rank, alpha $alpha, max-len $max_len)"
cd "$work"
mkdir -p ours ref

# a. the seeded 80/20 split
python3 "$here/split.py" "$data" .

# timed NAME CMD...: run CMD with its output in NAME.log-ish files; wall seconds -> NAME.time.
# A failure is reported, not fatal, so the other side still reaches the table.
timed() {
  local name=$1; shift
  local TIMEFORMAT=%R
  { time "$@" > "$name/train.log" 2>&1 < /dev/null ; } 2> "$name.time" \
    || { echo "[calls] $name fine-tune failed:" >&2; tail -n 5 "$name/train.log" >&2; rm -f "$name.time"; }
}

# b. ours: fine-tune, then build the W4 .cact
echo "[calls] ours: needle finetune"
timed ours "$NEEDLE" finetune train.jsonl --checkpoint "$ckpt" --tokenizer "$tok" --epochs "$epochs" \
  --batch-size "$batch" --lr "$lr" --lora-rank "$rank" --lora-alpha "$alpha" --max-len "$max_len" \
  --val-split 0 --out ours/adapter.pkl
if [ -f ours/adapter.pkl ]; then
  "$NEEDLE" build "$ckpt" --lora ours/adapter.pkl --tokenizer "$tok" --bits 4 --out ours/tuned.cact \
    > ours/build.log 2>&1 || echo "[calls] ours: build failed (ours/build.log)" >&2
fi

# c. the reference: finetune_local, then build_main
echo "[calls] reference: finetune_local"
timed ref python3 "$reference" train train.jsonl --checkpoint "$ckpt" --tokenizer "$tok" \
  --epochs "$epochs" --batch-size "$batch" --lr "$lr" --lora-rank "$rank" --lora-alpha "$alpha" \
  --max-len "$max_len" --val-split 0 --out ref/adapter.pkl
if [ -f ref/adapter.pkl ]; then
  python3 "$reference" build "$ckpt" --lora ref/adapter.pkl --tokenizer "$tok" --bits 4 \
    --out ref/tuned.cact > ref/build.log 2>&1 || echo "[calls] reference: build failed (ref/build.log)" >&2
fi

# d. one ruler: our eval (loss + greedy-decoded exact calls) on heldout.jsonl
evaluate() {
  local out=$1; shift
  "$NEEDLE" eval heldout.jsonl --tokenizer "$tok" --accuracy --json --max-len "$max_len" "$@" \
    > "$out" 2> "${out%.json}.err" || echo "[calls] eval for $out failed (${out%.json}.err)" >&2
}
echo "[calls] scoring on heldout.jsonl with needle eval --accuracy"
evaluate base.json --checkpoint "$ckpt"
for side in ours ref; do
  if [ -f $side/adapter.pkl ]; then evaluate ${side}_tuned.json --checkpoint "$ckpt" --lora $side/adapter.pkl; fi
  if [ -f $side/tuned.cact ]; then evaluate ${side}_cact.json --weights $side/tuned.cact; fi
done

# e. the table
echo
python3 "$here/table.py" .
echo "[calls] files in $work"
