#!/usr/bin/env bash
# Verify the jail's cgroup v2 path on a real cgroup v2 host (issue 20, part 3):
# memory limit + OOM detection (SB006), pids limit, CPU bandwidth and kill-all, in two set-ups:
#   1. root, boxes created beneath execbox's own cgroup (a plain root service);
#   2. a delegated subtree, systemd-style: the run sits in a cgroup of its own whose controllers
#      were delegated to it (systemd-run --scope -p Delegate=yes when systemd is pid 1, else the
#      same layout made by hand under /sys/fs/cgroup), and execbox may touch nothing above it.
# Each set-up runs tests/integration/jail/test_cgroup_v2_host.py, which skips on v1 hosts.
#
# Usage (as root, from anywhere):  scripts/verify_cgroup_v2.sh [REPORT_FILE]
# Prints a PASS/FAIL line per set-up and a summary; exit status 0 only if everything passed.
# REPORT_FILE (default: $OUT/cgroup-v2-report.txt when $OUT is set) receives the whole output,
# to be pasted into docs/cgroup-v2.md.
set -uo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
cd "$REPO"
REPORT="${1:-${OUT:+$OUT/cgroup-v2-report.txt}}"
if [ -n "$REPORT" ]; then exec > >(tee "$REPORT") 2>&1; fi

echo "== execbox cgroup v2 verification  $(date -u +%FT%TZ)  $(uname -srm)"
echo "== commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
fatal() { echo "FAIL: $*"; echo "SUMMARY: FAIL (prerequisite)"; exit 2; }

[ "$(id -u)" = 0 ] || fatal "run as root (set-up 2 creates cgroups under /sys/fs/cgroup)"
fstype="$(stat -fc %T /sys/fs/cgroup 2>/dev/null)"
[ "$fstype" = cgroup2fs ] || fatal "/sys/fs/cgroup is '$fstype', not a cgroup v2 (unified) hierarchy"
echo "root controllers: $(cat /sys/fs/cgroup/cgroup.controllers)"
for c in memory pids cpu; do
    grep -qw "$c" /sys/fs/cgroup/cgroup.controllers || fatal "controller $c is not available on this host"
done
[ -e /sys/fs/cgroup/cgroup.kill ] || ls /sys/fs/cgroup/*/cgroup.kill >/dev/null 2>&1 \
    || echo "note: no cgroup.kill (Linux < 5.14): kill-all falls back to signalling every listed pid"

# Host pieces (bubblewrap, libseccomp, e2fsprogs) and the venv, as `make test` would install them.
# EXECBOX_VERIFY_NO_INSTALL=1 skips that where they are already in place without apt or network
# (scripts/verify_device.sh); EXECBOX_VERIFY_PYTHON then names an interpreter that has pytest.
PY="${EXECBOX_VERIFY_PYTHON:-.venv/bin/python}"
if [ -z "${EXECBOX_VERIFY_NO_INSTALL:-}" ]; then
    bash scripts/setup/run/10-base.sh >/dev/null 2>&1 || true
    bash scripts/setup/run/20-jail.sh || fatal "could not install the jail's Debian packages"
    if [ ! -x .venv/bin/pytest ]; then make install >/dev/null || fatal "make install failed"; fi
fi
PYTEST=("$PY" -m pytest tests/integration/jail/test_cgroup_v2_host.py -v -s -rs -p no:cacheprovider)

declare -A RESULT
run_setup() {  # name, command...
    local name="$1"; shift
    echo
    echo "== set-up: $name"
    local log; log="$(mktemp)"
    "$@" 2>&1 | tee "$log"
    local rc=${PIPESTATUS[0]}
    if [ "$rc" = 0 ] && grep -qE "[0-9]+ passed" "$log" && ! grep -qE "skipped|SKIPPED" "$log"; then
        RESULT[$name]=PASS
    else
        RESULT[$name]="FAIL (pytest exit $rc$(grep -q SKIPPED "$log" && echo ', tests skipped'))"
    fi
    rm -f "$log"
}

# 1. root, in whatever cgroup this shell is in
echo "own cgroup: $(cat /proc/self/cgroup)"
run_setup "root" env EXECBOX_JAIL_DIR=/var/lib/execbox "${PYTEST[@]}"

# 2. delegated subtree
DELEG=""
if [ "$(cat /proc/1/comm 2>/dev/null)" = systemd ] && command -v systemd-run >/dev/null; then
    run_setup "delegated (systemd-run --scope -p Delegate=yes)" \
        systemd-run --scope --quiet -p Delegate=yes --unit "execbox-verify-$$" -- "${PYTEST[@]}"
else
    DELEG="/sys/fs/cgroup/execbox-verify-$$.scope"
    for c in memory pids cpu; do echo "+$c" > /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || true; done
    mkdir "$DELEG" || fatal "cannot create $DELEG"
    run_setup "delegated (hand-made $DELEG)" \
        bash -c 'echo $$ > "$1/cgroup.procs" && shift && exec "$@"' _ "$DELEG" "${PYTEST[@]}"
    # execbox moved itself into <scope>/execbox-service; remove what is left once it exited
    for d in "$DELEG"/execbox/* "$DELEG"/execbox "$DELEG"/execbox-service "$DELEG"; do
        [ -d "$d" ] && rmdir "$d" 2>/dev/null
    done
fi

echo
echo "== results"
status=0
for name in "${!RESULT[@]}"; do
    echo "${RESULT[$name]%% *}: $name ${RESULT[$name]#PASS}"
    [ "${RESULT[$name]}" = PASS ] || status=1
done
echo "SUMMARY: $([ $status = 0 ] && echo PASS || echo FAIL)"
exit $status
