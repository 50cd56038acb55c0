"""A box's /workspace with a size quota the kernel enforces: a loop-mounted ext4 image.

Only root can loop-mount; other hosts fall back to bubblewrap's ``--size`` tmpfs (``Workspace``
decides). An image is sparse (costs only what is written), disk-backed (it does not eat
the box's memory limit the way a tmpfs would), and writing past it fails with ENOSPC, which
the agent reports as HTTP 507 with code SB002. An image is a sparse copy of an empty template.
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
import subprocess
import threading
import time

from . import loopdev
from .runtime import jail_dir

log = logging.getLogger("execbox.boxes.quota")

MKFS = "/usr/sbin/mkfs.ext4"
MOUNT = "/usr/bin/mount"
UMOUNT = "/usr/bin/umount"
RELEASE_WAIT_SECONDS = 30.0
"""How long a box start waits for the previous box's loop device on the same workspace image to be
released. A lazy unmount's loop device lingers until the old box's last process is gone; after a
restart (the previous service's boxes killed moments ago, a loaded host) that took over 5 s here."""
CP = "/usr/bin/cp"


PERSISTENT_IMAGE = ".execbox-workspace.img"
LOSETUP = "/usr/sbin/losetup"


class QuotaUnavailable(RuntimeError):
    pass


class StillMounted(QuotaUnavailable):
    """The caller workspace is still a mount point: another box (live, or left by a dead process)
    still has its image bound there, so what the path shows is that box's tenant's files."""


def _own_image(image: str) -> bool:
    """Does our workspace image exist? Only a regular file of ours with one link counts: the
    caller dir is never looked at through a box's mount (``StillMounted``), and this refuses
    whatever else could stand there (a symlink, a device, another user's file)."""
    try:
        st = os.lstat(image)
    except FileNotFoundError:
        return False
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_nlink != 1:
        raise QuotaUnavailable(f"{PERSISTENT_IMAGE} in the workspace is not a regular file of the service's "
                               "own; refusing to mount it")
    return True


def loop_quota_possible() -> tuple[bool, str]:
    if os.geteuid() != 0:
        return False, "not root: loop mounts need root (using a bwrap --size tmpfs instead)"
    for tool in (MKFS, MOUNT, UMOUNT, CP, LOSETUP):
        if not os.access(tool, os.X_OK):
            return False, f"{tool} missing (install e2fsprogs / mount)"
    if not os.path.exists("/dev/loop-control"):
        return False, "/dev/loop-control missing: no loop devices"
    return True, "ext4 loop image"


def _run(argv: list[str]) -> None:
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,  # noqa: S603
                          text=True, timeout=60)
    if proc.returncode != 0:  # its output names host paths: the log has it, the error does not
        log.warning("%s failed (exit %s): %s", argv[0], proc.returncode, proc.stdout.strip()[-300:])
        raise QuotaUnavailable(f"{os.path.basename(argv[0])} failed (exit {proc.returncode})")


def _mkfs(image: str, size_bytes: int) -> None:
    with open(image, "wb") as f:
        f.truncate(size_bytes)
    _run([MKFS, "-q", "-F", "-m", "0", "-O", "^has_journal", "-E", "nodiscard,lazy_itable_init=1",
          "-L", "execbox-ws", image])


def _template(size_bytes: int) -> str:
    """An empty ext4 image of this size, made once: copying its few hundred KB of metadata
    (sparse) takes ~4 ms where mkfs takes ~40 ms on every box start."""
    path = os.path.join(jail_dir(), "templates", f"ext4-{size_bytes}.img")
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        tmp = f"{path}.{os.getpid()}.{threading.get_ident()}"
        try:
            _mkfs(tmp, size_bytes)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return path


