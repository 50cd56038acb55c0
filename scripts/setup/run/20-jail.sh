#!/usr/bin/env bash
# The jail provider's host pieces: bubblewrap (namespaces), libseccomp (filter), iproute2
# (network-namespace test hosts; box network namespaces), iptables (the rules inside a box's namespace
# that make the egress gateway its only way out), e2fsprogs + util-linux (workspace quota images).
source "$(dirname "$0")/../lib.sh"
apt_install bubblewrap libseccomp2 iproute2 iptables e2fsprogs util-linux
