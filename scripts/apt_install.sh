# Sourced by the install scripts (not run on its own): `apt_install TAG PACKAGE...` installs the packages dpkg does
# not list as installed, with apt-get (sudo when not root), refreshing the package lists and retrying once when the
# install fails; the apt output goes to /tmp/<TAG>.apt.log. Exits 1, naming the packages, where apt-get is missing or
# the install fails.
apt_install() {
    local tag="$1"; shift
    local aptlog="/tmp/${tag}.apt.log" missing=() sudo=() p
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    [ "${#missing[@]}" -gt 0 ] || return 0
    command -v apt-get >/dev/null || { echo "[$tag] apt-get not found; install ${missing[*]} by hand"; exit 1; }
    [ "$(id -u)" -eq 0 ] || sudo=(sudo)
    echo "[$tag] installing ${missing[*]} (apt-get)"
    local apt=("${sudo[@]}" apt-get install -y -q --no-install-recommends)
    if ! DEBIAN_FRONTEND=noninteractive "${apt[@]}" "${missing[@]}" > "$aptlog" 2>&1; then
        echo "[$tag] install failed; refreshing the package lists and retrying"
        "${sudo[@]}" apt-get update -q >> "$aptlog" 2>&1 || true
        DEBIAN_FRONTEND=noninteractive "${apt[@]}" "${missing[@]}" >> "$aptlog" 2>&1 \
            || { tail -n 20 "$aptlog"; echo "[$tag] could not install ${missing[*]}"; exit 1; }
    fi
}
