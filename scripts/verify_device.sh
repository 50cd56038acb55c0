#!/usr/bin/env bash
# The checks this project's 2-core, cgroup v1 CI machine cannot make, in one run on a lent machine
# with many cores, cgroup v2 and an NVIDIA GPU, but no network, apt or bubblewrap:
#   1. bench/bench_scaling.py at concurrency 1-16, twice (issue 21: >= 75 % of linear to 16 cores);
#   2. scripts/verify_cgroup_v2.sh (jail limits on a real cgroup v2 host);
#   3. scripts/verify_gpu.sh (a CUDA program in a jail box with `gpu: all`, none without it);
#   4. the jail's integration and attack tests (tests/integration/jail, tests/security/jail) on this
#      kernel and cgroup v2;
#   5. torch on the GPU in a jail box, from a runtime made of the machine's own torch venv
#      (scripts/device_runtime_from_venv.py; not in the default PHASES).
# The jail's host pieces come from CARRY_DIR (scripts/device_carry.sh makes it on a Debian host);
# each is installed only where the machine lacks it. The repository's own Python code runs from
# src/ with the machine's python3 (it needs pytest, which that machine's python3 has).
#
# Usage (as root):  scripts/verify_device.sh CARRY_DIR [OUT_DIR]     (OUT_DIR default: $OUT or /tmp)
# SCALING_ARGS overrides bench_scaling.py's arguments; PHASES (default "1 2 3 4") picks phases.
# Writes setup.txt, scaling.txt, cgroup-v2-report.txt, gpu-report.txt, jail-suite.txt (and, phase 5,
# torch-runtime.txt and gpu-torch-report.txt) to OUT_DIR.
set -uo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
cd "$REPO"
CARRY="$(cd "${1:?usage: verify_device.sh CARRY_DIR [OUT_DIR]}" && pwd)"
DEST="${2:-${OUT:-/tmp}}"
mkdir -p "$DEST"
say() { echo "== $*"; }

