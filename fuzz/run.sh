#!/usr/bin/env bash
# Fuzzes the engine's file readers for a fixed time each (issue 15, item 4).
#
#   fuzz/run.sh [SECONDS_PER_TARGET] [TARGET...]      # default 300 s, all seven targets
#
# Targets: pickle, dataset_jsonl, tokenizer_model, cact, and Needle 3's safetensors_checkpoint,
# safetensors_adapter and cact_v3 (bodies in fuzz/bodies.rs).
# Needs `cargo install cargo-fuzz` and a nightly toolchain (`rustup toolchain install nightly`).
#
# Seeds fuzz/corpus/<target>/ from the committed fixtures and hostile seeds (fuzz/seeds/<target>/;
# the corpora are git-ignored and grow between runs), runs each target under libFuzzer with -rss_limit_mb=2048 -timeout=10 and a
# per-target -max_len, and copies every crash, timeout and OOM into fuzz/regressions/<target>/,
# which `cargo test` replays (crates/engine/tests/fuzz_regressions.rs, where each new file must be
# listed with the error it is refused with once the bug is fixed). libFuzzer stops at the
# first failure, so a target is restarted until its time is used up (at most MAX_RESTARTS times).
# To see one input's panic and backtrace: `cargo +nightly fuzz run -O <target> <file>`.
#
# Environment: NO_BUILD=1 skips the up-front `cargo fuzz build`; NICE (default 10) is the niceness
# the build and the fuzzers run at; MAX_RESTARTS (default 20).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
cd "$here"

seconds="${1:-300}"
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(pickle dataset_jsonl tokenizer_model cact safetensors_checkpoint safetensors_adapter cact_v3)
MAX_RESTARTS="${MAX_RESTARTS:-20}"
NICE="${NICE:-10}"

max_len() {
    case "$1" in
        # tests/fixtures/models/tiny_f16.pkl (261,809 bytes) fits whole; the bigger pickles are cut.
        pickle) echo 262144 ;;
        # The fixture datasets are also split into a few lines a seed (below); every example is
        # tokenized, so long inputs only slow the search down.
        dataset_jsonl) echo 16384 ;;
        # The fixture models and blobs are 5-8 KB.
        tokenizer_model) echo 16384 ;;
        # The golden .cact files are 67-206 KB.
        cact|cact_v3) echo 262144 ;;
        # The Needle 3 fixture checkpoints are 392-542 KB; the adapters 31 KB.
        safetensors_checkpoint) echo 655360 ;;
        safetensors_adapter) echo 65536 ;;
        *) echo "unknown target $1" >&2; exit 2 ;;
    esac
}

