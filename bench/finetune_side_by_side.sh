#!/usr/bin/env bash
# A whole LoRA fine-tuning run of ours (`needle finetune`) next to the reference's
# (`needle.model.finetune.finetune_local` from cactus-needle 2.0.8, JAX on CPU) on the same
# random-init checkpoint, dataset and settings; then both adapters are scored with the
# reference's masked answer loss on a held-out test set neither run saw.
#
#   bench/finetune_side_by_side.sh [--kind own-tools|apps|one-app] [--examples 160] [--test-examples 40] [--epochs 1]
#       [--batch-size 16] [--max-len 1024] [--rank 16] [--alpha 32] [--lr 1e-4] [--val-split 0.1]
#       [--device cpu] [--timeout 900] [--mem-limit-gb N] [--only ours|ref] [--score-train]
#       [--workdir DIR] [--reuse-inputs] [--needle PATH] [-- MAKE_INPUTS_ARGS...]
#
# --kind picks one of the three kinds of data the speed targets name (later options override it):
#   own-tools  160 rows, each with a tool set of its own (nothing shared but the template's start)
#   apps       160 rows over 8 apps' tool sets, shuffled (the generator's default)
#   one-app    27 rows of one app (one tools prompt shared by every row), 6 epochs
# Inputs come from bench/finetune/make_inputs.py (defaults: d_model 256, 6 layers, 4 heads / 2 kv,
# 4 mHC lanes, engram layer 2, a 2048-piece tokenizer trained on the data, 8 shared tool prompts of
# ~400-900 tokens); anything after `--` is passed to it (e.g. `-- --layers 4 --vocab 0`).
# The machine's load average before each run goes to ours.load / ref.load and into the table:
# on a shared machine, runs that started under load are slower for reasons that are not theirs.
# Each run is timed with `/usr/bin/time -f '%e %M'` (wall seconds, peak RSS) and killed after
# --timeout seconds; --mem-limit-gb puts ours under `ulimit -v`. Ours runs with --device cpu
# unless told otherwise, so both sides use this machine's CPU cores.
#
# --only runs one side (the other side's files already in --workdir still enter the table);
# --reuse-inputs keeps the inputs already in --workdir instead of regenerating them (they are
# seeded, so regenerating gives the same files anyway).
# The files of the run stay in --workdir (default: a fresh mktemp dir, printed at the end):
# train.jsonl test.jsonl tokenizer.model base.pkl, ours.pkl ours.events ours.err ours.time,
# ref.pkl ref.log ref.json ref.time, score_test.json (score_train.json), summary.json.
#
# Needs: python3 with cactus-needle 2.0.8 (jax, flax, optax, sentencepiece) and a release build of
# `needle` ($NEEDLE, else target/release/needle, else $HOME/.cache/needle-studio/target/release/needle;
# build with `cargo build --release -p needle-cli --bin needle`).
set -uo pipefail
cd "$(dirname "$0")/.."
here=bench/finetune

examples=160 test_examples=40 epochs=1 batch=16 max_len=1024 rank=16 alpha=32 lr=1e-4 val_split=0.1
device=cpu timeout_s=900 mem_gb="" only="" score_train=0 reuse=0 workdir="" needle="${NEEDLE:-}"
extra=()
kind_inputs=()
while [ $# -gt 0 ]; do
  case "$1" in
    --kind)
      case "$2" in
        own-tools) kind_inputs=(--tools-per-row) ;;
        apps) kind_inputs=(--tool-sets 8) ;;
        one-app) examples=27; epochs=6; kind_inputs=(--tool-sets 1) ;;
        *) echo "unknown --kind $2 (own-tools, apps or one-app)" >&2; exit 2 ;;
      esac
      shift 2 ;;
    --examples) examples=$2; shift 2 ;;
    --test-examples) test_examples=$2; shift 2 ;;
    --epochs) epochs=$2; shift 2 ;;
    --batch-size) batch=$2; shift 2 ;;
    --max-len) max_len=$2; shift 2 ;;
    --rank|--lora-rank) rank=$2; shift 2 ;;
    --alpha|--lora-alpha) alpha=$2; shift 2 ;;
    --lr) lr=$2; shift 2 ;;
    --val-split) val_split=$2; shift 2 ;;
    --device) device=$2; shift 2 ;;
    --timeout) timeout_s=$2; shift 2 ;;
    --mem-limit-gb) mem_gb=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    --score-train) score_train=1; shift ;;
    --reuse-inputs) reuse=1; shift ;;
    --workdir) workdir=$2; shift 2 ;;
    --needle) needle=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done

