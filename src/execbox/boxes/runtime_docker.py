"""A runtime template as a Docker image, for the docker provider: ``execbox/runtime-<name>:v<N>``.

The image is the worker image (``execbox/python:latest``, `execbox image build`) plus the very
same template directory the jail mounts, copied to ``/opt/execbox/runtime``. The agent runs the
image's ``/usr/bin/python3`` (the venv was made from the same Debian interpreter); a ``.pth`` file
in its dist-packages puts the template's site-packages on ``sys.path``, and the image's
environment points ``NODE_PATH`` at its ``node_modules``. Built with the docker SDK from an
in-memory context; no registry.
"""

from __future__ import annotations

import glob
import io
import os
import tarfile
from typing import Any

from ..errors import InstanceCreationError
from .images import DEFAULT_IMAGE
from .runtime import RUNTIME_MOUNT, Runtime, RuntimeNotUsable

REPOSITORY = "execbox/runtime-{name}"
LABEL = "execbox.runtime"
PTH = "/usr/lib/python3/dist-packages/execbox-runtime.pth"


def image_name(name: str, version: str) -> str:
    return f"{REPOSITORY.format(name=name)}:{version}"


def image_for(client: Any, r: Runtime) -> str:
    """The image of runtime ``r`` (SB002 when it was built without ``--docker``)."""
    import docker.errors

    tag = image_name(r.name, r.version)
    try:
        client.images.get(tag)
    except docker.errors.ImageNotFound:
        raise RuntimeNotUsable(f"runtime {r.ref} has no Docker image; build it with "
                               f"`execbox runtime build {r.name} ... --docker`",
                               details={"field": "runtime", "value": r.ref, "image": tag}) from None
    return tag


def _context(directory: str, site: str | None, env: dict[str, str], label: str, base: str) -> io.BytesIO:
    lines = [f"FROM {base}", f"COPY rt/ {RUNTIME_MOUNT}/"]
    files = {}
    if site:  # the agent runs the image's python3: make it see the template's packages
        files["execbox-runtime.pth"] = f"{site}\n"
        lines.append(f"COPY execbox-runtime.pth {PTH}")
    lines += [f'ENV {k}="{v}"' for k, v in sorted(env.items())]
    lines += [f'LABEL {LABEL}="{label}"']
    files["Dockerfile"] = "\n".join(lines) + "\n"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for fn, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(fn)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
        tar.add(directory, arcname="rt", filter=lambda t: None if t.name.endswith(".npm-cache") else t)
    buf.seek(0)
    return buf


def build_image(client: Any, directory: str, name: str, tag: str, env: dict[str, str],
                base: str = DEFAULT_IMAGE) -> str:
    """Build ``tag`` from the template in ``directory``; returns the tag."""
    import docker.errors

    try:
        client.images.get(base)
    except docker.errors.ImageNotFound:
        raise RuntimeNotUsable(f"the worker image {base} is missing; build it with `execbox image build python`",
                               details={"image": base}) from None
    sites = sorted(glob.glob(os.path.join(directory, "lib", "python3*", "site-packages")))
    site = f"{RUNTIME_MOUNT}/{os.path.relpath(sites[0], directory)}" if sites else None
    ctx = _context(directory, site, env, f"{name}:{tag}", base)
    try:
        client.images.build(fileobj=ctx, custom_context=True, tag=tag, rm=True, forcerm=True, pull=False)
    except (docker.errors.BuildError, docker.errors.APIError) as e:
        raise InstanceCreationError(f"building the Docker image {tag} failed: {e}", details={"image": tag}) from e
    return tag


def retag(client: Any, src: str, dest: str) -> None:
    repo, _, version = dest.partition(":")
    client.images.get(src).tag(repo, version)
    client.images.remove(src)
