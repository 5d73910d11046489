#!/usr/bin/env bash
# Builds this platform's Needle Studio bundles with the GPU-capable engine, and ends by printing each bundle's
# path on its own line.
#
#   Linux    .deb and .rpm (and the AppImage where github.com can be reached; see below): the app, and `needle`
#            built with CUDA (scripts/cuda-build.sh) as /usr/bin/needle, its CUDA libraries in
#            /usr/lib/needle-studio/cuda. The app trains through that `needle`, which uses the GPU when the
#            NVIDIA driver loads and the CPU otherwise (src-tauri/src/worker/engine.rs).
#   macOS    .app and .dmg: the app, and `needle` built with Metal, in Needle Studio.app/Contents/MacOS.
#   Windows  .msi (run from Git Bash, in a shell where MSVC's cl.exe and the CUDA Toolkit 13.0 are set up): the
#            app, and needle.exe built with CUDA beside it with its CUDA DLLs; the installer puts the
#            install folder on PATH (src-tauri/windows/needle-on-path.wxs).
#
# Tauri's CLI is `cargo tauri` when installed (cargo install tauri-cli --locked), else its prebuilt npm
# package, installed into $NEEDLE_TAURI_CLI. The AppImage bundler downloads linuxdeploy and its plugins from
# github.com at bundle time; where that cannot be reached the script says so and builds the others.
#
# Signing, when the environment has what it needs (the release workflow passes its secrets, which arrive empty
# when not set; an empty variable counts as unset, so the bundles are then made unsigned and the log says so):
#   macOS    Tauri signs with APPLE_CERTIFICATE (a .p12, base64), APPLE_CERTIFICATE_PASSWORD and
#            APPLE_SIGNING_IDENTITY, and notarizes with APPLE_ID, APPLE_PASSWORD and APPLE_TEAM_ID.
#   Windows  NEEDLE_WINDOWS_SIGN_COMMAND, a command that signs the file %1 (e.g. signtool sign /fd sha256 ... %1,
#            or a cloud signer's), run by Tauri on every binary and the .msi (bundle.windows.signCommand).
#   Linux    the packages are not signed.
#
# Usage: scripts/bundle.sh
# Env:   CARGO_TARGET_DIR   where the app is built and the bundles land (default target/)
#        NEEDLE_TAURI_CLI   where the npm Tauri CLI is installed (default $HOME/.cache/needle-studio/tauri-cli)
#        those of signing (above) and of scripts/cuda-build.sh (Linux, Windows)
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
target=${CARGO_TARGET_DIR:-$repo/target}
export CARGO_TARGET_DIR=$target
cuda_target=${NEEDLE_CUDA_TARGET:-$HOME/.cache/needle-studio/target-cuda}
tauri_cli_dir=${NEEDLE_TAURI_CLI:-$HOME/.cache/needle-studio/tauri-cli}
tauri_cli_version=2.12.6
python=${PYTHON:-python3}
triple=$(rustc -vV | sed -n 's/^host: //p')
stage="$target/bundle-stage"

log() { printf '[bundle] %s\n' "$*" >&2; }

tauri() {
    if cargo tauri --version >/dev/null 2>&1; then
        cargo tauri "$@"
    else
        if [[ ! -x $tauri_cli_dir/node_modules/.bin/tauri ]]; then
            log "installing @tauri-apps/cli@$tauri_cli_version into $tauri_cli_dir"
            npm install --silent --prefix "$tauri_cli_dir" "@tauri-apps/cli@$tauri_cli_version" >&2
        fi
        "$tauri_cli_dir/node_modules/.bin/tauri" "$@"
    fi
}

# Tauri ships an external binary beside the app's and finds it as <name>-<host triple>.
stage_engine() {
    local built=$1 exe=${2:-}
    rm -rf "$stage"
    mkdir -p "$stage"
    cp "$built" "$stage/needle-$triple$exe"
}

