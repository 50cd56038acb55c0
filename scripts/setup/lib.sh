# Shared helpers for the setup scripts (sourced, not run).
# apt_install PKG...: installs the Debian packages that are missing, running `apt-get update`
# at most once per boot. Quiet and quick when everything is already there.
set -euo pipefail

_as_root() {
    if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi
}

apt_install() {
    local missing=()
    for pkg in "$@"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    echo "setup: installing Debian packages: ${missing[*]}"
    local stamp=/tmp/.execbox-apt-updated
    if [ ! -e "$stamp" ]; then
        _as_root env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 update -qq
        touch "$stamp"
    fi
    _as_root env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}
