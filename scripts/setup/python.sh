#!/usr/bin/env bash
# Create the project venv with the resolved interpreter and install execbox with its extras.
source "$(dirname "$0")/lib.sh"
PYTHON="$1"; VENV="$2"
if ! "$PYTHON" -c 'import sys; assert sys.version_info >= (3, 11)' 2>/dev/null; then
    echo "setup: $PYTHON is older than Python 3.11; trying Debian's python3" >&2
    PYTHON=/usr/bin/python3
fi
if ! "$PYTHON" -m venv --help >/dev/null 2>&1 || ! "$PYTHON" -c 'import ensurepip' 2>/dev/null; then
    apt_install python3-venv
fi
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q -e '.[dev,postgres]'