setup() {
    say "machine: $(uname -srm); $(nproc) cpus; $(awk '/MemTotal/ {print int($2/1048576) " GiB"}' /proc/meminfo)"
    say "cgroup fs: $(stat -fc %T /sys/fs/cgroup); controllers: $(cat /sys/fs/cgroup/cgroup.controllers 2>/dev/null)"
    say "own cgroup: $(cat /proc/self/cgroup | tr '\n' ' '); pid 1: $(cat /proc/1/comm)"
    say "loop devices: $([ -e /dev/loop-control ] && echo yes || echo 'no /dev/loop-control (workspaces fall back to tmpfs)')"
    say "user namespaces: max $(cat /proc/sys/user/max_user_namespaces 2>/dev/null || echo '?')"
    local missing=()
    if [ ! -x /usr/bin/bwrap ] && [ ! -x /usr/local/bin/bwrap ]; then
        install -m 0755 "$CARRY/bin/bwrap" /usr/local/bin/bwrap
        missing+=(/usr/local/bin/bwrap)
    fi
    if [ ! -x /usr/sbin/mkfs.ext4 ]; then
        install -m 0755 "$CARRY/bin/mke2fs" /usr/sbin/mke2fs
        ln -sf mke2fs /usr/sbin/mkfs.ext4
        [ -e /etc/mke2fs.conf ] || cp "$CARRY/mke2fs.conf" /etc/mke2fs.conf
        missing+=(/usr/sbin/mke2fs)
    fi
    # libraries: only those the machine's loader cannot find, from a directory of their own
    local libdir=/usr/local/lib/execbox-carry
    mkdir -p "$libdir"
    local known; known="$(ldconfig -p | awk '{print $1}')"  # captured: grep -q would SIGPIPE a pipe
    for lib in "$CARRY"/lib/*; do
        local name; name="$(basename "$lib")"
        grep -qxF "$name" <<< "$known" || { cp "$lib" "$libdir/"; say "carried library: $name"; }
    done
    echo "$libdir" > /etc/ld.so.conf.d/zz-execbox-carry.conf
    ldconfig
    for bin in "${missing[@]}"; do
        say "carried: $bin"
        ldd "$bin" | grep -q "not found" && { ldd "$bin"; return 1; }
    done
    # pyseccomp beside the service interpreter's packages too: tests start processes that take
    # only src/ and that interpreter's site-packages (the unprivileged-host test)
    env -u PYTHONPATH python3 -c "import pyseccomp" 2>/dev/null || cp "$CARRY/py/pyseccomp.py" \
        "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/"
    [ -x /usr/bin/python3 ] || { ln -s "$(readlink -f "$(command -v python3)")" /usr/bin/python3; say "linked /usr/bin/python3"; }
    say "box interpreter: $(/usr/bin/python3 -V 2>&1) ($(readlink -f /usr/bin/python3))"
    say "service interpreter: $(command -v python3) $(python3 -V 2>&1); pytest $(python3 -m pytest --version 2>&1 | tail -1)"
    command -v nvidia-smi >/dev/null && nvidia-smi -L
    return 0
}

# Each phase runs in a fresh cgroup under the root, with memory, pids and cpu enabled there, as a
# root service (systemd's, or one in the root cgroup) has them. A lent machine starts the command in
# its own agent's group, where these are not delegated and the jail would run without cgroup limits
# (degraded, as `execbox doctor` says) - the first device run of 2026-11-26 showed exactly that.
in_cgroup() {  # NAME COMMAND...
    local cg="/sys/fs/cgroup/execbox-device-$1-$$"; shift  # fresh per run: a used one has controllers on
    [ "$(stat -fc %T /sys/fs/cgroup)" = cgroup2fs ] || { "$@"; return; }  # v1: as it is
    mkdir -p "$cg"
    bash -c 'echo $$ > "$1/cgroup.procs" && shift && exec "$@"' _ "$cg" "$@"
}
echo "+memory +pids +cpu" > /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null \
    || say "could not enable memory, pids and cpu in the root cgroup"

export PYTHONPATH="$REPO/src:$CARRY/py${PYTHONPATH:+:$PYTHONPATH}"
# execbox runs from src/ here, not installed: give it the entry points pyproject declares (the
# provider registry reads only those), as a dist-info of its own on the path
META="$(mktemp -d /tmp/execbox-meta.XXXXXX)"
python3 - "$REPO/pyproject.toml" "$META" <<'PY'
import os, sys, tomllib
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
d = os.path.join(sys.argv[2], "execbox-0+src.dist-info")
os.makedirs(d)
open(os.path.join(d, "METADATA"), "w").write("Metadata-Version: 2.1\nName: execbox\nVersion: 0+src\n")
with open(os.path.join(d, "entry_points.txt"), "w") as f:
    for group, entries in {"console_scripts": project.get("scripts", {}), **project.get("entry-points", {})}.items():
        f.write(f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in entries.items()) + "\n")
PY
export PYTHONPATH="$PYTHONPATH:$META"
export EXECBOX_VERIFY_NO_INSTALL=1 EXECBOX_VERIFY_PYTHON="$(command -v python3)" PYTHONUNBUFFERED=1
say "start $(date -u +%FT%TZ)"
setup 2>&1 | tee "$DEST/setup.txt"
[ "${PIPESTATUS[0]}" = 0 ] || { echo "SETUP FAILED"; exit 2; }
in_cgroup avail python3 -c "from execbox.providers.jail import JailProvider as J; print('jail availability:',
    J.availability())" 2>&1 | tee -a "$DEST/setup.txt"

phase() { [[ " ${PHASES:-1 2 3 4} " == *" $1 "* ]]; }
phase 1 && say "1. scaling" && for i in 1 2; do
    # shellcheck disable=SC2086 # word-split on purpose: a list of arguments
    in_cgroup "scaling-$i" timeout 110 python3 bench/bench_scaling.py ${SCALING_ARGS:---n 2000 --oneshot-n 200 --conc 1,2,4,8,16 --procs 8} 2>&1 \
        | grep -v '^figure:' | tee -a "$DEST/scaling.txt"
done
phase 2 && say "2. cgroup v2" && in_cgroup v2 timeout 150 bash scripts/verify_cgroup_v2.sh "$DEST/cgroup-v2-report.txt" | tail -8
phase 3 && say "3. GPU" && in_cgroup gpu timeout 90 bash scripts/verify_gpu.sh "$DEST/gpu-report.txt" | tail -40
if phase 4; then
    say "4. jail integration and attack tests"
    in_cgroup suite timeout 150 python3 -m pytest tests/integration/jail tests/security/jail -q -rs -p no:cacheprovider \
        > "$DEST/jail-suite.txt" 2>&1
    tail -25 "$DEST/jail-suite.txt"
fi
if phase 5; then
    say "5. torch in a jail box with gpu: all"
    # The machine has torch in a venv of the boxes' interpreter but no package index: the runtime is
    # made from that venv's site-packages (hard links when on one filesystem) in a jail dir of its own.
    site="$(python3 -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))' 2>/dev/null)"
    same="$(python3 -c 'import sys; print(sys.version_info[:2])')"
    if [ -z "$site" ]; then
        say "SKIP: the service interpreter has no torch"
    elif [ "$same" != "$(/usr/bin/python3 -c 'import sys; print(sys.version_info[:2])')" ]; then
        say "SKIP: torch's interpreter ($same) is not the boxes' /usr/bin/python3"
    else
        jd="$(df --output=target "$site" | tail -1)"
        export EXECBOX_JAIL_DIR="${jd%/}/execbox-jail-torch" EXECBOX_GPU_RUNTIME=torch
        in_cgroup torch python3 scripts/device_runtime_from_venv.py torch "$site" 2>&1 | tee "$DEST/torch-runtime.txt"
        in_cgroup torch timeout 300 bash scripts/verify_gpu.sh "$DEST/gpu-torch-report.txt" | tail -40
        unset EXECBOX_JAIL_DIR EXECBOX_GPU_RUNTIME
    fi
fi
say "done $(date -u +%FT%TZ)"
