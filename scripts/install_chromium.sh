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
. "$(dirname "$0")/apt_install.sh"
log() { echo "[install_chromium] $*"; }

apt_install install_chromium "${PACKAGES[@]}"
browser="$(command -v chromium || command -v chromium-browser || true)"
[ -n "$browser" ] || { log "chromium is installed but not on PATH"; exit 1; }
log "$("$browser" --version 2>/dev/null || echo "$browser (version unknown)")"
