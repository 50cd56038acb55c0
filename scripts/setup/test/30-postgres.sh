#!/usr/bin/env bash
# PostgreSQL server binaries for the settings-store tests (tests/integration/store). The tests start
# their own private cluster (initdb + pg_ctl on a free loopback port) and never touch a system one.
source "$(dirname "$0")/../lib.sh"
apt_install postgresql
# The Debian package starts a system cluster; the tests do not need it.
if command -v pg_lsclusters >/dev/null 2>&1 && [ -n "$(pg_lsclusters -h 2>/dev/null)" ]; then
    command -v systemctl >/dev/null 2>&1 && systemctl is-system-running >/dev/null 2>&1 \
        && systemctl disable --now postgresql >/dev/null 2>&1 || true
fi
ls /usr/lib/postgresql/*/bin/initdb >/dev/null
