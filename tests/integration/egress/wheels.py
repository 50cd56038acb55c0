"""Wheels with any files for the fake package index (tests/pkgindex.py makes one-module wheels):
a ``.pth`` hook, a fake matplotlib, a small download that unpacks large."""

from __future__ import annotations

import base64
import hashlib
import os
import zipfile


def _digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def publish_files(root: str, name: str, version: str, files: dict[str, bytes], deflate: bool = False) -> str:
    """Write ``<name>-<version>-py3-none-any.whl`` holding ``files`` and its simple-index page."""
    dist = f"{name}-{version}.dist-info"
    files = {**files, f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
             f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: t\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    files[f"{dist}/RECORD"] = ("".join(f"{p},{_digest(d)},{len(d)}\n" for p, d in files.items())
                               + f"{dist}/RECORD,,\n").encode()
    whl = f"{name}-{version}-py3-none-any.whl"
    path = os.path.join(root, "files", whl)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED if deflate else zipfile.ZIP_STORED) as z:
        for name_in_zip, data in files.items():
            z.writestr(name_in_zip, data)
    with open(path, "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    os.makedirs(os.path.join(root, "simple", name), exist_ok=True)
    with open(os.path.join(root, "simple", name, "index.html"), "w", encoding="utf-8") as f:
        f.write(f'<a href="../../files/{whl}#sha256={sha}">{whl}</a>\n')
    return path
