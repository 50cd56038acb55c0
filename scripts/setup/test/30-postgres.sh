#!/usr/bin/env bash
# PostgreSQL server binaries for the settings-store tests (tests/integration/store). The tests start
# their own private cluster (initdb + pg_ctl as user postgres on a free loopback port, deleted
# afterwards) and never touch a system cluster.
source "$(dirname "$0")/../lib.sh"
apt_install postgresql
ls /usr/lib/postgresql/*/bin/initdb >/dev/null