# Copies the fixtures that seed $1 into fuzz/corpus/$1/ (existing corpus entries are kept).
seed() {
    local target="$1" dir="$here/corpus/$1" f
    mkdir -p "$dir"
    shopt -s nullglob globstar
    case "$target" in
        pickle)
            for f in "$root"/tests/fixtures/models/* "$root"/tests/fixtures/pickles/*.pkl \
                "$root"/tests/fixtures/golden/*/adapter.pkl; do
                cp "$f" "$dir/seed-$(basename "$(dirname "$f")")-$(basename "$f")"
            done ;;
        dataset_jsonl)
            for f in "$root"/tests/fixtures/data/*.jsonl "$root"/tests/fixtures/data/bad/*.jsonl \
                "$root"/examples/*.jsonl "$root"/tests/fixtures/tokenizer/corpus.jsonl; do
                local name
                name="seed-$(basename "$(dirname "$f")")-$(basename "$f" .jsonl)"
                cp "$f" "$dir/$name.jsonl"
                # Small seeds too: three lines each, at most 20 per file.
                split -l 3 -a 3 "$f" "$dir/$name-lines-"
                local n=0 chunk
                for chunk in "$dir/$name"-lines-*; do
                    n=$((n + 1))
                    [ $n -le 20 ] || rm -f "$chunk"
                done
            done ;;
        tokenizer_model)
            for f in "$root"/tests/fixtures/tokenizer/**/*.model "$root"/tests/fixtures/models/*.model \
                "$root"/tests/fixtures/tokenizer/**/*.blob; do
                cp "$f" "$dir/seed-$(basename "$(dirname "$f")")-$(basename "$f")"
            done ;;
        cact)
            for f in "$root"/tests/fixtures/golden/**/*.cact; do
                cp "$f" "$dir/seed-$(basename "$(dirname "$f")")-$(basename "$f")"
            done ;;
        cact_v3)
            for f in "$root"/tests/fixtures/golden/needle3_*/*.cact "$root"/tests/fixtures/hostile/cact3-*.cact; do
                cp "$f" "$dir/seed-$(basename "$(dirname "$f")")-$(basename "$f")"
            done ;;
        safetensors_checkpoint)
            for f in "$root"/tests/fixtures/models/needle3_*.safetensors "$root"/tests/fixtures/hostile/needle3-*.safetensors; do
                cp "$f" "$dir/seed-$(basename "$(dirname "$f")")-$(basename "$f")"
            done ;;
        safetensors_adapter)
            for f in "$root"/tests/fixtures/golden/needle3_heads/adapter.safetensors \
                "$root"/tests/fixtures/hostile/adapter*.safetensors; do
                cp "$f" "$dir/seed-$(basename "$(dirname "$f")")-$(basename "$f")"
            done ;;
    esac
    # The hand-made hostile seeds (fuzz/make_seeds.py), committed beside the fixtures.
    for f in "$here/seeds/$target"/*; do
        cp "$f" "$dir/seed-hostile-$(basename "$f")"
    done
}

if [ "${NO_BUILD:-0}" != 1 ]; then
    nice -n "$NICE" cargo +nightly fuzz build -O
fi

bin_dir="$here/target/$(rustc +nightly -vV | sed -n 's/^host: //p')/release"
for target in "${targets[@]}"; do
    [ -x "$bin_dir/$target" ] || { echo "no $bin_dir/$target: run without NO_BUILD=1" >&2; exit 1; }
done

mkdir -p "$here/logs"
summary="$here/logs/summary.txt"
: > "$summary"
printf '%-16s %8s %12s %8s %8s %s\n' target seconds execs corpus runs new_artifacts | tee -a "$summary"

for target in "${targets[@]}"; do
    seed "$target"
    mkdir -p "$here/artifacts/$target" "$here/regressions/$target"
    len="$(max_len "$target")"
    start=$(date +%s)
    execs=0
    runs=0
    new=()
    while :; do
        now=$(date +%s)
        left=$((seconds - (now - start)))
        [ "$left" -gt 0 ] && [ "$runs" -lt "$MAX_RESTARTS" ] || break
        runs=$((runs + 1))
        log="$here/logs/$target.$runs.log"
        before="$(ls "$here/artifacts/$target")"
        found=0
        # A crash, timeout or OOM ends the run with a non-zero status: that is the point, go on.
        # The binary `cargo fuzz build -O` left, run directly: `cargo fuzz run` would first rebuild
        # whenever the engine's sources changed, inside the time given to the target.
        RUST_BACKTRACE=1 nice -n "$NICE" "$bin_dir/$target" "$here/corpus/$target" \
            -artifact_prefix="$here/artifacts/$target/" \
            -max_total_time="$left" -rss_limit_mb=2048 -timeout=10 -max_len="$len" \
            -print_final_stats=1 >"$log" 2>&1 || true
        n=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
        if [ -z "$n" ]; then
            # Killed before the final stats (an OOM or a timeout): the last progress line has it.
            n=$(grep -oE '^#[0-9]+' "$log" | tail -n 1 | tr -d '#')
        fi
        execs=$((execs + ${n:-0}))
        for a in $(comm -13 <(printf '%s\n' "$before" | sort) <(ls "$here/artifacts/$target" | sort)); do
            case "$a" in
                crash-*|timeout-*|oom-*|leak-*)
                    cp "$here/artifacts/$target/$a" "$here/regressions/$target/$a"
                    new+=("$a")
                    found=1
                    echo "[$target] $a (log: fuzz/logs/$target.$runs.log)" >&2
                    grep -E "panicked at|^Error|ERROR: libFuzzer|SUMMARY|out-of-memory|timeout after" "$log" \
                        | head -n 5 >&2 || true ;;
            esac
        done
        # A run that ended without a new artifact used its whole time (or failed to start).
        [ "$found" = 1 ] || break
    done
    elapsed=$(( $(date +%s) - start ))
    corpus=$(ls "$here/corpus/$target" | wc -l)
    printf '%-16s %8s %12s %8s %8s %s\n' "$target" "$elapsed" "$execs" "$corpus" "$runs" "${new[*]:-none}" \
        | tee -a "$summary"
done
echo "logs: fuzz/logs/, new crashing inputs: fuzz/regressions/<target>/ (replayed by cargo test once listed, with" \
    "the error each must give, in crates/engine/tests/fuzz_regressions.rs)"
