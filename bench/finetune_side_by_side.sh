#!/usr/bin/env bash
# A whole LoRA fine-tuning run of ours (`needle finetune --generation G`) next to the reference's
# (`needle.model.finetune.finetune_local`, JAX on CPU: cactus-needle 3.2.8 for Needle 3, 2.0.8 for
# Needle 2) on the same random-init checkpoint, dataset and settings; then both adapters are scored
# with the reference's masked answer loss on a held-out test set neither run saw.
#
#   bench/finetune_side_by_side.sh [--generation 3|2] [--kind own-tools|apps|one-app] [--examples 160]
#       [--test-examples 40] [--epochs 1] [--batch-size 16] [--max-len 1024] [--rank 16] [--alpha 32]
#       [--lr 1e-4] [--val-split 0.1] [--device cpu] [--timeout 900] [--mem-limit-gb N] [--only ours|ref]
#       [--score-train] [--workdir DIR] [--reuse-inputs] [--needle PATH] [--python PATH] [-- MAKE_INPUTS_ARGS...]
#
# --generation picks the model generation, 3 by default as `needle finetune`'s. Everything on the
# Python side (inputs, the reference's run, the scoring) runs under that generation's reference:
# --python, else $NEEDLE3_PYTHON / $NEEDLE2_PYTHON, else tests/fixtures/.venv3 / .venv (regen.sh
# makes them), else python3; make_inputs.py refuses a python whose cactus-needle is of the other one.
#   3  base.safetensors made by 3.2.8's code; a tokenizer with 3.x's special ids and chat markers;
#      ours trains quantization-aware as 3.2.8 does (a Needle 3 checkpoint needs no flag for it) and
#      writes ours.safetensors in 3.2.8's adapter format; 3.2.8's finetune_local runs whole, its
#      end-of-run scoring (held-out calls decoded through the W4 weights) included, as ours runs its
#      own; both adapters are scored with 3.2.8's QAT loss (CQ W4 STE + A8), the loss it trains on.
#   2  base.pkl made by 2.0.8's code; ours.pkl / ref.pkl; scored with 2.0.8's plain loss.
#
# --kind picks one of the three kinds of data the speed targets name (later options override it):
#   own-tools  160 rows, each with a tool set of its own (nothing shared but the template's start)
#   apps       160 rows over 8 apps' tool sets, shuffled (the generator's default)
#   one-app    27 rows of one app (one tools prompt shared by every row), 6 epochs
# Inputs come from bench/finetune/make_inputs.py (defaults: the generation's released shape scaled
# down alike: d_model 256, 6 layers, 4 heads / 2 kv, 4 mHC lanes; Needle 2 engram layer 2; Needle 3
# q/k 48 and v 64 per head, a 512-token window with global layers 2 and 5, 3 conv taps, engram at 2
# and 5; a 2048-piece tokenizer trained on the data, 8 shared tool prompts of ~400-900 tokens);
# anything after `--` is passed to it (e.g. `-- --layers 4`).
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
# train.jsonl test.jsonl tokenizer.model inputs.json base.EXT, ours.EXT ours.events ours.err ours.time,
# ref.EXT ref.log ref.json ref.time, score_test.json (score_train.json), settings.json, summary.json
# (EXT: safetensors for Needle 3, pkl for Needle 2).
#
# Needs: the generation's reference python (cactus-needle 3.2.8 or 2.0.8 with jax, flax, optax,
# sentencepiece, safetensors) and a release build of `needle` ($NEEDLE, else target/release/needle,
# else $HOME/.cache/needle-studio/target/release/needle; build with
# `cargo build --release -p needle-cli --bin needle`).
set -uo pipefail
cd "$(dirname "$0")/.."
here=bench/finetune

