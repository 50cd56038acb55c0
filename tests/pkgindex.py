"""A local package index for runtime-template and in-session install tests (no internet).

``publish_wheel`` builds a tiny pure-Python wheel and lists it in a PEP 503 simple index;
``publish_npm`` packs a tiny npm package (``package/package.json`` + ``index.js``) and writes
its registry document. Both go under a directory the fake internet serves at ``/pkgs/``
(tests/fakenet.py), so pip sees ``http://<host>/pkgs/simple`` and npm
``http://<host>/pkgs/npm``. Tarball URLs carry ``@@HOST@@``, which the server replaces by the
Host the client asked for, so the same index works by IP (host-side builds) and by name (boxes).
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import tarfile
import zipfile


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def publish_wheel(root: str, name: str, version: str, module_source: str, requires: tuple[str, ...] = ()) -> str:
    """Write ``<name>-<version>-py3-none-any.whl`` (module ``name``, ``Requires-Dist: <requires>``)
    and its simple-index page."""
    dist = f"{name}-{version}.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(f"Requires-Dist: {r}\n"
                                                                                  for r in requires)
    files = {
        f"{name}/__init__.py": module_source.encode(),
        f"{dist}/METADATA": meta.encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: execbox-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{p},{_record_hash(d)},{len(d)}\n" for p, d in files.items()) + f"{dist}/RECORD,,\n"
    files[f"{dist}/RECORD"] = record.encode()
    wheel = f"{name}-{version}-py3-none-any.whl"
    os.makedirs(os.path.join(root, "files"), exist_ok=True)
    path = os.path.join(root, "files", wheel)
    with zipfile.ZipFile(path, "w") as z:
        for p, d in files.items():
            z.writestr(p, d)
    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    page = os.path.join(root, "simple", name)
    os.makedirs(page, exist_ok=True)
    with open(os.path.join(page, "index.html"), "w", encoding="utf-8") as f:
        f.write(f'<!DOCTYPE html><html><body><a href="../../files/{wheel}#sha256={digest}">{wheel}</a>'
                "</body></html>\n")
    with open(os.path.join(root, "simple", "index.html"), "a", encoding="utf-8") as f:
        f.write(f'<a href="{name}/">{name}</a>\n')
    return path


def publish_npm(root: str, name: str, version: str, index_js: str, dependencies: dict[str, str] | None = None) -> str:
    """Write ``npm/-/<name>-<version>.tgz`` and the registry document ``npm/<name>``."""
    buf = io.BytesIO()
    deps = {"dependencies": dependencies} if dependencies else {}
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for fn, text in (("package.json", json.dumps({"name": name, "version": version, "main": "index.js",
                                                      **deps})),
                         ("index.js", index_js)):
            data = text.encode()
            info = tarfile.TarInfo(f"package/{fn}")
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    blob = buf.getvalue()
    os.makedirs(os.path.join(root, "npm", "-"), exist_ok=True)
    tgz = os.path.join(root, "npm", "-", f"{name}-{version}.tgz")
    with open(tgz, "wb") as f:
        f.write(blob)
    integrity = "sha512-" + base64.b64encode(hashlib.sha512(blob).digest()).decode()
    doc = {"name": name, "dist-tags": {"latest": version},
           "versions": {version: {"name": name, "version": version, "main": "index.js", **deps,
                                  "dist": {"tarball": f"http://@@HOST@@/pkgs/npm/-/{name}-{version}.tgz",
                                           "shasum": hashlib.sha1(blob).hexdigest(),  # noqa: S324 - npm's field
                                           "integrity": integrity}}}}
    with open(os.path.join(root, "npm", name), "w", encoding="utf-8") as f:
        json.dump(doc, f)
    return tgz
