#!/usr/bin/env bash
# What every box needs on the host: node for JavaScript, bash, procps.
source "$(dirname "$0")/../lib.sh"
command -v node >/dev/null 2>&1 || apt_install nodejs
