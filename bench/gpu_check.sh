#!/usr/bin/env bash
# The GPU check of a Linux bundle, as one prepared script for a session lent the GPU machine: it runs the
# `needle` the bundle installs, unpacked (`dpkg -x`), in under 10 minutes on an H100 or H200.
#
#   bench/gpu_check.sh                # the newest .deb in $CARGO_TARGET_DIR/release/bundle/deb, unpacked
#   bench/gpu_check.sh ROOT|DEB       # an unpacked bundle (ROOT/usr/bin/needle), or a .deb to unpack
#   DEVICE=cpu bench/gpu_check.sh     # the same checks on the CPU, to try the script on a machine without a GPU
#
#   bench/gpu_check.sh --pack DEB DIR # DIR: what to carry to the GPU machine (see below), then run
#                                     # `bench/gpu_check.sh DIR` there
#
# The GPU machine takes at most 64 MiB of files with the repository, and the bundle's CUDA libraries alone are
# ~700 MB, its `needle` 64 MB: `--pack` keeps of the .deb only usr/bin/needle, xz-compressed (~9 MB), and the
# CUDA runtime it cannot start without (libcudart, 0.7 MB); the run unpacks it and fills in the other CUDA
# libraries with links to the machine's own CUDA 13 ones (the nvidia-* wheels of its python3, or
# /usr/local/cuda), saying which it used. E.g. with the device tool:
#   echo /.gpu-bundle/ >>.git/info/exclude; bench/gpu_check.sh --pack target/release/bundle/deb/*.deb .gpu-bundle
#   run(command="bench/gpu_check.sh .gpu-bundle", carry=[".gpu-bundle"], timeout_s=600)
#
# What it runs, the verdicts in $OUT/summary.txt (each step's own output in a scratch folder it names):
#   1. `needle backend`: on a GPU machine it must pick CUDA.
#   2. The reverse pass on $DEVICE against the CPU path and the reference, on the committed goldens of both
#      generations (tests/fixtures/golden/<stem>/{forward,lora}.safetensors): `needle gradients` writes the
#      loss and every LoRA factor's gradient on each device; the golden names which gradients there must be
#      and their shapes (one missing, misshapen or extra fails); the loss must agree to 1e-4 relative and each
#      gradient to 1e-3 of its largest entry (Needle 2), or 3e-4 and 4e-2 (Needle 3, whose quantizers turn a
#      float's last bit into a whole level now and then: crates/engine/src/train/parity_tests.rs says how much).
#   3. `needle eval` of the pre-trained fixture and the loss of every step of a short `needle finetune` of
#      tiny_f32, on $DEVICE and on the CPU, to 1e-3 relative: the optimizer and the data path too.
#   4. `needle bench` at the Needle 2 and Needle 3 shapes (batch 4 × 128), at the whole-run benchmarks'
#      (`--preset mid`, batch 16 × 640), and decoding (`--decode 64`), on $DEVICE and on the CPU: each passes
#      when the device is at least as fast as the CPU (median step; decoding's tokens/s) and, for training,
#      states its GPU memory (DEVICE=cpu runs them once and judges none).
# The verdicts are bench/gpu_verdicts.py's, tried without a GPU by bench/test_gpu_verdicts.py.
# Needs: python3. Exits non-zero when a check fails.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1

if [[ ${1:-} == --pack ]]; then
    [[ -f ${2:-} && -n ${3:-} ]] || { echo "usage: bench/gpu_check.sh --pack DEB DIR" >&2; exit 1; }
    unpacked=$(mktemp -d -t needle-deb.XXXXXX)
    dpkg -x "$2" "$unpacked" || exit 1
    rm -rf "$3"
    mkdir -p "$3/usr/bin" "$3/usr/lib/needle-studio/cuda"
    xz -6 -c "$unpacked/usr/bin/needle" >"$3/usr/bin/needle.xz" || exit 1
    cp "$unpacked"/usr/lib/needle-studio/cuda/libcudart.so.* "$3/usr/lib/needle-studio/cuda/" || exit 1
    rm -rf "$unpacked"
    du -ah "$3"
    exit 0
