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
. "$(dirname "$0")/apt_install.sh"
log() { echo "[install_sandbox] $*"; }

apt_install install_sandbox "${PACKAGES[@]}"
log "$(bwrap --version)"
if python -c "import sandbox" 2>/dev/null; then
    python -c "
from sandbox import isolation_report
r = isolation_report()
print('[install_sandbox] sandbox mode', repr(r['mode']), '| files hidden:', r['files_hidden'], '| network isolated:', r['network_isolated'],
      '| memory bounded in total:', r['memory_bounded_in_total'], '| seccomp filter:', r['syscall_filter_applied'])"
fi
