#!/usr/bin/env bash
# runsc-net: the Docker runtime for runsc boxes with network egress (issue 14, docs/network.md).
# gVisor uses the host network stack *inside the container's own namespace*, which execbox
# configures so that the egress gateway is the box's only way out; boxes without network keep
# the plain `runsc` runtime (--network=none). --oci-seccomp as for runsc (gVisor applies the boxes'
# seccomp profile). Merges only this entry into daemon.json; a running
# daemon rereads runtimes on SIGHUP. Idempotent.
source "$(dirname "$0")/../lib.sh"

DAEMON_JSON=/etc/docker/daemon.json
RUNSC_BIN="$(command -v runsc || echo /usr/bin/runsc)"
changed="$(_as_root /usr/bin/python3 - "$DAEMON_JSON" "$RUNSC_BIN" <<'PY'
import json, os, sys
path, runsc = sys.argv[1], sys.argv[2]
cfg = {}
if os.path.exists(path):
    with open(path) as fh:
        text = fh.read().strip()
    cfg = json.loads(text) if text else {}
want = {"path": runsc, "runtimeArgs": ["--platform=ptrace", "--network=host", "--oci-seccomp"]}
runtimes = cfg.setdefault("runtimes", {})
if runtimes.get("runsc-net") == want:
    print("no")
else:
    runtimes["runsc-net"] = want
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w") as fh:
        json.dump(cfg, fh, indent=2)
    os.replace(path + ".tmp", path)
    print("yes")
PY
)"
if [ "$changed" = yes ]; then
    pid="$(cat /var/run/docker.pid 2>/dev/null || true)"
    [ -n "$pid" ] && _as_root kill -HUP "$pid" || true
fi
echo "setup: docker runtime runsc-net registered"
