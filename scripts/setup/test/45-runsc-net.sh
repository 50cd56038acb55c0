#!/usr/bin/env bash
# runsc-net: the Docker runtime for runsc boxes with network egress (issue 14, docs/network.md).
# gVisor uses the host network stack *inside the container's own namespace*, which execbox
# configures so that the egress gateway is the box's only way out; boxes without network keep
# the plain `runsc` runtime (--network=none). --oci-seccomp as for runsc (gVisor applies the boxes'
# seccomp profile). Merges only this entry into daemon.json; a running
# daemon rereads runtimes on SIGHUP. Idempotent.
source "$(dirname "$0")/../lib.sh"

changed="$(docker_runtime runsc-net --platform=ptrace --network=host --oci-seccomp)"
if [ "$changed" = yes ]; then
    pid="$(cat /var/run/docker.pid 2>/dev/null || true)"
    [ -n "$pid" ] && _as_root kill -HUP "$pid" || true
fi
echo "setup: docker runtime runsc-net registered"