def sparse_copy(src: str, dst: str) -> None:
    """Copy ``src`` to a new ``dst`` keeping its holes: only the data extents are written.

    Done in-process with SEEK_DATA/SEEK_HOLE (the template's few hundred KB of ext4 metadata),
    which saves a fork+exec of cp(1) on every box start; falls back to cp where the filesystem
    cannot report holes.
    """
    try:
        with open(src, "rb") as fin, open(dst, "xb") as fout:
            size = os.fstat(fin.fileno()).st_size
            fi, fo = fin.fileno(), fout.fileno()
            pos = 0
            while pos < size:
                try:
                    start = os.lseek(fi, pos, os.SEEK_DATA)
                except OSError:  # ENXIO: only a hole is left
                    break
                end = os.lseek(fi, start, os.SEEK_HOLE)
                while start < end:
                    chunk = os.pread(fi, min(1 << 20, end - start), start)
                    if not chunk:
                        break
                    os.pwrite(fo, chunk, start)
                    start += len(chunk)
                pos = end
            os.ftruncate(fo, size)
    except OSError:
        if os.path.exists(dst):
            os.unlink(dst)
        _run([CP, "--sparse=always", "--", src, dst])


_syscalls = True  # False once loopdev said this host cannot: mount(8) and friends from then on


def mount_image(image: str, mountpoint: str) -> str | None:
    """Loop-mount an ext4 image (nosuid, nodev, noatime): by syscalls (loopdev.py), else mount(8).
    Returns the loop device when the syscalls chose it (None: mount(8) did)."""
    global _syscalls
    if _syscalls:
        try:
            return loopdev.mount_image(image, mountpoint)
        except loopdev.LoopUnsupported:
            _syscalls = False
        except OSError as e:
            log.warning("mounting %s failed: %s", image, e)
            raise QuotaUnavailable(f"mount failed: {e.strerror or type(e).__name__}") from None
    _run([MOUNT, "-o", "loop,nosuid,nodev,noatime", "-t", "ext4", "--", image, mountpoint])
    return None


def create(image: str, mountpoint: str, size_bytes: int, owner: int) -> str | None:
    """Make a ``size_bytes`` ext4 image, mount it on ``mountpoint``, give its root to ``owner``;
    returns the loop device as :func:`mount_image` does."""
    os.makedirs(mountpoint, exist_ok=True)
    try:
        sparse_copy(_template(size_bytes), image)
        dev = mount_image(image, mountpoint)
    except BaseException:
        if os.path.exists(image):
            os.unlink(image)
        raise
    lost = os.path.join(mountpoint, "lost+found")
    shutil.rmtree(lost, ignore_errors=True)
    os.chown(mountpoint, owner, owner)
    os.chmod(mountpoint, 0o700)
    return dev


def attach_persistent(image: str, mountpoint: str, size_bytes: int, owner: int, seed_dir: str) -> str | None:
    """Mount a caller workspace's image (created on first use), moving in files found beside it.

    The image lives inside the caller's directory, so it survives the box and goes when the
    service deletes the session directory. It is refused while another loop device still
    holds it: mounting one ext4 image twice would corrupt it. It is refused too while the caller
    dir is still a mount point: everything found there would be another box's tenant's files
    (a replica taking over a session whose owner died with its bind in place), and root must
    never mount or follow what a tenant made. Files beside the image move in only to names the
    image does not have yet, so nothing is ever written through a link found inside it.
    """
    if is_mounted(seed_dir):
        raise StillMounted(f"workspace {os.path.basename(seed_dir)} is still mounted by another box")
    if _own_image(image):
        deadline = time.monotonic() + RELEASE_WAIT_SECONDS
        while loop_devices(image):  # autoclear after an unmount can lag (seconds on a loaded host)
            if time.monotonic() > deadline:
                raise QuotaUnavailable(f"workspace {os.path.basename(seed_dir)} is still mounted by another box")
            time.sleep(0.05)
        os.makedirs(mountpoint, exist_ok=True)
        dev = mount_image(image, mountpoint)
    else:
        dev = create(image, mountpoint, size_bytes, owner)
    try:
        for name in os.listdir(seed_dir):
            target = os.path.join(mountpoint, name)
            if name == PERSISTENT_IMAGE:
                continue
            if os.path.lexists(target):  # never into (or through) what the image already holds
                log.warning("workspace %s: %r beside its image is left there: the image has that name",
                            os.path.basename(seed_dir), name)
                continue
            shutil.move(os.path.join(seed_dir, name), target)  # links are moved as links, not followed
        for dirpath, dirnames, filenames in os.walk(mountpoint):
            for n in [*dirnames, *filenames]:
                os.lchown(os.path.join(dirpath, n), owner, owner)
        os.chown(mountpoint, owner, owner)
        os.chmod(mountpoint, 0o700)
    except BaseException:
        unmount(mountpoint)
        raise
    return dev


