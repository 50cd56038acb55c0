"""Worker images built without a registry: debootstrap a Debian rootfs, `docker import` it.

Every image is keyed by a hash of its inputs (suite, mirror, package list, layout version). The
image carries that hash as a label, and the rootfs tarball is kept under the cache directory, so
a second build with unchanged inputs only checks a label (or re-imports the tarball) in seconds.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import InstanceCreationError, InvalidConfigError

CACHE_DIR = os.environ.get("EXECBOX_IMAGE_CACHE", "/var/cache/execbox/images")
SUITE = "bookworm"
LAYOUT_VERSION = "4"  # bump when the rootfs customisation below changes
HASH_LABEL = "execbox.image.hash"
FLAVOR_LABEL = "execbox.image.flavor"
SANDBOX_UID = 1000
WORKSPACE = "/workspace"
HOME_ALIAS = "/home/user"
"""A symlink to the workspace in every box (image and jail): E2B's home, where its programs write."""
AGENT_ROOT = "/opt/execbox"
PYTHON = "/usr/bin/python3"
MPL_SEED = f"{AGENT_ROOT}/mpl-seed"
"""matplotlib's font cache, built into the image; each box's agent copies it into its own empty
MPLCONFIGDIR (agent/runners.py ``seed_matplotlib_cache``) instead of scanning the fonts again."""

BASE_PACKAGES = ["python3", "nodejs"]
FLAVORS: dict[str, list[str]] = {
    "python": [*BASE_PACKAGES, "python3-numpy", "python3-pandas", "python3-matplotlib"],
    "node": list(BASE_PACKAGES),
}
"""Every flavor has python3 (the agent) and node; ``python`` adds the data-science runtime."""

PURGE = ["binutils", "binutils-common", "binutils-x86-64-linux-gnu", "libbinutils", "cpp", "cpp-12", "g++",
         "g++-12", "gcc", "gcc-12", "libgcc-12-dev", "libstdc++-12-dev", "libboost-dev", "libboost1.74-dev",
         "libc6-dev", "libcrypt-dev", "libexpat1-dev", "libnsl-dev", "libopenblas-dev",
         "libopenblas-pthread-dev", "libpython3-all-dev", "libpython3-dev", "libpython3.11-dev",
         "libtirpc-dev", "libxsimd-dev", "linux-libc-dev", "python3-all-dev", "python3-dev", "python3.11-dev",
         "zlib1g-dev", "python3-pythran"]
"""Build toolchain that Debian's dependency chain drags in (fonttools -> scipy -> pythran -> g++):
removed from the image with ``dpkg --force-depends``; nothing at runtime needs a compiler."""

DEFAULT_IMAGE = "execbox/python:latest"

ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "HOME": WORKSPACE,
    "TMPDIR": "/tmp",
    "MPLBACKEND": "Agg",
    "MPLCONFIGDIR": "/tmp",
    "EXECBOX_MPL_SEED": MPL_SEED,
    "PYTHONDONTWRITEBYTECODE": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
}

Progress = Callable[[str, float | None], None]
"""Called with (what is happening, fraction done or None)."""


