#!/usr/bin/env bash
# Records the speed figures the README's Benchmarks section quotes, with their source: every run's raw
# output (JSON) goes under bench/results/<date>-<commit>-<cpu>/ beside a meta.json naming the date, the
# commit the binary was built from, the CPU, each command line and the load average before it.
#
#   bench/record.sh [--needle PATH] [--commit SHA] [--only steps|finetune|decode] [--out DIR]
#
# The runs (each ours beside the reference's, where the reference is installed):
#   steps     `needle bench --preset needle|needle3 --batch 4 --seq 128 --steps 5 --json` and the
#             reference's jitted step at the same shape (bench/reference_step.py: 2.0.8 for Needle 2, 3.2.8
#             for Needle 3)
#   finetune  bench/finetune_side_by_side.sh --generation 3 --kind one-app (its summary.json and files)
#   decode    `needle bench --preset needle3 --decode 32 --seq 256 --json` (every precision side by side),
#             the same at the Needle 2 shape, and each precision alone at the Needle 3 shape (its own memory)
# The reference pythons: $NEEDLE2_PYTHON and $NEEDLE3_PYTHON (venvs with cactus-needle 2.0.8 / 3.2.8, jax,
# flax, optax, sentencepiece, safetensors); a side whose python is missing is recorded as skipped.
# --needle: a release `needle` (default: $CARGO_TARGET_DIR/release/needle, built here first); --commit: the
# commit it was built from when it is not this checkout's HEAD. Run it on an idle machine: a figure taken
# beside a build is not a benchmark figure (the load average before each run is kept to show it).
set -euo pipefail
cd "$(dirname "$0")/.."

needle="" commit="" only="" out=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        --needle) needle="${2:?--needle needs a path}"; shift 2 ;;
        --commit) commit="${2:?--commit needs a commit}"; shift 2 ;;
        --only) only="${2:?--only needs steps, finetune or decode}"; shift 2 ;;
        --out) out="${2:?--out needs a folder}"; shift 2 ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "record.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
case "$only" in ""|steps|finetune|decode) ;; *) echo "record.sh: --only steps, finetune or decode" >&2; exit 2 ;; esac

if [[ -z "$needle" ]]; then
    target="${CARGO_TARGET_DIR:-target}"
    cargo build --release -q -p needle-cli --bin needle
    needle="$target/release/needle"
fi
needle=$(realpath "$needle")
# Files the checkout changes from its commit: a binary built here from a changed tree is not that commit's.
changed=$(git status --porcelain --untracked-files=no | wc -l)
[[ -x "$needle" ]] || { echo "record.sh: no needle binary at $needle" >&2; exit 2; }
commit=$(git rev-parse --short=7 "${commit:-HEAD}")
cpu=$(lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -n 1)
slug=$(printf '%s' "$cpu" | tr -c 'A-Za-z0-9\n' '-' | tr -s '-' | sed 's/-$//; s/^-//' | cut -c1-40)
out="${out:-bench/results/$(date -u +%F)-$commit-$slug}"
mkdir -p "$out"
echo "[record] results in $out" >&2

# One line per run in runs.jsonl: what ran, the load before it, its exit status and where its output is.
runs="$out/runs.jsonl"
: >"$runs"
record() { # record NAME OUTFILE COMMAND...: runs COMMAND, its stdout to OUTFILE, its stderr to OUTFILE.log
    local name="$1" file="$2"; shift 2
    local load rc=0
    load=$(cut -d' ' -f1 /proc/loadavg)
    echo "[record] $name (load $load): $*" >&2
    "$@" >"$out/$file" 2>"$out/$file.log" || rc=$?
    python3 - "$runs" "$name" "$file" "$load" "$rc" "$@" <<'PY'
import json, sys
runs, name, file, load, rc, *cmd = sys.argv[1:]
with open(runs, "a") as f:
    f.write(json.dumps({"run": name, "output": file, "load_before": float(load), "exit": int(rc),
                        "command": cmd}) + "\n")
PY
    [[ $rc == 0 ]] || echo "[record] $name exited $rc: $(tail -n 3 "$out/$file.log")" >&2
}
skipped() { # skipped NAME WHY
    python3 -c 'import json,sys; print(json.dumps({"run": sys.argv[1], "skipped": sys.argv[2]}))' "$1" "$2" >>"$runs"
    echo "[record] $1 skipped: $2" >&2
}

