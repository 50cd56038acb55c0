#!/usr/bin/env bash
# Verify GPU passthrough on a real NVIDIA host (issue 20, part 4): a CUDA program runs inside a
# jail box with `gpu: all` (driver API memory round trip; torch device + matrix product when the
# box's runtime has torch: EXECBOX_GPU_RUNTIME=<runtime made by `execbox runtime build`>), a box
# without the opt-in sees no device, and Docker runc/runsc boxes when the host is set up for them.
#
# Usage (as root):  scripts/verify_gpu.sh [REPORT_FILE]
# Prints PASS/FAIL/SKIP per check and a SUMMARY line; exit 0 only when nothing failed.
# REPORT_FILE (default: $OUT/gpu-report.txt when $OUT is set) gets the whole output for docs/gpu.md.
set -uo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
cd "$REPO"
REPORT="${1:-${OUT:+$OUT/gpu-report.txt}}"
if [ -n "$REPORT" ]; then exec > >(tee "$REPORT") 2>&1; fi
echo "== execbox GPU verification  $(date -u +%FT%TZ)  $(uname -srm)  commit $(git rev-parse --short HEAD 2>/dev/null)"
fatal() { echo "FAIL: $*"; echo "SUMMARY: FAIL (prerequisite)"; exit 2; }
[ "$(id -u)" = 0 ] || fatal "run as root"
ls /dev/nvidia[0-9]* >/dev/null 2>&1 || fatal "no NVIDIA device on this host (no /dev/nvidia[0-9]*)"
command -v nvidia-smi >/dev/null && nvidia-smi -L
ls -l /dev/nvidia* 2>&1 | head -20
# EXECBOX_VERIFY_NO_INSTALL / EXECBOX_VERIFY_PYTHON: as in verify_cgroup_v2.sh
if [ -z "${EXECBOX_VERIFY_NO_INSTALL:-}" ]; then
    bash scripts/setup/run/20-jail.sh || fatal "could not install the jail's Debian packages"
    if [ ! -x .venv/bin/python ]; then make install >/dev/null || fatal "make install failed"; fi
fi
"${EXECBOX_VERIFY_PYTHON:-.venv/bin/python}" scripts/verify_gpu.py