@dataclass(frozen=True)
class ImageSpec:
    flavor: str
    packages: tuple[str, ...]
    mirror: str
    suite: str = SUITE

    @property
    def repository(self) -> str:
        return f"execbox/{self.flavor}"

    @property
    def input_hash(self) -> str:
        blob = json.dumps({"flavor": self.flavor, "packages": sorted(self.packages), "mirror": self.mirror,
                           "suite": self.suite, "layout": LAYOUT_VERSION, "purge": PURGE, "env": ENV,
                           "uid": SANDBOX_UID},
                          sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    @property
    def tag(self) -> str:
        return f"{self.repository}:{self.input_hash}"


def image_for(flavor: str, mirror: str | None = None) -> ImageSpec:
    if flavor not in FLAVORS:
        raise InvalidConfigError(f"unknown image flavor {flavor!r}; choose one of {', '.join(FLAVORS)}",
                                 details={"field": "flavor", "value": flavor})
    return ImageSpec(flavor, tuple(FLAVORS[flavor]), mirror or debian_mirror())


def debian_mirror() -> str:
    """The host's Debian mirror (deb822 or one-line sources), else deb.debian.org."""
    candidates = ["/etc/apt/sources.list"]
    d = "/etc/apt/sources.list.d"
    if os.path.isdir(d):
        candidates += [os.path.join(d, f) for f in sorted(os.listdir(d))]
    for path in candidates:
        try:
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
        except OSError:
            continue
        for m in re.finditer(r"^URIs:\s*(\S+)|^deb\s+(?:\[[^\]]*\]\s+)?(\S+)", text, re.MULTILINE):
            uri = m.group(1) or m.group(2)
            if "security" not in uri:
                return uri
    return "http://deb.debian.org/debian"


def cached_image(client: Any, spec: ImageSpec) -> Any | None:
    """The image for ``spec`` if it is already built with the same input hash."""
    import docker.errors

    try:
        image = client.images.get(f"{spec.repository}:latest")
    except docker.errors.ImageNotFound:
        return None
    labels = (image.attrs.get("Config") or {}).get("Labels") or {}
    return image if labels.get(HASH_LABEL) == spec.input_hash else None


def build_image(client: Any, spec: ImageSpec, *, progress: Progress | None = None, force: bool = False,
                cache_dir: str = CACHE_DIR) -> tuple[str, bool]:
    """Build (or find) the image; return (``repository:latest``, built_now)."""
    say = progress or (lambda _msg, _frac: None)
    name = f"{spec.repository}:latest"
    if not force and cached_image(client, spec) is not None:
        say(f"{name} is up to date ({spec.input_hash})", 1.0)
        return name, False
    os.makedirs(cache_dir, exist_ok=True)
    tarball = os.path.join(cache_dir, f"{spec.flavor}-{spec.input_hash}.tar")
    if force or not os.path.exists(tarball):
        _build_rootfs_tarball(spec, tarball, cache_dir, say)
    say(f"importing {os.path.basename(tarball)} into docker", 0.92)
    _import(client, spec, tarball)
    prune_stale(client, spec, cache_dir)
    say(f"{name} built ({spec.input_hash})", 1.0)
    return name, True


def prune_stale(client: Any, spec: ImageSpec, cache_dir: str = CACHE_DIR) -> None:
    """Drop tarballs and image tags of this flavor built from older inputs (in-use images stay)."""
    for entry in os.listdir(cache_dir):
        if entry.startswith(f"{spec.flavor}-") and entry.endswith(".tar") and spec.input_hash not in entry:
            os.unlink(os.path.join(cache_dir, entry))
    for image in client.images.list(name=spec.repository):
        if not any(t in (spec.tag, f"{spec.repository}:latest") for t in image.tags):
            for tag in image.tags:
                try:
                    client.images.remove(tag)
                except Exception:  # noqa: BLE001 - still used by a container: keep it
                    pass


def _build_rootfs_tarball(spec: ImageSpec, tarball: str, cache_dir: str, say: Progress) -> None:
    debootstrap = shutil.which("debootstrap")
    if not debootstrap:
        raise InstanceCreationError("debootstrap is not installed (apt-get install debootstrap); it builds "
                                    "the worker rootfs without a registry",
                                    details={"missing": "debootstrap"})
    debs = os.path.join(cache_dir, "debs")
    os.makedirs(debs, exist_ok=True)
    work = tempfile.mkdtemp(prefix=f"rootfs-{spec.flavor}-", dir=cache_dir)
    rootfs = os.path.join(work, "rootfs")
    try:
        argv = [debootstrap, "--variant=minbase", f"--include={','.join(spec.packages)}",
                f"--cache-dir={debs}", spec.suite, rootfs, spec.mirror]
        _run_debootstrap(argv, say)
        say("removing the build toolchain pulled in by dependencies", 0.83)
        purge_toolchain(rootfs)
        say("customising rootfs (sandbox user, mount points, trimming)", 0.85)
        customise_rootfs(rootfs)
        if "python3-matplotlib" in spec.packages:
            say("building matplotlib's font cache", 0.87)
            build_font_cache(rootfs)
        say("writing rootfs tarball", 0.88)
        tmp = tarball + ".part"
        with tarfile.open(tmp, "w") as tar:
            tar.add(rootfs, arcname=".")
        os.replace(tmp, tarball)
    finally:
        shutil.rmtree(work, ignore_errors=True)


_PHASES = [("Retrieving", 0.05, 0.35), ("Validating", 0.35, 0.40), ("Extracting", 0.40, 0.50),
           ("Unpacking", 0.50, 0.65), ("Configuring", 0.65, 0.80)]


def _run_debootstrap(argv: list[str], say: Progress) -> None:
    say(f"debootstrap {argv[-3]} from {argv[-1]}", 0.02)
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # noqa: S603
    tail: list[str] = []
    counts: dict[str, int] = {}
    assert proc.stdout is not None
    for line in proc.stdout:
        line = line.rstrip()
        tail = (tail + [line])[-20:]
        for word, lo, hi in _PHASES:
            if line.startswith(f"I: {word}"):
                counts[word] = counts.get(word, 0) + 1
                frac = lo + (hi - lo) * (1 - 1 / (1 + counts[word] / 40))
                say(line[3:], frac)
                break
    if proc.wait() != 0:
        raise InstanceCreationError("debootstrap failed:\n" + "\n".join(tail),
                                    details={"exit_code": proc.returncode})


def installed_packages(rootfs: str) -> set[str]:
    with open(os.path.join(rootfs, "var/lib/dpkg/status"), encoding="utf-8") as fh:
        return set(re.findall(r"^Package: (\S+)$", fh.read(), re.MULTILINE))


def purge_toolchain(rootfs: str) -> None:
    victims = sorted(installed_packages(rootfs) & set(PURGE))
    if not victims:
        return
    proc = subprocess.run(["chroot", rootfs, "/usr/bin/dpkg", "--purge", "--force-depends", *victims],  # noqa: S603,S607
                          capture_output=True, text=True, env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
                                                               "DEBIAN_FRONTEND": "noninteractive"})
    if proc.returncode != 0:
        raise InstanceCreationError(f"removing the toolchain from the rootfs failed: {proc.stderr[-1500:]}")


