#!/usr/bin/env bash
# Jail tests and bench/bench_jail.py use a runtime "sci" (numpy, pandas, matplotlib) to check that
# boxes mount a runtime read-only and pre-import heavy packages. Built once, cached in the jail dir
# (/var/lib/execbox/runtimes/sci as root); quick when present.
source "$(dirname "$0")/../lib.sh"
root="${EXECBOX_JAIL_DIR:-$([ "$(id -u)" = 0 ] && echo /var/lib/execbox || echo "$HOME/.cache/execbox")}"
# an older execbox wrote an unversioned runtime (manifest at the top); newer ones a "current" link.
# A version built before runtimes carried matplotlib's font cache (mpl-seed) gets a new version.
[ -f "$root/runtimes/sci/execbox-runtime.json" ] && exit 0
[ -f "$root/runtimes/sci/current/execbox-runtime.json" ] && [ -d "$root/runtimes/sci/current/mpl-seed" ] && exit 0
echo "setup: building jail runtime 'sci' (numpy pandas matplotlib)"
"$(dirname "$0")/../../../.venv/bin/execbox" runtime build sci --pip numpy --pip pandas --pip matplotlib
