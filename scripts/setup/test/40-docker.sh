#!/usr/bin/env bash
# Docker + gVisor for the docker provider's tests and bench: installs Debian's docker.io and runsc,
# registers runsc as a Docker runtime (ptrace platform, no network: what works in our VMs;
# --oci-seccomp so gVisor applies the boxes' seccomp profile, which it ignores otherwise),
# starts dockerd in the background when nothing answers (no systemd here) and waits for it.
# Idempotent and quick when everything is already in place.
source "$(dirname "$0")/../lib.sh"

apt_install docker.io runsc debootstrap

changed="$(docker_runtime runsc --platform=ptrace --network=none --oci-seccomp)"

docker_up() { timeout 5 docker version --format '{{.Server.Version}}' >/dev/null 2>&1; }

if docker_up && [ "$changed" = yes ]; then
    # A running daemon rereads `runtimes` on SIGHUP.
    pid="$(cat /var/run/docker.pid 2>/dev/null || true)"
    [ -n "$pid" ] && _as_root kill -HUP "$pid" || true
fi

if ! docker_up; then
    echo "setup: starting dockerd (log: /var/log/dockerd.log)"
    # Stale pid/socket from a previous boot would block the start.
    pid="$(cat /var/run/docker.pid 2>/dev/null || true)"
    if [ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null; then _as_root rm -f /var/run/docker.pid; fi
    extra=()
    # Without a usable iptables (common in nested VMs), dockerd refuses to start; boxes use
    # network "none" anyway.
    iptables -nL >/dev/null 2>&1 || extra+=(--iptables=false --ip-masq=false)
    _as_root bash -c 'nohup dockerd "$@" >>/var/log/dockerd.log 2>&1 &' _ "${extra[@]}"
    for _ in $(seq 1 60); do docker_up && break; sleep 0.5; done
    docker_up || { echo "setup: dockerd did not come up; see /var/log/dockerd.log" >&2; exit 1; }
fi
echo "setup: docker $(docker version --format '{{.Server.Version}}') ready; runtimes: $(docker info --format '{{range $k, $v := .Runtimes}}{{$k}} {{end}}')"
