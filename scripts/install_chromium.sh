#!/usr/bin/env bash
# Install a headless Chromium for the HTML report's rendering test (tests/analysis/test_analysis_html.py):
# Debian's `chromium` package. Idempotent; Debian/Ubuntu (apt-get). Other distributions: install Chromium
# with their package manager so that `chromium` (or `chromium-browser`) is on PATH.
#
#   scripts/install_chromium.sh         # installs chromium when missing, then prints its version
#
# Without Chromium the rendering test skips (and fails when CI is set).
set -euo pipefail

PACKAGES=(chromium)
log() { echo "[install_chromium] $*"; }

missing=()
for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
    command -v apt-get >/dev/null || { log "apt-get not found; install ${missing[*]} by hand"; exit 1; }
    sudo=()
    [ "$(id -u)" -eq 0 ] || sudo=(sudo)
    log "installing ${missing[*]} (apt-get)"
    apt=("${sudo[@]}" apt-get install -y -q --no-install-recommends)
    if ! DEBIAN_FRONTEND=noninteractive "${apt[@]}" "${missing[@]}" > /tmp/install_chromium.apt.log 2>&1; then
        log "install failed; refreshing the package lists and retrying"
        "${sudo[@]}" apt-get update -q >> /tmp/install_chromium.apt.log 2>&1 || true
        DEBIAN_FRONTEND=noninteractive "${apt[@]}" "${missing[@]}" >> /tmp/install_chromium.apt.log 2>&1 \
            || { tail -n 20 /tmp/install_chromium.apt.log; log "could not install ${missing[*]}"; exit 1; }
    fi
fi
browser="$(command -v chromium || command -v chromium-browser || true)"
[ -n "$browser" ] || { log "chromium is installed but not on PATH"; exit 1; }
log "$("$browser" --version 2>/dev/null || echo "$browser (version unknown)")"
