#!/usr/bin/env bash
# Session and one-shot runs at c=1 and c=16 from two trees (9dd9da8 and HEAD), alternating, on one machine.
set -uo pipefail
PHASES=none bash scripts/verify_device.sh .devcarry "$OUT" > "$OUT/setup.txt" 2>&1
cg=/sys/fs/cgroup/execbox-abc-$$; mkdir -p $cg; echo $$ > $cg/cgroup.procs
for round in 1 2; do for t in old new; do
  echo "== $t round $round"
  (cd .devcarry/$t && PYTHONPATH="$PWD/src:$OLDPWD/.devcarry/py" timeout 60 python3 bench/bench_scaling.py --n 1500 --oneshot-n 96 --conc 1,16 2>&1 | grep -E "^ +(1|16) ")
done; done
