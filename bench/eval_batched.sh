#!/usr/bin/env bash
# `needle eval --accuracy` over 200 rows at the released Needle 3 shape, before and after answers were
# decoded together: the commit before "Batched greedy decoding" (rows one at a time) and this
# checkout (ANSWER_BATCH rows at a time), each a release build of its own in its own target
# folder. Prints each run's wall time, the speed-up, and whether both made the same
# calls (the exact and parsed counts, and the wrong answers written by --answers, compared).
#
#   bench/eval_batched.sh [DATA.jsonl]
#
# Model: the published Needle 3 (`Cactus-Compute/needle3`, from the Hugging Face cache, downloaded
# first if missing: `needle download` fetches it ahead), unless EVAL_ARGS names other weights (e.g.
# `EVAL_ARGS="--checkpoint examples/demo/needle3/base.safetensors"` for a quick try of the script). Data: DATA, else the bundled demo's
# smart_home.jsonl twice over (240 rows, each prompt its five-tool tools prompt and a query), of
# which the first 200 are scored. Files stay in a fresh mktemp dir (printed). Measure on an idle
# machine: the figures of a machine shared with builds are not benchmark figures.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
case "${1:-}" in -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;; esac
out=$(mktemp -d)
echo "[eval_batched] files in $out" >&2
data=${1:-}
if [ -z "$data" ]; then
  data=$out/rows.jsonl
  cat examples/demo/smart_home.jsonl examples/demo/smart_home.jsonl >"$data"
fi
batched=$(git log --format=%H --grep='^Batched greedy decoding' -1)
[ -n "$batched" ] || { echo "no commit 'Batched greedy decoding' in this checkout's history" >&2; exit 1; }
git worktree add -q --detach "$out/before" "$batched^"
trap 'git -C "$repo" worktree remove --force "$out/before"' EXIT
base=${CARGO_TARGET_DIR:-$HOME/.cache/needle-studio/target}
for side in before after; do
  dir=$repo; [ $side = before ] && dir=$out/before
  (cd "$dir" && CARGO_TARGET_DIR=$base-eval-$side cargo build --release -q -p needle-cli --bin needle)
done
for side in before after; do
  "$base-eval-$side/release/needle" eval "$data" ${EVAL_ARGS:-} --accuracy --max-examples 200 --answers "$out/$side.wrong.jsonl" \
    --json >"$out/$side.json" 2>"$out/$side.log" &
  pid=$!
  start=$(date +%s.%N)
  wait $pid || { echo "$side: needle eval failed: $(tail -n 3 "$out/$side.log")" >&2; exit 1; }
  python3 -c "import sys; print(float(sys.argv[2]) - float(sys.argv[1]))" "$start" "$(date +%s.%N)" >"$out/$side.seconds"
done
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
runs = {}
for side in ("before", "after"):
    line = json.loads(open(f"{out}/{side}.json").read().strip().splitlines()[-1])
    calls = line["accuracy"]
    runs[side] = (float(open(f"{out}/{side}.seconds").read()), calls, open(f"{out}/{side}.wrong.jsonl").read())
    print(f"{side:<7} {runs[side][0]:8.1f} s  {calls['examples']} rows, exact {calls['exact']}, parsed {calls['parsed']}")
(b, bc, bw), (a, ac, aw) = runs["before"], runs["after"]
same = (bc["exact"], bc["parsed"], bw) == (ac["exact"], ac["parsed"], aw)
print(f"speed-up {b / a:.1f}x; same calls: {'yes' if same else 'NO'}")
sys.exit(0 if same else 1)
PY