def loop_devices(image: str, dev: str | None = None) -> list[str]:
    """Loop devices currently backed by ``image`` (sysfs; losetup -j where sysfs says nothing).
    ``dev``: the one it was mounted with, the only one checked."""
    if os.path.isdir("/sys/block"):
        return loopdev.backing_devices(image, [dev] if dev else None)
    proc = subprocess.run([LOSETUP, "-j", image], stdout=subprocess.PIPE, text=True,  # noqa: S603
                          stderr=subprocess.DEVNULL, timeout=30)
    return [line.split(":", 1)[0] for line in proc.stdout.splitlines() if line.strip()]


def detach(image: str, dev: str | None = None) -> None:
    """Release the loop devices of an unmounted image now rather than whenever autoclear runs."""
    for held in loop_devices(image, dev):
        subprocess.run([LOSETUP, "-d", held], stdout=subprocess.DEVNULL,  # noqa: S603
                       stderr=subprocess.DEVNULL, timeout=30)


def bind(source: str, mountpoint: str) -> None:
    """Bind-mount ``source`` on ``mountpoint`` (root only)."""
    os.makedirs(mountpoint, exist_ok=True)
    _run([MOUNT, "--bind", "-o", "nosuid,nodev", "--", source, mountpoint])


def is_mounted(path: str) -> bool:
    """True if ``path`` is a mount point (os.path.ismount misses same-device bind mounts)."""
    target = os.path.realpath(path)
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        for line in f:
            mp = line.split()[4].encode().decode("unicode_escape")
            if mp == target:
                return True
    return False


def unmount(mountpoint: str) -> None:
    if mountpoint and is_mounted(mountpoint):
        try:
            if loopdev.unmount(mountpoint) or loopdev.unmount_lazy(mountpoint):
                return
        except loopdev.LoopUnsupported:
            pass
        proc = subprocess.run([UMOUNT, "--", mountpoint], stdout=subprocess.PIPE,  # noqa: S603
                              stderr=subprocess.STDOUT, timeout=60)
        if proc.returncode != 0:
            subprocess.run([UMOUNT, "-l", "--", mountpoint], stdout=subprocess.DEVNULL,  # noqa: S603
                           stderr=subprocess.DEVNULL, timeout=60)


def destroy(image: str, mountpoint: str, dev: str | None = None) -> None:
    """Unmount (detaching the loop device) and delete the image."""
    unmount(mountpoint)
    detach(image, dev)
    try:
        os.unlink(image)
    except FileNotFoundError:
        pass


def dir_adoptable(caller_dir: str, box_root: str) -> bool:
    """A session directory a pooled box's image can become: empty (or missing), same filesystem."""
    try:
        if os.path.isdir(caller_dir):
            if os.listdir(caller_dir):
                return False
            dev = os.stat(caller_dir).st_dev
        else:
            dev = os.stat(os.path.dirname(os.path.abspath(caller_dir))).st_dev
        return dev == os.stat(box_root).st_dev
    except OSError:
        return False