if [ "$only" != ref ]; then
  if [ -z "$needle" ]; then
    for candidate in target/release/needle "$HOME/.cache/needle-studio/target/release/needle"; do
      [ -x "$candidate" ] && { needle=$candidate; break; }
    done
  fi
  if [ -z "$needle" ] || [ ! -x "$needle" ]; then
    echo "no needle binary: set NEEDLE or build with cargo build --release -p needle-cli --bin needle" >&2
    exit 2
  fi
  needle=$(realpath "$needle")
fi

[ -n "$workdir" ] || workdir=$(mktemp -d -t needle-ft-bench.XXXXXX)
mkdir -p "$workdir"
workdir=$(realpath "$workdir")
repo=$(pwd)
export JAX_PLATFORMS=${JAX_PLATFORMS:-cpu}
log() { echo "[side-by-side] $*"; }

if [ "$reuse" = 1 ] && [ -f "$workdir/base.pkl" ] && [ -f "$workdir/train.jsonl" ]; then
  log "reusing the inputs in $workdir"
else
  log "inputs -> $workdir"
  python3 $here/make_inputs.py "$workdir" --examples "$examples" --test-examples "$test_examples" \
    ${kind_inputs[@]+"${kind_inputs[@]}"} ${extra[@]+"${extra[@]}"} \
    || { echo "make_inputs failed" >&2; exit 1; }
fi

python3 - "$workdir/settings.json" <<EOF
import json, sys
json.dump({"examples": $examples, "test_examples": $test_examples, "epochs": $epochs, "batch_size": $batch,
           "max_len": $max_len, "rank": $rank, "alpha": $alpha, "lr": $lr, "val_split": $val_split,
           "device_ours": "$device", "make_inputs_extra": "${kind_inputs[*]:-} ${extra[*]:-}",
           "needle": "$needle", "needle_built": "$( [ -n "$needle" ] && date -r "$needle" '+%F %T' )"},
          open(sys.argv[1], "w"))
EOF

common=(--epochs "$epochs" --batch-size "$batch" --lr "$lr" --lora-rank "$rank" --lora-alpha "$alpha"
        --max-len "$max_len" --val-split "$val_split" --seed 0)

if [ "$only" != ref ]; then
  log "ours: $needle finetune (timeout ${timeout_s}s${mem_gb:+, ulimit -v ${mem_gb} GB})"
  (
    cd "$workdir"
    [ -n "$mem_gb" ] && ulimit -v $((mem_gb * 1024 * 1024))
    cut -d' ' -f1-3 /proc/loadavg > ours.load
    timeout "$timeout_s" /usr/bin/time -f '%e %M' -o ours.time \
      "$needle" finetune train.jsonl --checkpoint base.pkl --tokenizer tokenizer.model "${common[@]}" \
      --out ours.pkl --device "$device" --events jsonl > ours.events 2> ours.err < /dev/null
    echo $? > ours.rc
  )
  log "ours: exit $(cat "$workdir/ours.rc"), $(tail -n1 "$workdir/ours.time" 2>/dev/null) (wall s, peak KiB)"
  [ "$(cat "$workdir/ours.rc")" = 0 ] || tail -n 5 "$workdir/ours.err" >&2
fi

if [ "$only" != ours ]; then
  log "reference: finetune_local (timeout ${timeout_s}s)"
  (
    cd "$workdir"
    cut -d' ' -f1-3 /proc/loadavg > ref.load
    timeout "$timeout_s" /usr/bin/time -f '%e %M' -o ref.time \
      python3 "$repo/$here/reference_finetune.py" train train.jsonl --checkpoint base.pkl \
      --tokenizer tokenizer.model "${common[@]}" --out ref.pkl --report ref.json > ref.log 2>&1 < /dev/null
    echo $? > ref.rc
  )
  log "reference: exit $(cat "$workdir/ref.rc"), $(tail -n1 "$workdir/ref.time" 2>/dev/null) (wall s, peak KiB)"
  [ "$(cat "$workdir/ref.rc")" = 0 ] || tail -n 5 "$workdir/ref.log" >&2
fi

adapters=()
for a in ours.pkl ref.pkl; do
  [ -f "$workdir/$a" ] && adapters+=("$workdir/$a")
done
if [ ${#adapters[@]} -gt 0 ]; then
  sets=(test)
  [ "$score_train" = 1 ] && sets+=(train)
  for s in "${sets[@]}"; do
    log "scoring ${adapters[*]##*/} on $s.jsonl with the reference's loss"
    python3 $here/reference_finetune.py score "$workdir/$s.jsonl" "${adapters[@]}" --checkpoint "$workdir/base.pkl" \
      --tokenizer "$workdir/tokenizer.model" --max-len "$max_len" --report "$workdir/score_$s.json" \
      > "$workdir/score_$s.log" 2>&1 || tail -n 5 "$workdir/score_$s.log" >&2
  done
fi

python3 $here/report.py "$workdir"
echo
log "files in $workdir"
