#!/usr/bin/env bash
# Builds the CUDA flavour of `needle` on a machine with no CUDA toolkit and no GPU.
#
# The toolkit comes from NVIDIA's PyPI wheels (CUDA 13.0, all from one release so nvcc, the headers and the
# libraries agree), laid out as an ordinary CUDA root that
# candle-kernels (nvcc through cudaforge: PTX plus a static libmoe.a) and cudarc (`nvcc --version`) understand.
#
# The binary starts on any machine, with or without the NVIDIA driver: cudarc loads the driver's libcuda.so.1
# and the toolkit's libraries when the CUDA backend is first asked for (`dynamic-loading`), and `needle backend`
# reports a missing driver instead of failing to start. candle-core asks cudarc for `dynamic-linking` (libcuda a
# NEEDED library), so this script builds with a copy of candle-core that asks for `dynamic-loading` instead:
# that one word is the whole patch (candle issue #3900, PR #3916 would make it an option).
# The toolkit's run-time libraries are staged in $NEEDLE_CUDA_TARGET/lib/needle-studio/cuda, which the binary's
# rpath names relative to itself ($ORIGIN/../lib/needle-studio/cuda): the same layout a bundle installs
# (scripts/bundle.sh), so the binary runs from the target dir and from a bundle alike.
# On Windows (Git Bash) the toolkit is NVIDIA's installed CUDA Toolkit 13.0 instead of the wheels, MSVC's
# environment is taken from Visual Studio's vcvars64.bat when the shell has no cl.exe, and the DLLs are also
# copied beside needle.exe, where Windows looks for them.
# Needs: cargo, a C compiler (`cc`, nvcc's host compiler), python3 with pip, and PyPI (or PIP_FIND_LINKS).
#
# Usage: scripts/cuda-build.sh            # toolkit into $NEEDLE_CUDA_HOME, binary into $NEEDLE_CUDA_TARGET
# Env:   NEEDLE_CUDA_HOME    toolchain dir      (default $HOME/.cache/needle-studio/cuda)
#        NEEDLE_CUDA_TARGET  cargo target dir   (default $HOME/.cache/needle-studio/target-cuda)
#        CUDA_COMPUTE_CAP    oldest GPU generation the kernels run on (default 80: Ampere; newer GPUs, H100
#                            included, compile the kernels' PTX when they first load them)
#        PYTHON              interpreter whose pip installs the wheels (default python3)
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
home=${NEEDLE_CUDA_HOME:-$HOME/.cache/needle-studio/cuda}
target=${NEEDLE_CUDA_TARGET:-$HOME/.cache/needle-studio/target-cuda}
python=${PYTHON:-python3}
export CUDA_COMPUTE_CAP=${CUDA_COMPUTE_CAP:-80}

# One CUDA release, 13.0 (cudarc 0.19 knows up to 13.4). candle-kernels needs nvcc + cicc (nvidia-nvvm) + the
# crt and cccl headers that cuda_fp16.h/cuda_bf16.h include; candle-kernels links -lcudart, and cudarc loads
# cublas, cublasLt, curand and nvrtc at run time.
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

# The libraries the binary loads at run time from the toolkit: cudart (linked, for candle's kernels) and those
# cudarc opens when candle opens a device (cublas, which needs cublasLt, and curand; nvrtc is linked in name
# only: candle ships its kernels as PTX and never compiles any at run time). The driver's own library
# (libcuda.so.1, nvcuda.dll) is not among them: it belongs to the installed driver. They are staged in
# $target/lib/needle-studio/cuda, and a bundle ships exactly that directory.
linux_libraries=(libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libcurand.so.10)
windows_libraries=(cudart64_13.dll cublas64_13.dll cublasLt64_13.dll curand64_10.dll)

# Links (Linux: the wheels stay where they are) or copies (Windows) of the libraries found under $1.
stage_runtime_libraries() {
    local from=$1 staged="$target/lib/needle-studio/cuda" lib found
    shift
    rm -rf "$staged"
    mkdir -p "$staged"
    for lib in "$@"; do
        found=$(find "$from" -name "$lib" -print -quit)
        [[ -n $found ]] || { log "$lib is not in the toolkit at $from: it and the library list disagree"; exit 1; }
        if [[ $lib == *.dll ]]; then cp "$found" "$staged/"; else ln -s "$found" "$staged/$lib"; fi
    done
}

