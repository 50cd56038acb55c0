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

# docker_runtime NAME RUNSC_ARG...: merges (never overwrites) a runsc runtime entry into
# /etc/docker/daemon.json; prints "yes" when the file changed (a running dockerd then needs SIGHUP).
docker_runtime() {
    local name="$1"; shift
    local runsc; runsc="$(command -v runsc || echo /usr/bin/runsc)"
    _as_root /usr/bin/python3 - /etc/docker/daemon.json "$name" "$runsc" "$@" <<'PY'
import json, os, sys
path, name, runsc, args = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
cfg = {}
if os.path.exists(path):
    with open(path) as fh:
        text = fh.read().strip()
    cfg = json.loads(text) if text else {}
want = {"path": runsc, "runtimeArgs": args}
runtimes = cfg.setdefault("runtimes", {})
if runtimes.get(name) == want:
    print("no")
else:
    runtimes[name] = want
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w") as fh:
        json.dump(cfg, fh, indent=2)
    os.replace(path + ".tmp", path)
    print("yes")
PY
}
