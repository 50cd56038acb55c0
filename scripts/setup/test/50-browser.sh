#!/usr/bin/env bash
# Browser tests (tests/browser) drive Debian's Chromium through the playwright Python package
# (a dev dependency). Playwright's own browser download is never used: the tests launch
# /usr/bin/chromium via executable_path. Quick when chromium is already installed.
source "$(dirname "$0")/../lib.sh"
apt_install chromium fonts-dejavu-core