# A copy of candle-core (the version cargo resolved) whose cudarc dependency asks for `dynamic-loading`.
patched_candle_core() {
    local src version dest
    read -r src version < <(cargo metadata --format-version 1 --manifest-path "$repo/Cargo.toml" \
        --features needle-engine/cuda | "$python" -c 'import json, sys, os
meta = json.load(sys.stdin)
core = next(p for p in meta["packages"] if p["name"] == "candle-core" and p["source"])
print(os.path.dirname(core["manifest_path"]), core["version"])')
    dest="$home/candle-core-$version-dynamic-loading"
    if [[ ! -f $dest/Cargo.toml ]]; then
        rm -rf "$dest.tmp"
        cp -r "$src" "$dest.tmp"
        # Only the one line in [dependencies.cudarc]'s feature list; anything else means candle changed.
        [[ $(grep -c '^    "dynamic-linking",$' "$dest.tmp/Cargo.toml") == 1 ]] ||
            { log "candle-core $version: expected one \"dynamic-linking\" feature line in $src/Cargo.toml"; exit 1; }
        sed -i 's/^    "dynamic-linking",$/    "dynamic-loading",/' "$dest.tmp/Cargo.toml"
        mv "$dest.tmp" "$dest"
    fi
    printf '%s' "$dest"
}

# The patch changes candle-core's entry in Cargo.lock, so the build runs in a copy of the workspace: the
# checkout's lock file, and any cargo run in the checkout meanwhile, see nothing of it. tar keeps the files'
# times, so cargo rebuilds only what changed since the last copy.
copy_workspace() {
    rm -rf "$target/workspace"
    mkdir -p "$target/workspace"
    tar -C "$repo" --exclude=./target --exclude=./.git --exclude=./ui/node_modules -cf - . | tar -C "$target/workspace" -xf -
}

# The toolkit from the wheels, and an rpath that finds the staged libraries from the binary's own place.
linux_toolkit() {
    install_wheels
    local root="$home/site/nvidia/cu13"
    link_libraries "$root"
    export CUDA_ROOT=$root CUDA_PATH=$root CUDA_HOME=$root
    export PATH="$root/bin:$PATH"
    export LIBRARY_PATH="$root/lib${LIBRARY_PATH:+:$LIBRARY_PATH}"
    export RUSTFLAGS="${RUSTFLAGS:+$RUSTFLAGS }-C link-arg=-Wl,-rpath,\$ORIGIN/../lib/needle-studio/cuda"
}

# Windows (Git Bash): NVIDIA's CUDA Toolkit 13.0 installer sets CUDA_PATH, and nvcc needs MSVC's cl.exe with
# its INCLUDE and LIB, as a "x64 Native Tools" prompt sets them. Windows finds DLLs beside the program, so no rpath.
windows_toolkit() {
    [[ -n ${CUDA_PATH:-} ]] || { log "CUDA_PATH is not set: install NVIDIA's CUDA Toolkit 13.0"; exit 1; }
    command -v cl.exe >/dev/null || msvc_environment
    PATH="$(cygpath -u "$CUDA_PATH")/bin:$PATH"
    export PATH
}

# From a plain Git Bash: the x64 MSVC environment of the newest Visual Studio (or Build Tools) that has the C++
# tools, as its vcvars64.bat sets it, imported into this shell (PATH converted, the compiler's variables as is).
msvc_environment() {
    local vswhere="/c/Program Files (x86)/Microsoft Visual Studio/Installer/vswhere.exe" vs scratch name value
    [[ -x $vswhere ]] || { log "cl.exe is not on PATH and there is no Visual Studio: install its C++ build tools"; exit 1; }
    vs=$("$vswhere" -latest -products '*' -requires Microsoft.VisualStudio.Component.VC.Tools.x86.x64 \
        -property installationPath | tr -d '\r')
    [[ -n $vs ]] || { log "no Visual Studio with the x64 C++ tools (vswhere found none): install them"; exit 1; }
    # A batch file of our own, so that cmd.exe sees no quoting of Git Bash's.
    scratch=$(mktemp -d)
    printf '@call "%s\\VC\\Auxiliary\\Build\\vcvars64.bat" >nul || exit /b 1\r\n@set\r\n' "$vs" >"$scratch/env.bat"
    while IFS='=' read -r name value; do
        case ${name^^} in
        PATH) PATH="$(cygpath -u -p "$value"):$PATH" ;;
        INCLUDE | LIB | LIBPATH | VCINSTALLDIR | VCTOOLSINSTALLDIR | VSINSTALLDIR | WINDOWSSDKDIR | UCRTVERSION | \
            UNIVERSALCRTSDKDIR | WINDOWSSDKVERSION) export "$name=$value" ;;
        esac
    done < <(cmd.exe //d //c "$(cygpath -w "$scratch/env.bat")" | tr -d '\r')
    rm -rf "$scratch"
    export PATH
    command -v cl.exe >/dev/null || { log "vcvars64.bat of $vs did not put cl.exe on PATH"; exit 1; }
    log "MSVC: $(command -v cl.exe)"
}

main() {
    mkdir -p "$home"
    local exe='' toolkit libraries candle
    case "$(uname -s)" in
    Linux) linux_toolkit; toolkit="$home/site/nvidia/cu13/lib"; libraries=("${linux_libraries[@]}") ;;
    MINGW* | MSYS* | CYGWIN*) windows_toolkit; toolkit=$(cygpath -u "$CUDA_PATH")/bin; libraries=("${windows_libraries[@]}"); exe=.exe ;;
    *) log "CUDA builds are made on Linux and Windows, not on $(uname -s)"; exit 1 ;;
    esac
    candle=$(patched_candle_core)
    log "nvcc: $(nvcc --version | tail -1); compute capability $CUDA_COMPUTE_CAP; candle-core from $candle"

    copy_workspace
    cargo build --release --manifest-path "$target/workspace/Cargo.toml" --target-dir "$target" \
        --config "patch.crates-io.candle-core.path=\"$candle\"" -p needle-cli --features cuda
    stage_runtime_libraries "$toolkit" "${libraries[@]}"
    if [[ -n $exe ]]; then cp "$target/lib/needle-studio/cuda/"*.dll "$target/release/"; fi
    log "built $target/release/needle$exe (run-time libraries in $target/lib/needle-studio/cuda)"
}

main "$@"
