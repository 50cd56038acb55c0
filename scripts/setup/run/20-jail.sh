#!/usr/bin/env bash
# The jail provider's host pieces: bubblewrap (namespaces), libseccomp (filter), iproute2
# (network-namespace test hosts), e2fsprogs + util-linux (loop-mounted workspace quota images).
source "$(dirname "$0")/../lib.sh"
apt_install bubblewrap libseccomp2 iproute2 e2fsprogs util-linux
