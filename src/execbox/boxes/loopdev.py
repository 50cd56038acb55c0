"""Loop-mount and unmount a workspace image with syscalls instead of mount(8)/umount(8)/losetup(8).

Every box start used to fork+exec mount(8) and every teardown umount(8) plus losetup(8): with
libmount and libblkid that is ~15 ms of CPU per box, a large share of a sustained one-shot's
cost. Here the same work is a few ioctls and mount(2)/umount2(2) through libc:

* ``LOOP_CTL_GET_FREE`` on /dev/loop-control names a free loop device;
* ``LOOP_CONFIGURE`` (Linux >= 5.8) binds the image to it with ``LO_FLAGS_AUTOCLEAR``, so the
  device frees itself when the filesystem is unmounted (what ``mount -o loop`` does);
* mount(2) with the same flags as before (nosuid, nodev, noatime), umount2(2) to undo it.

Any failure that means "this kernel or host cannot do it this way" raises ``LoopUnsupported``
and the caller falls back to the tools (quota.py), so behaviour never depends on this module.
Root only, like the rest of the loop quota.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import struct
import threading
import time

LOOP_CONTROL = "/dev/loop-control"
LOOP_CTL_GET_FREE = 0x4C82
LOOP_CONFIGURE = 0x4C0A
LO_FLAGS_AUTOCLEAR = 4
MS_NOSUID, MS_NODEV, MS_NOATIME = 2, 4, 1024
MNT_DETACH = 2
RETRIES = 128  # EBUSY: another process took the free device first
# struct loop_config: u32 fd, u32 block_size, struct loop_info64 (232 bytes), u64 reserved[8]
_INFO64 = struct.Struct("=QQQQQIIII64s64s32sQQ")
_CONFIG = struct.Struct(f"=II{_INFO64.size}s64x")


class LoopUnsupported(OSError):
    """The syscall route is not available here (old kernel, no libc symbol): use the tools."""


_libc: ctypes.CDLL | None = None
_attach_lock = threading.Lock()


def _c() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                                   ctypes.c_void_p]
            libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
        except (OSError, AttributeError) as e:
            raise LoopUnsupported(errno.ENOSYS, f"libc mount/umount2 unavailable: {e}") from None
        _libc = libc
    return _libc


def _attach(image: str) -> tuple[int, int]:
    """(fd, number) of a free loop device now backed by ``image`` (autoclear); caller closes fd."""
    img = os.open(image, os.O_RDWR | os.O_CLOEXEC)
    try:
        try:
            ctl = os.open(LOOP_CONTROL, os.O_RDWR | os.O_CLOEXEC)
        except OSError as e:
            raise LoopUnsupported(e.errno, f"{LOOP_CONTROL}: {e.strerror}") from None
        try:
            with _attach_lock:
                return _configure(ctl, img, image)
        finally:
            os.close(ctl)
    finally:
        os.close(img)


def _configure(ctl: int, img: int, image: str) -> tuple[int, int]:
    """Bind ``img`` to the first free loop device.

    Every concurrent caller is handed the same free number, so a burst of box starts used to
    exhaust its retries on EBUSY (SB004 "no free loop device"): threads of this process take
    turns (the caller holds ``_attach_lock``); another process can still win a number, hence
    the retries, with a short pause once the device list itself is contended.
    """
    info = _INFO64.pack(0, 0, 0, 0, 0, 0, 0, 0, LO_FLAGS_AUTOCLEAR,
                        os.path.basename(image).encode()[:63], b"", b"", 0, 0)
    for attempt in range(RETRIES):
        n = fcntl.ioctl(ctl, LOOP_CTL_GET_FREE)
        try:
            dev = os.open(f"/dev/loop{n}", os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:  # no devtmpfs node for it (some containers): let the tools try
            raise LoopUnsupported(errno.ENOENT, f"/dev/loop{n} does not exist") from None
        try:
            fcntl.ioctl(dev, LOOP_CONFIGURE, _CONFIG.pack(img, 0, info))
            return dev, n
        except OSError as e:
            os.close(dev)
            if e.errno in (errno.EINVAL, errno.ENOTTY, errno.ENOSYS):
                raise LoopUnsupported(e.errno, f"LOOP_CONFIGURE not supported: {e.strerror}") from None
            if e.errno != errno.EBUSY:
                raise
        if attempt >= 8:
            time.sleep(0.001 * min(attempt, 20))
    raise OSError(errno.EBUSY, f"no free loop device after {RETRIES} tries")


def mount_image(image: str, mountpoint: str) -> str:
    """Mount the ext4 ``image`` on ``mountpoint`` (nosuid, nodev, noatime) through a loop device;
    returns the device (``/dev/loopN``), so its release can later be checked without a scan."""
    libc = _c()
    dev, n = _attach(image)
    try:
        flags = MS_NOSUID | MS_NODEV | MS_NOATIME
        if libc.mount(f"/dev/loop{n}".encode(), mountpoint.encode(), b"ext4", flags, None) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"mount {image} on {mountpoint}: {os.strerror(err)}")
    finally:
        os.close(dev)  # with autoclear the device goes when the mount does (or now, on failure)
    return f"/dev/loop{n}"


def unmount(mountpoint: str) -> bool:
    """umount2(2) ``mountpoint``; True when it was unmounted (EBUSY and others: False)."""
    return _c().umount2(mountpoint.encode(), 0) == 0


def unmount_lazy(mountpoint: str) -> bool:
    return _c().umount2(mountpoint.encode(), MNT_DETACH) == 0


def backing_devices(image: str, among: list[str] | None = None) -> list[str]:
    """Loop devices backed by ``image``, read from sysfs (what ``losetup -j`` prints, no fork).

    ``among``: only these devices (``/dev/loopN``) are checked: the one a box mounted, rather
    than every loop device on the host (hundreds on a busy one)."""
    target = os.path.realpath(image)
    out: list[str] = []
    if among is not None:
        names = [os.path.basename(d) for d in among]
    else:
        try:
            names = os.listdir("/sys/block")
        except OSError:
            return out
    for name in names:
        if not name.startswith("loop"):
            continue
        try:
            with open(f"/sys/block/{name}/loop/backing_file", encoding="utf-8") as f:
                backing = f.read().rstrip("\n")
        except OSError:
            continue
        if backing.removesuffix(" (deleted)") == target:
            out.append(f"/dev/{name}")
    return out
