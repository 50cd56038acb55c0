#!/usr/bin/env bash
# Gather, on a Debian host where `make test` has run, the jail's host pieces that a bare machine
# without network or apt lacks (bubblewrap, mke2fs and the libraries they load, the pyseccomp
# binding), into one folder that scripts/verify_device.sh installs from there.
#
# Usage:  scripts/device_carry.sh [DIR]     (default .devcarry; keep it out of git: .git/info/exclude)
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
DIR="${1:-$REPO/.devcarry}"
rm -rf "$DIR"
mkdir -p "$DIR/bin" "$DIR/lib" "$DIR/py"
cp /usr/bin/bwrap /usr/sbin/mke2fs "$DIR/bin/"
cp /etc/mke2fs.conf "$DIR/"
# libseccomp for pyseccomp and every library either binary loads; only those the target lacks are
# installed there
cp -L /lib/x86_64-linux-gnu/libseccomp.so.2 "$DIR/lib/"
for bin in /usr/bin/bwrap /usr/sbin/mke2fs; do
    ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | while read -r lib; do
        case "$(basename "$lib")" in libc.so.*|ld-linux*) continue ;; esac
        cp -L "$lib" "$DIR/lib/"
    done
done
PYSECCOMP="$("$REPO/.venv/bin/python" -c 'import pyseccomp; print(pyseccomp.__file__)')"
cp "$PYSECCOMP" "$DIR/py/"
echo "device carry: $DIR ($(du -sh "$DIR" | cut -f1))"
ls -R "$DIR"
