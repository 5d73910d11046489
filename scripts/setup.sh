#!/usr/bin/env bash
# Installs what building Needle Studio needs beyond Rust, once, or names what it cannot install; with --test,
# also what the tests need; with --bundle, also what scripts/bundle.sh needs on this platform.
#
#   Linux    (Debian and Ubuntu install it; other distributions are told what to install)
#            the app: WebKitGTK 4.1, GTK 3 and friends.
#            --test: Xvfb, WebKitWebDriver and tauri-driver for tests/tests/app_e2e.rs, D-Bus and gnome-keyring
#            for the keychain and notification tests, TypeScript's tsc for src-tauri/tests/ui_types.rs, python3-venv
#            for the workflows' lint (.ci/lint-workflows).
#            --bundle: python3's pip (scripts/cuda-build.sh takes the CUDA toolkit from NVIDIA's wheels), `file`
#            (the AppImage bundler runs it) and npm for the Tauri CLI.
#   macOS    the app: Xcode's command-line tools (WebKit is the system's).
#            --test: TypeScript (Node.js's npm needed). --bundle: npm for the Tauri CLI.
#   Windows  (from Git Bash) the app: Visual Studio's x64 C++ build tools (WebView2 comes with Windows 10 and 11).
#            --test: TypeScript (Node.js's npm needed). --bundle: NVIDIA's CUDA Toolkit 13.0, Python 3 and npm.
# Off Linux, some tests are compiled out (README, "Tests"): the app end to end, the hostile-file limits
# (`ulimit -v`) and the keychain and notification tests need Linux's tools.
#
# Usage: scripts/setup.sh [--test | --bundle]
set -euo pipefail

mode=${1:-}
case "$mode" in
'' | --test | --bundle) ;;
*) echo "usage: scripts/setup.sh [--test | --bundle]" >&2; exit 2 ;;
esac

# The TypeScript that checks ui/, kept outside the clone (src-tauri/tests/ui_types.rs looks there).
typescript=5.9.3
typescript_dir="$HOME/.cache/needle-studio/node"

say() { echo "setup: $*" >&2; }
# What this platform lacks and the user must install, said once at the end.
missing_by_hand=()
need() { missing_by_hand+=("$1"); }

command -v cargo >/dev/null || need "Rust's cargo: install Rust from https://rustup.rs"

linux() {
    local packages=(build-essential pkg-config libwebkit2gtk-4.1-dev libgtk-3-dev librsvg2-dev
        libayatana-appindicator3-dev libxdo-dev)
    case "$mode" in
    # The keychain test's own session bus and Secret Service (src-tauri/tests/commands.rs).
    --test) packages+=(xvfb webkit2gtk-driver dbus gnome-keyring python3-venv) ;;
    --bundle) packages+=(python3-pip file) ;;
    esac
    [[ -z $mode ]] || command -v npm >/dev/null || packages+=(nodejs npm)

    if command -v dpkg >/dev/null; then
        local absent=() package sudo=()
        for package in "${packages[@]}"; do
            dpkg -s "$package" >/dev/null 2>&1 || absent+=("$package")
        done
        if ((${#absent[@]})); then
            ((EUID == 0)) || sudo=(sudo)
            say "installing ${absent[*]}"
            "${sudo[@]}" apt-get update -qq
            DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${absent[@]}"
        fi
    elif ! pkg-config --exists webkit2gtk-4.1 2>/dev/null; then
        need "WebKitGTK 4.1 and GTK 3 development files, with your package manager (see
       https://v2.tauri.app/start/prerequisites/#linux; the Debian names: ${packages[*]})"
    fi

    if [[ $mode == --test ]] && ! command -v tauri-driver >/dev/null &&
        [[ ! -x "${CARGO_HOME:-$HOME/.cargo}/bin/tauri-driver" ]] && command -v cargo >/dev/null; then
        say "installing tauri-driver"
        cargo install tauri-driver --locked --quiet
    fi
}

macos() {
    xcode-select -p >/dev/null 2>&1 || need "Xcode's command-line tools: run \`xcode-select --install\`"
    [[ -z $mode ]] || command -v npm >/dev/null || need "Node.js (its npm), e.g. \`brew install node\`"
}

windows() {
    local vswhere="/c/Program Files (x86)/Microsoft Visual Studio/Installer/vswhere.exe"
    if [[ ! -x $vswhere ]] || [[ -z $("$vswhere" -latest -products '*' \
        -requires Microsoft.VisualStudio.Component.VC.Tools.x86.x64 -property installationPath) ]]; then
        need "Visual Studio 2022 (or its Build Tools) with \"Desktop development with C++\""
    fi
    [[ -z $mode ]] || command -v npm >/dev/null || need "Node.js (its npm), e.g. \`winget install OpenJS.NodeJS.LTS\`"
    if [[ $mode == --bundle ]] && ! "${PYTHON:-python3}" -c '' 2>/dev/null; then
        need "Python 3 for scripts/bundle.sh (set PYTHON=python where it is installed under that name)"
    fi
    if [[ $mode == --bundle ]] && [[ -z ${CUDA_PATH:-} || ! -x "$(cygpath -u "${CUDA_PATH:-}")/bin/nvcc.exe" ]]; then
        need "NVIDIA's CUDA Toolkit 13.0 (nvcc, cuBLAS, cuRAND; its installer sets CUDA_PATH):
       https://developer.nvidia.com/cuda-13-0-2-download-archive"
    fi
}

case "$(uname -s)" in
Linux) linux ;;
Darwin) macos ;;
MINGW* | MSYS* | CYGWIN*) windows ;;
*) need "a supported system: Needle Studio builds on Linux, macOS and Windows, not $(uname -s)" ;;
esac

if ((${#missing_by_hand[@]})); then
    say "install these, then run scripts/setup.sh${mode:+ $mode} again:"
    printf '  - %s\n' "${missing_by_hand[@]}" >&2
    exit 1
fi

if [[ $mode == --test ]] && ! "$typescript_dir/node_modules/.bin/tsc" --version 2>/dev/null | grep -qx "Version $typescript"; then
    say "installing TypeScript $typescript"
    npm install --prefix "$typescript_dir" --no-audit --no-fund --silent "typescript@$typescript"
fi

if [[ $mode == --test && $(uname -s) != Linux ]]; then
    say "off Linux, cargo test compiles out the tests that need Linux's tools: the app end to end" \
        "(Xvfb, WebKitWebDriver), the hostile files' memory limit (ulimit -v), the keychain and notifications (D-Bus)"
fi