fi

device=${DEVICE:-cuda}
out=$(mktemp -d -t needle-gpu-check.XXXXXX)
summary="${OUT:-$out}/summary.txt"
: >"$summary"
note() { echo "$*" | tee -a "$summary"; }
failed=0
fixtures=tests/fixtures

bundle=${1:-$(ls -t "${CARGO_TARGET_DIR:-target}"/release/bundle/deb/*.deb 2>/dev/null | head -n 1)}
if [[ -f $bundle ]]; then
    root="$out/bundle"
    rm -rf "$root"
    dpkg -x "$bundle" "$root" || { note "could not unpack $bundle"; exit 1; }
elif [[ -d $bundle ]]; then
    root=$bundle
else
    note "no bundle: pass an unpacked bundle or a .deb (scripts/bundle.sh makes one)"
    exit 1
fi
needle="$root/usr/bin/needle"
if [[ ! -x $needle && -f $needle.xz ]]; then
    python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
        "$needle.xz" "$needle" && chmod +x "$needle"
fi
[[ -x $needle ]] || { note "no usr/bin/needle in $root"; exit 1; }

# The CUDA libraries the engine's rpath looks for ($ORIGIN/../lib/needle-studio/cuda), from this machine
# where the bundle came without them (a missing one only matters on CUDA: the engine then reports it).
libs="$root/usr/lib/needle-studio/cuda"
if [[ ! -e $libs/libcublas.so.13 ]]; then
    mkdir -p "$libs"
    # Each library the folder lacks, and where this machine has it (nothing where it has none).
    found=$(python3 - "$libs" <<'EOF'
import glob, os, site, sys
dirs = [d for p in site.getsitepackages() + [site.getusersitepackages()]
        for d in glob.glob(os.path.join(p, "nvidia", "**", "lib"), recursive=True)]
dirs += ["/usr/local/cuda/lib64", "/usr/local/cuda/lib"]
for want in ["libcudart.so.13", "libcublas.so.13", "libcublasLt.so.13", "libcurand.so.10"]:
    if not os.path.exists(os.path.join(sys.argv[1], want)):
        print(want, next((os.path.join(d, want) for d in dirs if os.path.exists(os.path.join(d, want))), ""))
EOF
    )
    while read -r lib path; do
        if [[ -z $lib ]]; then
            continue
        elif [[ -n $path ]]; then
            ln -s "$path" "$libs/$lib"
            note "$lib: this machine's $path"
        elif [[ $device == cuda ]]; then
            note "FAILED: $lib: none on this machine, and CUDA needs it"
            failed=1
        else
            note "$lib: none on this machine"
        fi
    done <<<"$found"
fi

note "== needle backend ($needle)"
"$needle" backend 2>&1 | tee "$out/backend.txt" >>"$summary"
picked=$("$needle" backend --json 2>>"$out/backend.txt" |
    python3 -c 'import json, sys; print(json.loads(sys.stdin.read())["backend"])')
if [[ $device == cuda && $picked != cuda ]]; then
    note "FAILED: the bundle's needle picked ${picked:-nothing}, not CUDA"
    failed=1
fi

note "== the reverse pass on $device against the CPU and the reference"
# The stems of both generations, with the tolerances of their loss and gradients.
for case in "tiny_f32 pkl 1e-4 1e-3" "tiny_f16 pkl 1e-4 1e-3" "pretrained pkl 1e-4 1e-3" \
    "needle3_tiny safetensors 3e-4 4e-2" "needle3_tiny_out safetensors 3e-4 4e-2"; do
    read -r stem ext loss_tol grad_tol <<<"$case"
    for on in "$device" cpu; do
        "$needle" gradients --checkpoint "$fixtures/models/$stem.$ext" \
            --batch "$fixtures/golden/$stem/forward.safetensors" --adapter "$fixtures/golden/$stem/lora.safetensors" \
            --lora-rank 4 --lora-alpha 8 --device "$on" --out "$out/grads-$stem-$on.safetensors" \
            >"$out/grads-$stem-$on.txt" 2>&1 || { note "FAILED: needle gradients $stem on $on: $(tail -n 2 "$out/grads-$stem-$on.txt")"; failed=1; }
    done
    verdict=$(python3 bench/gpu_verdicts.py gradients "$out/grads-$stem-$device.safetensors" \
        "$out/grads-$stem-cpu.safetensors" "$fixtures/golden/$stem/lora.safetensors" "$loss_tol" "$grad_tol") || failed=1
    note "$stem: $verdict"
done

# `needle eval --json` loss on the pre-trained fixture, on one device.
eval_loss() {
    "$needle" eval "$fixtures/data/tool_calls.jsonl" --checkpoint "$fixtures/models/pretrained.pkl" \
        --tokenizer "$fixtures/models/tokenizer.model" --device "$1" --json 2>"$out/eval-$1.err" |
        python3 -c 'import json, sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1])["loss"])'
}
# The loss of every step of a short `needle finetune` on tiny_f32, one per line.
step_losses() {
    "$needle" finetune "$fixtures/data/tool_calls.jsonl" --checkpoint "$fixtures/models/tiny_f32.pkl" \
        --tokenizer "$fixtures/models/tokenizer.model" --epochs 2 --batch-size 8 --lr 1e-3 --lora-rank 4 \
        --lora-alpha 8 --max-len 256 --seed 0 --out "$out/adapter-$1.safetensors" --device "$1" --events jsonl \
        2>"$out/finetune-$1.err" |
        python3 -c 'import json, sys
for line in sys.stdin:
    event = json.loads(line)
    if event.get("event") == "step":
        print(event["loss"])'
}
note "== eval and a short fine-tune on $device against the CPU"
loss_device=$(eval_loss "$device")
loss_cpu=$(eval_loss cpu)
verdict=$(python3 bench/gpu_verdicts.py losses "$loss_device" "$loss_cpu") || failed=1
note "eval loss: $device $loss_device, cpu $loss_cpu: $verdict"
steps_device=$(step_losses "$device" | tr '\n' ' ')
steps_cpu=$(step_losses cpu | tr '\n' ' ')
verdict=$(python3 bench/gpu_verdicts.py losses "$steps_device" "$steps_cpu") || failed=1
note "finetune step losses: $device [$steps_device], cpu [$steps_cpu]: $verdict"

note "== needle bench on $device against the CPU"
# Each shape on the device and on the CPU: the device must be at least as fast, and state its memory.
for shape in "--preset needle --batch 4 --seq 128 --steps 5" "--preset needle3 --batch 4 --seq 128 --steps 5" \
    "--preset mid --batch 16 --seq 640 --steps 4" "--preset needle --seq 512 --decode 64 --precision f32"; do
    name=$(echo "$shape" | tr -d '-' | tr ' ' '_')
    for on in $(printf '%s\n' "$device" cpu | uniq); do
        # shellcheck disable=SC2086
        "$needle" bench $shape --device "$on" --json >"$out/bench_$name-$on.json" 2>"$out/bench_$name-$on.err" ||
            { note "bench $shape on $on FAILED: $(tail -n 3 "$out/bench_$name-$on.err")"; failed=1; }
    done
    if [[ $device == cpu ]]; then
        # Nothing to compare: DEVICE=cpu tries the script, it does not judge a device.
        note "bench $shape: not judged (DEVICE=cpu): $(tail -n 1 "$out/bench_$name-cpu.json")"
        continue
    fi
    verdict=$(python3 bench/gpu_verdicts.py bench "$out/bench_$name-$device.json" "$out/bench_$name-cpu.json") || failed=1
    note "bench $shape: $verdict"
done

note "== each step's output is in $out"
exit $failed
