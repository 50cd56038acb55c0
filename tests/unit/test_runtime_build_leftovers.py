"""A killed `execbox runtime build` cannot clean up its `.build-*` directory (hundreds of MB with
real packages): the next build removes it, but never the directory of a build still running."""

from __future__ import annotations

import fcntl
import os
import time

from execbox.boxes.runtime_build import ABANDONED_AFTER, remove_abandoned_builds


def _build_dir(top, name: str, age: float) -> str:
    path = top / name
    (path / "lib").mkdir(parents=True)
    (path / "lib" / "big.bin").write_bytes(b"x" * 1024)
    os.chmod(path / "lib", 0o555)  # a build makes its files read-only before it publishes
    then = time.time() - age
    os.utime(path, (then, then))
    return str(path)


def test_only_an_old_unlocked_build_directory_is_removed(tmp_path):
    killed = _build_dir(tmp_path, ".build-killed", ABANDONED_AFTER + 60)
    running = _build_dir(tmp_path, ".build-running", ABANDONED_AFTER + 60)
    fresh = _build_dir(tmp_path, ".build-fresh", 0)  # made a moment ago, about to be locked
    (tmp_path / "v1").mkdir()
    held = os.open(running, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(held, fcntl.LOCK_EX)
    try:
        assert remove_abandoned_builds(str(tmp_path)) == [".build-killed"]
    finally:
        os.close(held)
    assert not os.path.exists(killed) and os.path.isdir(running) and os.path.isdir(fresh)
    assert (tmp_path / "v1").is_dir()
