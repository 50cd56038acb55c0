"""A runtime template as a Docker image, for the docker provider: ``execbox/runtime-<name>:v<N>``.

The image is the worker image (``execbox/python:latest``, `execbox image build`) plus the very
same template directory the jail mounts, copied to ``/opt/execbox/runtime``. The agent runs the
image's ``/usr/bin/python3`` (the venv was made from the same Debian interpreter); a ``.pth`` file
in its dist-packages puts the template's site-packages on ``sys.path``, and the image's
environment points ``NODE_PATH`` at its ``node_modules``. Built with the docker SDK from an
in-memory context; no registry.

The image is labelled with a digest of the version's manifest (which holds its build time), and
``image_for`` refuses an image whose label names another manifest: one left by an earlier template
of the same name or built from another jail directory on the same engine. ``runtime rm`` removes
the images of the versions it removes (best effort: ``remove_images``).
"""

from __future__ import annotations

import glob
import hashlib
import io
import logging
import os
import re
import tarfile
from typing import Any

from ..errors import InstanceCreationError
from .images import DEFAULT_IMAGE
from .runtime import MANIFEST, RUNTIME_MOUNT, Runtime, RuntimeNotUsable

log = logging.getLogger(__name__)
REPOSITORY = "execbox/runtime-{name}"
LABEL = "execbox.runtime"
MANIFEST_LABEL = "execbox.runtime.manifest"
PTH = "/usr/lib/python3/dist-packages/execbox-runtime.pth"
_COMPONENT = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*")  # Docker's path component grammar


def check_image_name(name: str) -> str:
    """SB002 unless ``execbox/runtime-<name>`` is a valid Docker repository (execbox allows names
    Docker does not: a trailing '.' or '-', '..', '.-'); checked before a ``--docker`` build starts."""
    if not _COMPONENT.fullmatch(f"runtime-{name}"):
        raise RuntimeNotUsable(f"runtime name {name!r} cannot name a Docker image (execbox/runtime-{name}); with "
                               "--docker use letters and digits separated by single '.', '_' or '-' (no "
                               "trailing or doubled separators)", details={"field": "name", "value": name[:80]})
    return name


def manifest_digest(directory: str | None) -> str | None:
    """A digest of the manifest of the version in ``directory`` (None: none there)."""
    try:
        with open(os.path.join(directory or "", MANIFEST), "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()[:32]
    except OSError:
        return None


def image_name(name: str, version: str) -> str:
    return f"{REPOSITORY.format(name=name)}:{version}"


def image_for(client: Any, r: Runtime) -> str:
    """The image of runtime ``r`` (SB002 when it was built without ``--docker``)."""
    import docker.errors

    tag = image_name(r.name, r.version)
    try:
        image = client.images.get(tag)
    except docker.errors.ImageNotFound:
        raise RuntimeNotUsable(f"runtime {r.ref} has no Docker image; build it with "
                               f"`execbox runtime build {r.name} ... --docker`",
                               details={"field": "runtime", "value": r.ref, "image": tag}) from None
    built_from = (image.labels or {}).get(MANIFEST_LABEL)  # none: an image made before the label
    if built_from and built_from != manifest_digest(r.host_dir):
        raise RuntimeNotUsable(f"runtime {r.ref} has no Docker image of its own: {tag} was built from other "
                               f"content (an earlier template named {r.name!r}, or another jail directory); "
                               f"build a new version with `execbox runtime build {r.name} ... --docker`",
                               details={"field": "runtime", "value": r.ref, "image": tag})
    return tag


def _context(directory: str, site: str | None, env: dict[str, str], label: str, base: str,
             digest: str | None = None) -> io.BytesIO:
    lines = [f"FROM {base}", f"COPY rt/ {RUNTIME_MOUNT}/"]
    files = {}
    if site:  # the agent runs the image's python3: make it see the template's packages
        files["execbox-runtime.pth"] = f"{site}\n"
        lines.append(f"COPY execbox-runtime.pth {PTH}")
    lines += [f'ENV {k}="{v}"' for k, v in sorted(env.items())]
    lines += [f'LABEL {LABEL}="{label}"'] + ([f'LABEL {MANIFEST_LABEL}="{digest}"'] if digest else [])
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
    ctx = _context(directory, site, env, f"{name}:{tag}", base, manifest_digest(directory))
    try:
        client.images.build(fileobj=ctx, custom_context=True, tag=tag, rm=True, forcerm=True, pull=False)
    except docker.errors.DockerException as e:  # BuildError, APIError, an invalid tag
        raise InstanceCreationError(f"building the Docker image {tag} failed: {e}", details={"image": tag}) from e
    return tag


def retag(client: Any, src: str, dest: str) -> None:
    repo, _, version = dest.partition(":")
    client.images.get(src).tag(repo, version)
    client.images.remove(src)


def remove_images(name: str, removed: list[tuple[str, str | None]]) -> list[str]:
    """Best effort: remove ``execbox/runtime-<name>:<version>`` for each (version, manifest digest)
    that ``runtime rm`` removed, when a Docker engine answers. An image labelled with another
    manifest is another template's and stays; one a container still uses stays (logged). The tags
    removed."""
    if not removed:
        return []
    try:
        import docker.errors

        from ..providers.docker_config import docker_client

        client = docker_client(timeout=10)
    except Exception as e:  # noqa: BLE001 - no SDK or no engine: nothing of ours can be there
        log.debug("runtime rm: no Docker engine to remove images from (%s)", e)
        return []
    gone = []
    try:
        for version, digest in removed:
            tag = image_name(name, version)
            try:
                image = client.images.get(tag)
                built_from = (image.labels or {}).get(MANIFEST_LABEL)
                if built_from and digest and built_from != digest:
                    continue
                client.images.remove(tag)
                gone.append(tag)
            except docker.errors.ImageNotFound:
                continue
            except docker.errors.DockerException as e:
                log.warning("runtime rm: could not remove the image %s: %s", tag, e)
    finally:
        client.close()
    return gone