def customise_rootfs(rootfs: str) -> None:
    """Add the unprivileged sandbox user and the mount points; drop caches and docs."""
    with open(os.path.join(rootfs, "etc/passwd"), "a", encoding="utf-8") as fh:
        fh.write(f"sandbox:x:{SANDBOX_UID}:{SANDBOX_UID}:execbox sandbox:{WORKSPACE}:/bin/bash\n")
    with open(os.path.join(rootfs, "etc/group"), "a", encoding="utf-8") as fh:
        fh.write(f"sandbox:x:{SANDBOX_UID}:\n")
    for d in (WORKSPACE.lstrip("/"), f"{AGENT_ROOT.lstrip('/')}/execbox_agent"):
        os.makedirs(os.path.join(rootfs, d), exist_ok=True)
    os.chown(os.path.join(rootfs, WORKSPACE.lstrip("/")), SANDBOX_UID, SANDBOX_UID)
    os.chmod(os.path.join(rootfs, WORKSPACE.lstrip("/")), 0o750)
    os.makedirs(os.path.join(rootfs, "home"), exist_ok=True)  # /home/user: the workspace
    alias = os.path.join(rootfs, HOME_ALIAS.lstrip("/"))
    if not os.path.lexists(alias):
        os.symlink(WORKSPACE, alias)
    for d in ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc", "usr/share/man",
              "usr/share/info", "usr/share/locale"):
        path = os.path.join(rootfs, d)
        if os.path.isdir(path):
            for entry in os.listdir(path):
                full = os.path.join(path, entry)
                if os.path.isdir(full) and not os.path.islink(full):
                    shutil.rmtree(full, ignore_errors=True)
                elif entry not in ("lock", "partial"):
                    os.unlink(full)


def make_font_list(argv: list[str], seed: str, env: dict[str, str]) -> tuple[subprocess.CompletedProcess, list[str]]:
    """Run ``argv`` (an interpreter that imports matplotlib.font_manager, its MPLCONFIGDIR in
    ``env`` pointing at ``seed``) and keep only the ``fontlist-*.json`` it wrote in ``seed`` (a
    host path): the lock files and the like go. Returns the process and the lists' names.
    Shared by the image build (here) and runtime templates (runtime_build.font_cache)."""
    os.makedirs(seed, exist_ok=True)
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=seed, env=env)  # noqa: S603
    made = [n for n in os.listdir(seed) if n.startswith("fontlist-") and n.endswith(".json")]
    for name in os.listdir(seed):
        if name not in made:
            os.unlink(os.path.join(seed, name))
    return proc, made


def build_font_cache(rootfs: str) -> None:
    """matplotlib's font list, made inside the rootfs (so its font paths are the image's) into
    ``MPL_SEED``, read-only."""
    seed = os.path.join(rootfs, MPL_SEED.lstrip("/"))
    proc, made = make_font_list(["chroot", rootfs, PYTHON, "-I", "-c", "import matplotlib.font_manager"], seed,
                                {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/tmp", "MPLBACKEND": "Agg",
                                 "MPLCONFIGDIR": MPL_SEED})
    if proc.returncode != 0 or not made:
        raise InstanceCreationError(f"building matplotlib's font cache in the rootfs failed: {proc.stderr[-1500:]}")
    for name in made:
        os.chmod(os.path.join(seed, name), 0o644)
    os.chmod(seed, 0o755)


def _import(client: Any, spec: ImageSpec, tarball: str) -> None:
    changes = [f"ENV {k}={v}" for k, v in ENV.items()]
    changes += [f"USER {SANDBOX_UID}:{SANDBOX_UID}", f"WORKDIR {WORKSPACE}",
                f'LABEL {HASH_LABEL}="{spec.input_hash}" {FLAVOR_LABEL}="{spec.flavor}"',
                f'CMD ["{PYTHON}"]']
    client.api.import_image_from_file(tarball, repository=spec.repository, tag=spec.input_hash,
                                      changes=changes)
    client.api.tag(spec.tag, spec.repository, "latest")
