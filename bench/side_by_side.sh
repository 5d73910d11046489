#!/usr/bin/env bash
# One LoRA training-step benchmark, two implementations: `needle bench` (this port, release build)
# and the reference's JAX step (bench/reference_step.py, cactus-needle 2.0.8 on CPU), on the same
# random-init model shape and batch. Prints both JSON lines, then a table with the ratios.
#
#   bench/side_by_side.sh [--preset needle|needle3|tiny] [--batch 4] [--seq 128] [--steps 5] [--rank 16]
#
# The reference half runs only where `python3 -c 'import needle, jax'` works; for `--preset needle3`
# that `needle` must be cactus-needle 3.2.8: put its site-packages in NEEDLE3_PYTHONPATH (it goes
# first on PYTHONPATH). Not used in CI.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

preset=needle batch=4 seq=128 steps=5 rank=16
usage() { sed -n '2,8s/^# \{0,1\}//p' "$0"; }
while [[ $# -gt 0 ]]; do
    case "$1" in
        --preset) preset="${2:?--preset needs a value}"; shift 2 ;;
        --batch) batch="${2:?--batch needs a value}"; shift 2 ;;
        --seq) seq="${2:?--seq needs a value}"; shift 2 ;;
        --steps) steps="${2:?--steps needs a value}"; shift 2 ;;
        --rank) rank="${2:?--rank needs a value}"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "side_by_side.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
    esac
done
flags=(--preset "$preset" --batch "$batch" --seq "$seq" --steps "$steps" --rank "$rank")

target="${CARGO_TARGET_DIR:-target}"
echo "== building needle (release)" >&2
cargo build --release -q -p needle-cli --bin needle

# The last line of stdout that looks like a JSON object.
json_line() { grep '^{' | tail -n 1; }

echo "== needle bench ${flags[*]}" >&2
needle_json="$("$target/release/needle" bench "${flags[@]}" --json | json_line)"
if [[ -z "$needle_json" ]]; then
    echo "side_by_side.sh: needle bench printed no JSON line" >&2
    exit 1
fi
echo "needle:    $needle_json"

reference_json=""
if [[ "$preset" == needle3 && -n "${NEEDLE3_PYTHONPATH:-}" ]]; then
    export PYTHONPATH="$NEEDLE3_PYTHONPATH${PYTHONPATH:+:$PYTHONPATH}"
fi
if python3 -c 'import needle, jax' >/dev/null 2>&1; then
    echo "== reference (JAX, CPU) ${flags[*]}" >&2
    reference_json="$(JAX_PLATFORMS=cpu python3 bench/reference_step.py "${flags[@]}" --json | json_line)"
    echo "reference: $reference_json"
else
    echo "reference: not installed (python3 cannot import needle and jax); showing needle only"
fi

# A numeric field of a flat JSON line (compact or spaced); "-" when absent or null.
field() {
    local v
    v="$(printf '%s\n' "$1" | sed -n "s/.*\"$2\"[[:space:]]*:[[:space:]]*\([-+0-9.eE]*\).*/\1/p")"
    printf '%s' "${v:--}"
}

row() {
    local name="$1" line="$2"
    awk -v n="$name" -v a="$(field "$line" first_step_s)" -v b="$(field "$line" step_s)" \
        -v c="$(field "$line" tokens_per_s)" -v d="$(field "$line" peak_rss_mb)" \
        'function f(x, p) { return x == "-" ? "-" : sprintf("%." p "f", x) }
         BEGIN { printf "  %-10s %14s %10s %10s %13s\n", n, f(a, 2), f(b, 3), f(c, 0), f(d, 0) }'
}

echo
echo "  preset $preset, batch $batch x seq $seq, rank $rank, $steps steps"
printf '  %-10s %14s %10s %10s %13s\n' "" "first step s" "s/step" "tokens/s" "peak RSS MB"
row needle "$needle_json"
if [[ -n "$reference_json" ]]; then
    row reference "$reference_json"
    awk -v ns="$(field "$needle_json" step_s)" -v rs="$(field "$reference_json" step_s)" \
        -v nm="$(field "$needle_json" peak_rss_mb)" -v rm="$(field "$reference_json" peak_rss_mb)" \
        'BEGIN {
            speed = (ns == "-" || rs == "-" || ns + 0 == 0) ? "-" : sprintf("%.2fx", rs / ns)
            mem = (nm == "-" || rm == "-" || rm + 0 == 0) ? "-" : sprintf("%.2fx", nm / rm)
            printf "\n  speed  (reference s/step / needle s/step)   %s\n", speed
            printf "  memory (needle peak RSS / reference peak)   %s\n", mem
        }'
fi