# Which signing this build gets, said in the log; empty signing variables are removed (see the top).
signing() {
    local name
    for name in APPLE_CERTIFICATE APPLE_CERTIFICATE_PASSWORD APPLE_SIGNING_IDENTITY APPLE_ID APPLE_PASSWORD \
        APPLE_TEAM_ID NEEDLE_WINDOWS_SIGN_COMMAND; do
        [[ -n ${!name:-} ]] || unset "$name"
    done
    case "$(uname -s)" in
    Darwin)
        if [[ -z ${APPLE_CERTIFICATE:-} ]]; then
            log "not signed: APPLE_CERTIFICATE is not set (macOS will ask the user to allow the app)"
        elif [[ -n ${APPLE_ID:-} && -n ${APPLE_PASSWORD:-} && -n ${APPLE_TEAM_ID:-} ]]; then
            log "signing as ${APPLE_SIGNING_IDENTITY:-the certificate}, notarizing for team $APPLE_TEAM_ID"
        else
            log "signing as ${APPLE_SIGNING_IDENTITY:-the certificate}; not notarized:" \
                "APPLE_ID, APPLE_PASSWORD and APPLE_TEAM_ID are not all set"
        fi
        ;;
    MINGW* | MSYS* | CYGWIN*)
        if [[ -n ${NEEDLE_WINDOWS_SIGN_COMMAND:-} ]]; then
            log "signing each binary and the .msi with NEEDLE_WINDOWS_SIGN_COMMAND"
        else
            log "not signed: NEEDLE_WINDOWS_SIGN_COMMAND is not set (SmartScreen will warn the user)"
        fi
        ;;
    *) log "not signed: Linux packages are not signed" ;;
    esac
}

# The config added to src-tauri/tauri.conf.json for this build (a JSON merge patch): the staged engine as
# an external binary, and for CUDA its libraries, each file by its real path (the staging directory holds
# links into the toolkit). Linux packages put them where the engine's rpath looks, $ORIGIN/../lib/...;
# Windows puts them beside needle.exe, where the DLL search starts, and signs with the sign command if set.
overlay() {
    local libraries=${1:+$(native "$1")}
    "$python" - "$(native "$stage")" "$libraries" "$(uname -s)" "${NEEDLE_WINDOWS_SIGN_COMMAND:-}" \
        >"$stage/tauri.bundle.json" <<'EOF'
import json, os, sys
stage, libraries, system, sign_command = sys.argv[1:5]
files = sorted(os.listdir(libraries)) if libraries else []
real = {name: os.path.realpath(os.path.join(libraries, name)) for name in files}
bundle = {"externalBin": [os.path.join(stage, "needle")]}
if system == "Linux":
    linux_files = {f"/usr/lib/needle-studio/cuda/{name}": path for name, path in real.items()}
    bundle["linux"] = {kind: {"files": linux_files} for kind in ("deb", "rpm", "appimage")}
elif files:
    bundle["resources"] = {path: name for name, path in real.items()}
if sign_command:
    bundle["windows"] = {"signCommand": sign_command}
print(json.dumps({"bundle": bundle}, indent=2))
EOF
    native "$stage/tauri.bundle.json"
}

# A path as the platform's own programs (python, Tauri) read it: Git Bash's /c/... is C:/... on Windows.
native() {
    if command -v cygpath >/dev/null; then cygpath -m "$1"; else printf '%s' "$1"; fi
}

github_reachable() {
    curl --silent --head --max-time 15 --output /dev/null https://github.com/ 2>/dev/null
}

main() {
    local bundles config started="$stage.started"
    signing
    case "$(uname -s)" in
    Linux)
        "$repo/scripts/cuda-build.sh"
        stage_engine "$cuda_target/release/needle"
        config=$(overlay "$cuda_target/lib/needle-studio/cuda")
        bundles=deb,rpm
        if github_reachable; then
            bundles+=,appimage
        else
            log "AppImage: not built: Tauri's AppImage bundler downloads linuxdeploy from github.com, which this" \
                "machine cannot reach; run this script where it can"
        fi
        ;;
    Darwin)
        cargo build --release --manifest-path "$repo/Cargo.toml" -p needle-cli --features metal
        stage_engine "$target/release/needle"
        config=$(overlay)
        bundles=app,dmg
        ;;
    MINGW* | MSYS* | CYGWIN*)
        "$repo/scripts/cuda-build.sh"
        stage_engine "$cuda_target/release/needle.exe" .exe
        config=$(overlay "$cuda_target/lib/needle-studio/cuda")
        bundles=msi
        ;;
    *)
        log "no bundles for $(uname -s)"
        exit 1
        ;;
    esac
    touch "$started"
    log "bundling $bundles with $config"
    (cd "$repo/src-tauri" && tauri build --ci --bundles "$bundles" --config "$config" >&2)
    # The bundles this run made, and nothing else (the bundle folders keep older ones).
    find "$target/release/bundle" -mindepth 2 -maxdepth 2 -newer "$started" \
        \( -name '*.deb' -o -name '*.rpm' -o -name '*.AppImage' -o -name '*.app' -o -name '*.dmg' -o -name '*.msi' \) |
        sort
}

main "$@"
