#!/usr/bin/env bash
# npm, for the E2B JavaScript SDK quickstart test (tests/integration/e2b_compat/test_node_sdk.py
# installs the pinned `e2b` and `@e2b/code-interpreter` packages into a temporary directory).
source "$(dirname "$0")/../lib.sh"
command -v npm >/dev/null 2>&1 || apt_install npm
