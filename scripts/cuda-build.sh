#!/usr/bin/env bash
# Builds the CUDA flavour of `needle` on a machine with no CUDA toolkit and no GPU.
#
# The toolkit comes from NVIDIA's PyPI wheels (CUDA 13.0, all from one release so nvcc, the headers and the
# libraries agree), laid out as an ordinary CUDA root that candle-kernels (nvcc through cudaforge: PTX plus a static libmoe.a) and
# cudarc (`nvcc --version`, then `-lcuda -lcublas ...`) understand.
#
# The binary needs the NVIDIA driver's libcuda.so.1 to start at all: candle-core builds cudarc with
# `dynamic-linking`, so libcuda is a NEEDED library, not one loaded on demand. The toolkit's own libraries
# (cublas, curand, cudart) are found through the rpath this script sets.
# Needs: cargo, a C compiler (`cc`, also nvcc's host compiler), python3 with pip, and PyPI (or PIP_FIND_LINKS).
#
# Usage: scripts/cuda-build.sh            # toolkit into $NEEDLE_CUDA_HOME, binary into $NEEDLE_CUDA_TARGET
# Env:   NEEDLE_CUDA_HOME    toolchain dir      (default $HOME/.cache/needle-studio/cuda)
#        NEEDLE_CUDA_TARGET  cargo target dir   (default $HOME/.cache/needle-studio/target-cuda)
#        CUDA_COMPUTE_CAP    GPU generation the kernels are compiled for (default 90: H100/H200)
#        PYTHON              interpreter whose pip installs the wheels (default python3)
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
home=${NEEDLE_CUDA_HOME:-$HOME/.cache/needle-studio/cuda}
target=${NEEDLE_CUDA_TARGET:-$HOME/.cache/needle-studio/target-cuda}
python=${PYTHON:-python3}
export CUDA_COMPUTE_CAP=${CUDA_COMPUTE_CAP:-90}

# One CUDA release, 13.0 (cudarc 0.19 knows up to 13.4). candle-kernels needs nvcc + cicc (nvidia-nvvm) + the
# crt and cccl headers that cuda_fp16.h/cuda_bf16.h include; cudarc links -lcuda -lcublas -lcublasLt
# -lcurand -lnvrtc and candle-kernels -lcudart, so each of those must be there at link time.
wheels=(
    nvidia-cuda-nvcc==13.0.88
    nvidia-nvvm==13.0.88
    nvidia-cuda-crt==13.0.88
    nvidia-cuda-runtime==13.0.96
    nvidia-cuda-cccl==13.0.85
    nvidia-cuda-nvrtc==13.0.88
    nvidia-cublas==13.0.2.14
    nvidia-curand==10.4.0.35
)

log() { printf '[cuda-build] %s\n' "$*" >&2; }

# pip --target puts every wheel under site/nvidia/cu13/{bin,include,lib,nvvm}, which is already the shape of a
# CUDA root; the stamp file keeps a second run from reinstalling 600 MB.
install_wheels() {
    local stamp="$home/wheels.txt"
    if [[ -f $stamp && $(cat "$stamp") == "${wheels[*]}" ]]; then
        return
    fi
    log "installing ${#wheels[@]} CUDA wheels into $home/site"
    rm -rf "$home/site"
    "$python" -m pip install --quiet --no-deps --only-binary=:all: --target "$home/site" "${wheels[@]}"
    printf '%s' "${wheels[*]}" >"$stamp"
}

# Tools and linkers look for lib64/ and for unversioned names (`-lcublas` wants libcublas.so); the wheels
# only ship lib/ with the sonames.
link_libraries() {
    local root=$1 lib so
    ln -sfn lib "$root/lib64"
    for so in "$root"/lib/lib*.so.[0-9]*; do
        lib=${so##*/}
        ln -sfn "$lib" "$root/lib/${lib%%.so.*}.so"
    done
}

# libcuda.so belongs to the GPU driver, not to any wheel, yet cudarc's `dynamic-linking` passes `-lcuda`.
# Like the toolkit's own lib64/stubs/libcuda.so, this stub only satisfies the linker: it has the driver's
# soname and exports every driver entry point cudarc can call, and the real libcuda.so.1 of the installed
# driver is what the loader picks at run time. The names come from the cudarc source cargo resolved. Each
# entry point answers CUDA_ERROR_STUB_LIBRARY (34), as NVIDIA's stub does, so a binary run against the stub
# by mistake (or on purpose, to test the no-driver path) gets a driver error instead of undefined behaviour.
build_libcuda_stub() {
    local root=$1 cudarc_src
    cudarc_src=$(cargo metadata --format-version 1 --manifest-path "$repo/Cargo.toml" --features needle-engine/cuda \
        | "$python" -c 'import json, sys, os
meta = json.load(sys.stdin)
print(next(os.path.dirname(p["manifest_path"]) for p in meta["packages"] if p["name"] == "cudarc"))')
    log "generating lib/stubs/libcuda.so from $cudarc_src"
    mkdir -p "$root/lib/stubs"
    grep -ohE 'pub unsafe fn cu[A-Za-z0-9_]+' "$cudarc_src/src/driver/sys/mod.rs" | sort -u \
        | sed -E 's/pub unsafe fn (.*)/int \1(void) { return 34; }/' >"$root/lib/stubs/libcuda.c"
    cc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$root/lib/stubs/libcuda.so" "$root/lib/stubs/libcuda.c"
}

main() {
    mkdir -p "$home"
    install_wheels
    local root="$home/site/nvidia/cu13"
    link_libraries "$root"
    build_libcuda_stub "$root"

    export CUDA_ROOT=$root CUDA_PATH=$root CUDA_HOME=$root
    export PATH="$root/bin:$PATH"
    export LIBRARY_PATH="$root/lib:$root/lib/stubs${LIBRARY_PATH:+:$LIBRARY_PATH}"
    # The binary needs libcublas/libcurand/libnvrtc at run time too: point it at the toolkit it was built
    # with, so running it on this machine needs no LD_LIBRARY_PATH (the driver's libcuda.so.1 comes from the
    # system's library path as usual).
    export RUSTFLAGS="${RUSTFLAGS:+$RUSTFLAGS }-C link-arg=-Wl,-rpath,$root/lib"
    log "nvcc: $(nvcc --version | tail -1); compute capability $CUDA_COMPUTE_CAP"

    cargo build --release --manifest-path "$repo/Cargo.toml" --target-dir "$target" \
        -p needle-cli --features cuda
    log "built $target/release/needle"
}

main "$@"
