#!/usr/bin/env bash
# Device: set-up via verify_device.sh (no phases), then the levers A/B and bench_scaling from a clean
# tree of HEAD (.devcarry/clean), each in a fresh cgroup under the root.
set -uo pipefail
C="$PWD/.devcarry/clean"
PHASES=none bash scripts/verify_device.sh .devcarry "$OUT" > "$OUT/setup.txt" 2>&1; tail -5 "$OUT/setup.txt"
export PYTHONPATH="$C/src:$PWD/.devcarry/py" PYTHONUNBUFFERED=1
cg=/sys/fs/cgroup/execbox-ab; mkdir -p $cg; echo $$ > $cg/cgroup.procs
echo "load $(cat /proc/loadavg)"; git log -1 --format='commit %h' 2>/dev/null
timeout ${AB_T:-150} python3 .devcarry/ab_levers.py ${AB_ARGS:-1,8,16 3 3000} 2>&1 | tee "$OUT/ab-levers.txt"
echo "load $(cat /proc/loadavg)"
cd "$C" && timeout ${SC_T:-130} python3 bench/bench_scaling.py ${SCALING_ARGS:---n 3000 --oneshot-n 64 --conc 1,2,4,8,16 --procs 16} 2>&1 \
  | grep -v '^figure:' | tee "$OUT/scaling.txt"
echo "done load $(cat /proc/loadavg)"
