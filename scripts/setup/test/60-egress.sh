#!/usr/bin/env bash
# Egress tests: curl (bash clients inside jail boxes use the host's /usr, bind-mounted read-only).
source "$(dirname "$0")/../lib.sh"
apt_install curl