examples=160 test_examples=40 epochs=1 batch=16 max_len=1024 rank=16 alpha=32 lr=1e-4 val_split=0.1
device=cpu timeout_s=900 mem_gb="" only="" score_train=0 reuse=0 workdir="" needle="${NEEDLE:-}"
generation=3 python=""
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
    --generation) generation=$2; shift 2 ;;
    --python) python=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done

# Each generation's files and reference python (the venvs tests/fixtures/regen.sh makes).
case "$generation" in
  3) ext=safetensors venv=tests/fixtures/.venv3 python=${python:-${NEEDLE3_PYTHON:-}} ;;
  2) ext=pkl venv=tests/fixtures/.venv python=${python:-${NEEDLE2_PYTHON:-}} ;;
  *) echo "unknown --generation $generation (3 or 2)" >&2; exit 2 ;;
esac
if [ -z "$python" ]; then
  python=python3
  [ -x "$venv/bin/python" ] && python=$venv/bin/python
fi
command -v "$python" > /dev/null || { echo "no python $python for Needle $generation (see --python)" >&2; exit 2; }
python=$(realpath -s "$(command -v "$python")")   # absolute, the venv's link kept
base=base.$ext

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
export JAX_PLATFORMS=${JAX_PLATFORMS:-cpu} NEEDLE_TELEMETRY=${NEEDLE_TELEMETRY:-0}
log() { echo "[side-by-side] $*"; }

if [ "$reuse" = 1 ] && [ -f "$workdir/$base" ] && [ -f "$workdir/train.jsonl" ]; then
  log "reusing the inputs in $workdir"
else
  log "Needle $generation inputs -> $workdir ($python)"
  "$python" $here/make_inputs.py "$workdir" --generation "$generation" --examples "$examples" \
    --test-examples "$test_examples" \
    ${kind_inputs[@]+"${kind_inputs[@]}"} ${extra[@]+"${extra[@]}"} \
    || { echo "make_inputs failed" >&2; exit 1; }
fi

"$python" - "$workdir/settings.json" <<EOF
import json, sys
from importlib.metadata import version
json.dump({"generation": $generation, "reference": "cactus-needle " + version("cactus-needle"),
           "python": "$python", "adapter_ext": "$ext",
           "examples": $examples, "test_examples": $test_examples, "epochs": $epochs, "batch_size": $batch,
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
      "$needle" finetune train.jsonl --generation "$generation" --checkpoint "$base" --tokenizer tokenizer.model \
      "${common[@]}" --out "ours.$ext" --device "$device" --events jsonl > ours.events 2> ours.err < /dev/null
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
      "$python" "$repo/$here/reference_finetune.py" train train.jsonl --checkpoint "$base" \
      --tokenizer tokenizer.model "${common[@]}" --out "ref.$ext" --report ref.json > ref.log 2>&1 < /dev/null
    echo $? > ref.rc
  )
  log "reference: exit $(cat "$workdir/ref.rc"), $(tail -n1 "$workdir/ref.time" 2>/dev/null) (wall s, peak KiB)"
  [ "$(cat "$workdir/ref.rc")" = 0 ] || tail -n 5 "$workdir/ref.log" >&2
fi

adapters=()
for a in "ours.$ext" "ref.$ext"; do
  [ -f "$workdir/$a" ] && adapters+=("$workdir/$a")
done
if [ ${#adapters[@]} -gt 0 ]; then
  sets=(test)
  [ "$score_train" = 1 ] && sets+=(train)
  for s in "${sets[@]}"; do
    log "scoring ${adapters[*]##*/} on $s.jsonl with the reference's loss"
    "$python" $here/reference_finetune.py score "$workdir/$s.jsonl" "${adapters[@]}" --checkpoint "$workdir/$base" \
      --tokenizer "$workdir/tokenizer.model" --max-len "$max_len" --report "$workdir/score_$s.json" \
      > "$workdir/score_$s.log" 2>&1 || tail -n 5 "$workdir/score_$s.log" >&2
  done
fi

"$python" $here/report.py "$workdir"
echo
log "files in $workdir"