class Workspace:
    """The host side of a box's /workspace: which directory bwrap binds and what to undo.

    * no caller dir, root: a fresh ext4 image in the box dir (deleted with the box);
    * caller dir, root: a persistent image ``<dir>/.execbox-workspace.img`` (quota, survives
      the box so a recreated box finds its files), also bound onto ``<dir>`` while the box
      lives so the host sees the files in place;
    * not root: the caller dir bound as is (no quota), or a bwrap ``--size`` tmpfs;
    * ``tmpfs`` (a one-shot's box, no caller dir): the bwrap ``--size`` tmpfs as root too, since
      nothing outlives the box and attaching, mounting and removing an image cost ~7 ms of CPU.
    """

    def __init__(self, box_dir: str, caller_dir: str | None, tmpfs: bool = False) -> None:
        self.box_dir = box_dir
        self.caller_dir = caller_dir
        self.tmpfs = tmpfs and caller_dir is None
        self.mount_dir = os.path.join(box_dir, "workspace")
        self.bind_src: str | None = None  # what bwrap binds on /workspace (None: a tmpfs)
        self.image: str | None = None
        self.persistent = False
        self.host_view: str | None = None
        self.loop = False
        self.loop_dev: str | None = None  # the device the image is mounted with, when known

    def setup(self, size: int, owner: int | None) -> None:
        uid = owner if owner is not None else os.getuid()
        loop_ok = loop_quota_possible()[0]
        if self.caller_dir is None:
            if loop_ok and not self.tmpfs:
                self.image = os.path.join(self.box_dir, "workspace.img")
                self.loop_dev = create(self.image, self.mount_dir, size, uid)
                self.loop = True
                self.bind_src = self.mount_dir
            return
        os.makedirs(self.caller_dir, exist_ok=True)
        if loop_ok:
            self.image = os.path.join(self.caller_dir, PERSISTENT_IMAGE)
            self.persistent = True
            self.loop_dev = attach_persistent(self.image, self.mount_dir, size, uid, seed_dir=self.caller_dir)
            self.loop = True
            with open(os.path.join(self.box_dir, "host_view"), "w", encoding="utf-8") as f:
                f.write(self.caller_dir)
            bind(self.mount_dir, self.caller_dir)
            self.host_view = self.caller_dir
            self.bind_src = self.mount_dir
        else:
            self.bind_src = self.caller_dir

    def adoptable(self, caller_dir: str) -> bool:
        """Could :meth:`adopt` take ``caller_dir``: a fresh image of ours, an empty dir, one filesystem."""
        if not self.loop or self.persistent or self.caller_dir is not None or self.image is None:
            return False
        return dir_adoptable(caller_dir, os.path.dirname(self.image))

    def adopt(self, caller_dir: str) -> bool:
        """Make this (pooled) box's fresh image the persistent workspace of a new, empty ``caller_dir``.

        The mounted image file is renamed into the caller dir (same filesystem: the loop device
        follows the inode) and bound onto it, exactly as :meth:`setup` leaves a caller workspace;
        from then on the box keeps it like one. False (nothing changed) when it cannot.
        """
        if not self.adoptable(caller_dir):
            return False
        assert self.image is not None
        os.makedirs(caller_dir, exist_ok=True)
        target = os.path.join(caller_dir, PERSISTENT_IMAGE)
        os.rename(self.image, target)
        try:
            with open(os.path.join(self.box_dir, "host_view"), "w", encoding="utf-8") as f:
                f.write(caller_dir)
            bind(self.mount_dir, caller_dir)
        except BaseException:
            os.rename(target, self.image)
            raise
        self.image, self.persistent, self.caller_dir, self.host_view = target, True, caller_dir, caller_dir
        return True

    @property
    def host_path(self) -> str | None:
        """Where the host sees the workspace's files (None: only inside the box)."""
        return self.caller_dir or (self.mount_dir if self.loop else None)

    def teardown(self) -> None:
        if self.host_view is not None:
            unmount(self.host_view)
            self.host_view = None
        if self.loop:
            if self.persistent:
                unmount(self.mount_dir)
                detach(self.image or "", self.loop_dev)
            else:
                destroy(self.image or "", self.mount_dir, self.loop_dev)
            self.loop = False
