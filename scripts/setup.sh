#!/usr/bin/env bash
# Installs what building Needle Studio needs beyond Rust, once; with --test, also what its end-to-end test
# drives the app with and what type-checks its web UI. Only Linux needs anything: macOS has WebKit and
# Windows 10/11 has WebView2 (and `npm install --prefix ~/.cache/needle-studio/node typescript` there).
#
# Usage: scripts/setup.sh           # the app's build dependencies (WebKitGTK and friends)
#        scripts/setup.sh --test    # plus Xvfb, WebKitWebDriver and tauri-driver for tests/tests/app_e2e.rs,
#                                   # gnome-keyring for the keychain test, and TypeScript's tsc for
#                                   # src-tauri/tests/ui_types.rs
set -euo pipefail

command -v cargo >/dev/null || { echo "setup: cargo is required: install Rust from https://rustup.rs" >&2; exit 1; }
[[ "$(uname -s)" == Linux ]] || exit 0

packages=(build-essential pkg-config libwebkit2gtk-4.1-dev libgtk-3-dev librsvg2-dev libayatana-appindicator3-dev libxdo-dev)
# The TypeScript that checks ui/, kept outside the clone (src-tauri/tests/ui_types.rs looks there).
typescript=5.9.3
typescript_dir="$HOME/.cache/needle-studio/node"
if [[ "${1:-}" == --test ]]; then
    # The keychain test's own session bus and Secret Service (src-tauri/tests/commands.rs).
    packages+=(xvfb webkit2gtk-driver dbus gnome-keyring)
    command -v npm >/dev/null || packages+=(nodejs npm)
fi

if command -v dpkg >/dev/null; then
    missing=()
    for package in "${packages[@]}"; do
        dpkg -s "$package" >/dev/null 2>&1 || missing+=("$package")
    done
    if ((${#missing[@]})); then
        sudo=()
        ((EUID == 0)) || sudo=(sudo)
        echo "setup: installing ${missing[*]}" >&2
        "${sudo[@]}" apt-get update -qq
        DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
    fi
elif ! pkg-config --exists webkit2gtk-4.1 2>/dev/null; then
    echo "setup: install WebKitGTK 4.1 and GTK 3 development files with your package manager" >&2
    echo "       (see https://v2.tauri.app/start/prerequisites/#linux), then run this again" >&2
    exit 1
fi

if [[ "${1:-}" == --test ]] && ! command -v tauri-driver >/dev/null && [[ ! -x "${CARGO_HOME:-$HOME/.cargo}/bin/tauri-driver" ]]; then
    echo "setup: installing tauri-driver" >&2
    cargo install tauri-driver --locked --quiet
fi

if [[ "${1:-}" == --test ]] && ! "$typescript_dir/node_modules/.bin/tsc" --version 2>/dev/null | grep -qx "Version $typescript"; then
    echo "setup: installing TypeScript $typescript" >&2
    npm install --prefix "$typescript_dir" --no-audit --no-fund --silent "typescript@$typescript"
fi
