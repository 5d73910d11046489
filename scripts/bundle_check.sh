#!/usr/bin/env bash
# Checks a Linux .deb from scripts/bundle.sh on a machine without the NVIDIA driver, as a new user's machine
# may be: unpacked into a fresh root (`dpkg -x`), none of its programs or libraries lacks a library it needs
# (`ldd` finds every one: the CUDA engine loads the driver only when asked), it ships no libcuda of its own
# (that belongs to the driver), and its `needle backend --json` reports the CPU, CUDA compiled in, and the
# missing driver as the reason, which is what the app's Model step shows (src-tauri/src/worker/engine.rs).
#
# Usage: scripts/bundle_check.sh [DEB]     # default: the newest .deb in $CARGO_TARGET_DIR/release/bundle/deb
# Prints each command and its output; exits non-zero when a check fails.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
target=${CARGO_TARGET_DIR:-$repo/target}
python=${PYTHON:-python3}
deb=${1:-$(ls -t "$target"/release/bundle/deb/*.deb 2>/dev/null | head -n 1)}
[[ -f $deb ]] || { echo "no .deb given and none in $target/release/bundle/deb: run scripts/bundle.sh" >&2; exit 1; }
failed=0
fail() { echo "FAILED: $*"; failed=1; }

if [[ -e /dev/nvidiactl ]] || ldconfig -p | grep -q 'libcuda\.so\.1 '; then
    echo "note: this machine has an NVIDIA driver; the missing-driver checks below expect a machine without one"
fi

root=$(mktemp -d -t needle-deb.XXXXXX)
echo "\$ dpkg -x $deb $root"
dpkg -x "$deb" "$root"
echo "\$ find $root -type f | xargs ls -s (sizes in KiB)"
find "$root" -type f -print0 | xargs -0 ls -s | sed "s|$root||"

echo
echo "== every program and library loads without libcuda"
elves=0
while IFS= read -r -d '' file; do
    [[ $(head -c 4 "$file" | od -An -c | tr -d ' ') == 177ELF ]] || continue
    elves=$((elves + 1))
    echo "\$ ldd ${file#"$root"}"
    # The system's libraries stay in view (the package depends on them); LD_LIBRARY_PATH must not help.
    out=$(env -u LD_LIBRARY_PATH ldd "$file" 2>&1) || true
    echo "$out" | sed 's/^/    /'
    if grep -q 'not found' <<<"$out"; then fail "${file#"$root"} lacks a library"; fi
done < <(find "$root" -type f -print0)
((elves > 0)) || fail "no program in $deb"
echo "$elves ELF files checked"
shipped_driver=$(find "$root" -name 'libcuda.so*')
[[ -z $shipped_driver ]] || fail "the package ships the driver's library: $shipped_driver"
[[ -x $root/usr/bin/needle ]] || fail "no /usr/bin/needle in the package"
[[ -x $root/usr/bin/needle-studio ]] || fail "no /usr/bin/needle-studio in the package"

echo
echo "== the bundled engine's backend report"
echo "\$ /usr/bin/needle backend"
env -u LD_LIBRARY_PATH -u NEEDLE_DEVICE "$root/usr/bin/needle" backend || fail "needle backend"
echo "\$ /usr/bin/needle backend --json"
report=$(env -u LD_LIBRARY_PATH -u NEEDLE_DEVICE "$root/usr/bin/needle" backend --json) || fail "needle backend --json"
echo "$report"
"$python" - "$report" <<'EOF' || failed=1
import json, sys
report = json.loads(sys.argv[1])
checks = {
    "trains on the CPU": report["backend"] == "cpu",
    "CUDA compiled in": "cuda" in report["compiled"],
    "names the missing driver": "CUDA: NVIDIA driver not found (libcuda.so.1)" in report["reason"],
}
for what, ok in checks.items():
    print(f"{'ok' if ok else 'FAILED'}: {what}")
sys.exit(0 if all(checks.values()) else 1)
EOF

echo
if ((failed)); then echo "bundle check FAILED ($deb)"; else echo "bundle check passed ($deb)"; fi
rm -rf "$root"
exit $failed
