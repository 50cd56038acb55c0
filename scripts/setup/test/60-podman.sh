#!/usr/bin/env bash
# podman from Debian, for tests/integration/kubernetes/test_podman.py: `podman kube play` of the
# pod spec the kubernetes provider generates (a real container runtime reading the real spec).
# Idempotent and quick when podman is already installed.
source "$(dirname "$0")/../lib.sh"

apt_install podman catatonit
