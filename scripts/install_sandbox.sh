#!/usr/bin/env bash
# Install what the code sandbox uses (docs/sandbox.md): bubblewrap, util-linux for prlimit and
# setpriv, and libseccomp2 for the seccomp filter. Idempotent; Debian/Ubuntu (apt-get). Other
# distributions: install `bubblewrap`, `util-linux` and `libseccomp` with their package manager.
#
#   scripts/install_sandbox.sh          # installs what is missing, then prints the isolation in force
#
# Without bubblewrap the sandbox still runs, degraded: `isolation_report()` names the mode and what
# the solution can then see (docs/sandbox.md, "Isolation modes").
set -euo pipefail

PACKAGES=(bubblewrap util-linux libseccomp2)
log() { echo "[install_sandbox] $*"; }

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
    if ! DEBIAN_FRONTEND=noninteractive "${apt[@]}" "${missing[@]}" > /tmp/install_sandbox.apt.log 2>&1; then
        log "install failed; refreshing the package lists and retrying"
        "${sudo[@]}" apt-get update -q >> /tmp/install_sandbox.apt.log 2>&1 || true
        DEBIAN_FRONTEND=noninteractive "${apt[@]}" "${missing[@]}" >> /tmp/install_sandbox.apt.log 2>&1 \
            || { tail -n 20 /tmp/install_sandbox.apt.log; log "could not install ${missing[*]}"; exit 1; }
    fi
fi
log "$(bwrap --version)"
if python -c "import sandbox" 2>/dev/null; then
    python -c "
from sandbox import isolation_report
r = isolation_report()
print('[install_sandbox] sandbox mode', repr(r['mode']), '| files hidden:', r['files_hidden'], '| network isolated:', r['network_isolated'],
      '| memory bounded in total:', r['memory_bounded_in_total'], '| seccomp filter:', r['syscall_filter_applied'])"
fi