reference_python() { # the reference python of generation $1, or nothing
    local p
    if [[ $1 == 2 ]]; then p="${NEEDLE2_PYTHON:-tests/fixtures/.venv/bin/python}"; else p="${NEEDLE3_PYTHON:-tests/fixtures/.venv3/bin/python}"; fi
    [[ -x "$p" ]] && "$p" -c 'import needle, jax' 2>/dev/null && realpath -s "$p"
    return 0
}

if [[ -z "$only" || "$only" == steps ]]; then
    for preset in needle needle3; do
        generation=2; [[ $preset == needle3 ]] && generation=3
        flags=(--preset "$preset" --batch 4 --seq 128 --steps 5)
        record "step-$preset-ours" "step-$preset-ours.json" "$needle" bench "${flags[@]}" --json
        py=$(reference_python $generation)
        if [[ -n "$py" ]]; then
            record "step-$preset-reference" "step-$preset-reference.json" \
                env JAX_PLATFORMS=cpu NEEDLE_TELEMETRY=0 "$py" bench/reference_step.py "${flags[@]}" --json
        else
            skipped "step-$preset-reference" "no cactus-needle $generation.x python (NEEDLE${generation}_PYTHON)"
        fi
    done
fi

if [[ -z "$only" || "$only" == finetune ]]; then
    py=$(reference_python 3)
    if [[ -n "$py" ]]; then
        work=$(mktemp -d -t needle-record-ft.XXXXXX)
        record finetune-needle3-one-app finetune-needle3-one-app.txt \
            bench/finetune_side_by_side.sh --generation 3 --kind one-app --needle "$needle" --python "$py" --workdir "$work"
        mkdir -p "$out/finetune-needle3-one-app"
        for f in summary.json settings.json score_test.json ref.json ours.time ref.time ours.load ref.load ours.events; do
            [[ -f "$work/$f" ]] && cp "$work/$f" "$out/finetune-needle3-one-app/"
        done
        rm -rf "$work"
    else
        skipped finetune-needle3-one-app "no cactus-needle 3.x python (NEEDLE3_PYTHON)"
    fi
fi

if [[ -z "$only" || "$only" == decode ]]; then
    record decode-needle3 decode-needle3.json "$needle" bench --preset needle3 --decode 32 --seq 256 --json
    record decode-needle2 decode-needle2.json "$needle" bench --preset needle --decode 32 --seq 256 --json
    for p in $(python3 -c 'import json,sys; print(" ".join(r["precision"] for r in json.loads(open(sys.argv[1]).read().splitlines()[-1])["precisions"]))' "$out/decode-needle3.json" 2>/dev/null); do
        record "decode-needle3-$p-alone" "decode-needle3-$p-alone.json" \
            "$needle" bench --preset needle3 --decode 32 --seq 256 --precision "$p" --json
    done
fi

python3 - "$out" "$commit" "$cpu" "$needle" "$changed" <<'PY'
import json, os, sys, time
out, commit, cpu, needle, changed = sys.argv[1:]
meta = {"date": time.strftime("%Y-%m-%d", time.gmtime()), "commit": commit, "cpu": cpu,
        "cores": os.cpu_count(), "needle": needle,
        "needle_built": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(os.path.getmtime(needle))),
        "tree_changed_files": int(changed), "runs": "runs.jsonl", "script": "bench/record.sh"}
with open(os.path.join(out, "meta.json"), "w") as f:
    json.dump(meta, f, indent=1)
    f.write("\n")
PY
echo "[record] done: $out" >&2
