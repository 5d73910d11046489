#!/usr/bin/env bash
# The bundled example's table (README, "The bundled example"), measured again: for each generation's
# demo base, the commands the README shows — a Quick fine-tune, `needle build`, `needle eval
# --accuracy` on the held-out split for the base and for the tuned model with `--quant-rows` (float,
# simulated, the `.cact`), and `needle suite` for base, tuned and `.cact`, with no gate and at the
# production contract's 0.4. Every command's raw output is kept under
# bench/results/demo-<YYYY-MM-DD>-<short commit>/ (JSON; the fine-tune's and the build's as JSON
# events, one a line), with meta.json (date, commit, CPU, each command line and its wall seconds);
# then bench/demo/report.py prints the table's markdown rows and the gate's figures from those files.
#
#   bench/demo_table.sh [--generation 2|3] [--out DIR] [--confidence]
#
# --generation: one generation only (default both). --out: the results folder (default above; it
# must not exist yet, so one run's files are never mixed with another's). --confidence: each
# fine-tune fits its confidence head, and the tuned model is scored once more with the head moved
# aside (nN-eval-tuned-decode.json: the decode probability alone); bench/demo/report.py confidence
# then prints the held-out AUROC and ECE of each. The adapters and `.cact`
# files go to a temporary folder, removed at the end. Needs python3 and a release `needle`: $NEEDLE,
# else $CARGO_TARGET_DIR/release/needle (CARGO_TARGET_DIR defaults to target), built here when
# $NEEDLE is not set. Two Quick trainings and their scoring: minutes on two CPU cores. Not run by CI.
# Accuracy does not depend on the machine's load; the recorded wall seconds do, and are no benchmark.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

usage() { sed -n '11,12s/^# \{0,1\}//p' "$0"; }
generations=(2 3) out="" confidence=0
while [[ $# -gt 0 ]]; do
    case "$1" in
        --generation)
            case "${2:-}" in
                2 | 3) generations=("$2") ;;
                *) echo "demo_table.sh: --generation takes 2 or 3, not '${2:-}'" >&2; exit 2 ;;
            esac
            shift 2 ;;
        --out) out="${2:?--out needs a folder}"; shift 2 ;;
        --confidence) confidence=1; shift ;;
        -h | --help) usage; exit 0 ;;
        *) echo "demo_table.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
    esac
done

if [[ -z "${NEEDLE:-}" ]]; then
    echo "== building needle (release)" >&2
    cargo build --release -q -p needle-cli --bin needle
    NEEDLE="${CARGO_TARGET_DIR:-target}/release/needle"
fi
[[ -x "$NEEDLE" ]] || { echo "demo_table.sh: no needle binary at $NEEDLE; build it or set NEEDLE" >&2; exit 1; }

date_utc="$(date -u +%Y-%m-%d)"
# The commit and whether the tree differs from it, taken before anything runs: what the figures are of.
commit="$(git rev-parse HEAD)"
changed="$(git status --porcelain --untracked-files=no | wc -l)"
results="${out:-bench/results/demo-$date_utc-${commit:0:7}}"
if [[ -e "$results" ]]; then
    echo "demo_table.sh: $results exists already; move it away or pass --out another folder" >&2
    exit 1
fi
mkdir -p "$results"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# The load when the run starts: the wall seconds recorded are no benchmark on a busy machine.
load="$(cut -d' ' -f1-3 /proc/loadavg)"

data=examples/demo/smart_home.jsonl
suite=examples/demo/smart_home.suite.json
# The split the Quick preset holds out, which eval is told so that it scores the same rows.
val_split=0.2
# Each command as run: its results file, wall seconds and arguments, tab-separated, for meta.json.
commands="$work/commands.tsv"
: >"$commands"

# Runs one command with its stdout kept as $results/NAME and its stderr as $work/NAME.log; an exit
# status above MAX_STATUS (`needle suite` exits 1 when the contract does not hold) stops the script.
step() {
    local name="$1" max_status="$2"
    shift 2
    echo "== $name: $*" >&2
    local start status=0
    start="$(date +%s.%N)"
    "$@" >"$results/$name" 2>"$work/$name.log" </dev/null || status=$?
    if ((status > max_status)); then
        echo "demo_table.sh: $name failed (exit $status): $*" >&2
        tail -n 20 "$work/$name.log" >&2
        exit 1
    fi
    local seconds
    seconds="$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')"
    # The binary is named needle and the temporary folder $WORK in the record, so that the command
    # lines read the same on every machine.
    local shown=("$@")
    shown[0]=needle
    printf '%s\t%s\t%s\n' "$name" "$seconds" "${shown[*]//$work/\$WORK}" >>"$commands"
}

for generation in "${generations[@]}"; do
    case "$generation" in
        2) base=examples/demo/base.pkl adapter="$work/n2.pkl" ;;
        3) base=examples/demo/needle3/base.safetensors adapter="$work/n3.safetensors" ;;
    esac
    n="n$generation"
    cact="$work/$n.cact"
    head_flag=()
    ((confidence)) && head_flag=(--confidence)
    step "$n-finetune.jsonl" 0 "$NEEDLE" finetune --preset quick "$data" --checkpoint "$base" --out "$adapter" \
        --events jsonl "${head_flag[@]}"
    step "$n-build.jsonl" 0 "$NEEDLE" build "$base" --lora "$adapter" --out "$cact" --events jsonl
    step "$n-eval-base.json" 0 "$NEEDLE" eval "$data" --checkpoint "$base" --val-split "$val_split" --accuracy --json
    step "$n-eval-tuned.json" 0 "$NEEDLE" eval "$data" --checkpoint "$base" --lora "$adapter" \
        --val-split "$val_split" --accuracy --quant-rows "$cact" --json
    head="$adapter.head.safetensors"
    if ((confidence)) && [[ -e "$head" ]]; then
        # The same answers with the decode probability alone: the head file put aside, then back
        # for the suites.
        mv "$head" "$work/$n.head.aside"
        step "$n-eval-tuned-decode.json" 0 "$NEEDLE" eval "$data" --checkpoint "$base" --lora "$adapter" \
            --val-split "$val_split" --accuracy --json
        mv "$work/$n.head.aside" "$head"
    fi
    for gate in 0 0.4; do
        suffix=""
        [[ "$gate" == 0 ]] || suffix="-gate$gate"
        step "$n-suite-base$suffix.json" 1 "$NEEDLE" suite "$suite" --checkpoint "$base" --min-confidence "$gate" --json
        step "$n-suite-tuned$suffix.json" 1 "$NEEDLE" suite "$suite" --checkpoint "$base" --lora "$adapter" \
            --min-confidence "$gate" --json
        step "$n-suite-cact$suffix.json" 1 "$NEEDLE" suite "$suite" --weights "$cact" --min-confidence "$gate" --json
    done
done

cpu="$(lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -n 1)"
python3 bench/demo/report.py meta "$results" "$commands" --date "$date_utc" --commit "$commit" \
    --cpu "$cpu" --cores "$(nproc)" --dirty "$changed" \
    --load "$load"
echo "== results in $results" >&2
python3 bench/demo/report.py table "$results"
