#!/usr/bin/env bash
# The GPU check of the training path, as one prepared script for a session lent the GPU machine
# (the device tool runs it in the repository root; everything it reports also goes to $OUT).
#
#   bench/gpu_check.sh                # CUDA: builds the CUDA flavour with scripts/cuda-build.sh first
#   NEEDLE=path bench/gpu_check.sh    # CUDA, with a binary built elsewhere (the GPU machine has no Rust):
#                                     # scripts/cuda-build.sh here, then carry the binary there
#   DEVICE=cpu bench/gpu_check.sh     # the same checks on the CPU build (target/release/needle), to try
#                                     # the script itself on a machine without a GPU
#
# What it runs, each step's output in $OUT/<step>.txt and the verdicts in $OUT/summary.txt:
#   1. `needle backend`: the backend the binary picks.
#   2. The candle path against the CPU path on the fixtures: `needle eval` of the pre-trained fixture
#      (its whole-file loss) and a short `needle finetune` of tiny_f32 (the loss of every step), on
#      $DEVICE and on the CPU; the losses must agree to 1e-3 relative. The CPU runs the hand-written
#      path, CUDA and Metal run candle's ops: this is where the two meet off the CPU.
#   3. `needle bench` at the Needle 2 shape (batch 4 × 128) and at the whole-run benchmarks' shape
#      (`--preset mid`, batch 16 × 640), and decoding (`--decode 64`), on $DEVICE.
# Needs: python3 (for the comparisons). Exits non-zero when a check fails.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

device=${DEVICE:-cuda}
out=${OUT:-$(mktemp -d -t needle-gpu-check.XXXXXX)}
mkdir -p "$out"
summary="$out/summary.txt"
: > "$summary"
note() { echo "$*" | tee -a "$summary"; }
failed=0

if [[ -n "${NEEDLE:-}" ]]; then
    needle=$NEEDLE
elif [[ "$device" == cuda ]]; then
    note "== building the CUDA flavour (scripts/cuda-build.sh)"
    scripts/cuda-build.sh > "$out/cuda-build.txt" 2>&1 || { note "cuda build FAILED (see cuda-build.txt)"; exit 1; }
    needle="${NEEDLE_CUDA_TARGET:-$HOME/.cache/needle-studio/target-cuda}/release/needle"
else
    cargo build --release -q -p needle-cli --bin needle || exit 1
    needle="${CARGO_TARGET_DIR:-target}/release/needle"
fi
cpu_needle="${CPU_NEEDLE:-$needle}"
fixtures=tests/fixtures

note "== needle backend"
NEEDLE_DEVICE=$device "$needle" backend 2>&1 | tee "$out/backend.txt" >> "$summary"

# `needle eval --json` loss on the pre-trained fixture, on one device.
eval_loss() {
    "$1" eval "$fixtures/data/tool_calls.jsonl" --checkpoint "$fixtures/models/pretrained.pkl" \
        --tokenizer "$fixtures/models/tokenizer.model" --device "$2" --json 2> "$out/eval-$2.err" |
        python3 -c 'import json, sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1])["loss"])'
}
# The loss of every step of a short `needle finetune` on tiny_f32, one per line.
step_losses() {
    "$1" finetune "$fixtures/data/tool_calls.jsonl" --checkpoint "$fixtures/models/tiny_f32.pkl" \
        --tokenizer "$fixtures/models/tokenizer.model" --epochs 2 --batch-size 8 --lr 1e-3 --lora-rank 4 \
        --lora-alpha 8 --max-len 256 --seed 0 --out "$out/adapter-$2.safetensors" --device "$2" --events jsonl \
        2> "$out/finetune-$2.err" |
        python3 -c 'import json, sys
for line in sys.stdin:
    event = json.loads(line)
    if event.get("event") == "step":
        print(event["loss"])'
}
# Whether two lists of numbers agree to 1e-3 relative.
agree() {
    python3 - "$1" "$2" <<'EOF'
import sys
a, b = ([float(x) for x in s.split()] for s in sys.argv[1:3])
ok = len(a) == len(b) > 0 and all(abs(x - y) <= 1e-3 * max(abs(x), abs(y), 1e-6) for x, y in zip(a, b))
print("agree" if ok else f"DIFFER: {a} vs {b}")
sys.exit(0 if ok else 1)
EOF
}

note "== candle path on $device against the CPU path"
loss_device=$(eval_loss "$needle" "$device")
loss_cpu=$(eval_loss "$cpu_needle" cpu)
verdict=$(agree "$loss_device" "$loss_cpu") || failed=1
note "eval loss: $device $loss_device, cpu $loss_cpu: $verdict"
steps_device=$(step_losses "$needle" "$device" | tr '\n' ' ')
steps_cpu=$(step_losses "$cpu_needle" cpu | tr '\n' ' ')
verdict=$(agree "$steps_device" "$steps_cpu") || failed=1
note "finetune step losses: $device [$steps_device], cpu [$steps_cpu]: $verdict"

note "== needle bench on $device"
for shape in "--preset needle --batch 4 --seq 128 --steps 5" "--preset mid --batch 16 --seq 640 --steps 4" \
    "--preset needle --seq 512 --decode 64" "--preset mid --seq 640 --decode 64"; do
    name=$(echo "$shape" | tr -d '-' | tr ' ' '_')
    # shellcheck disable=SC2086
    if "$needle" bench $shape --device "$device" --json > "$out/bench_$name.json" 2> "$out/bench_$name.err"; then
        note "bench $shape: $(tail -n 1 "$out/bench_$name.json")"
    else
        note "bench $shape FAILED: $(tail -n 3 "$out/bench_$name.err")"
        failed=1
    fi
done

note "== files in $out"
exit $failed
