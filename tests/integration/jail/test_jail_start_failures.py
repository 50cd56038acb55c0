"""A box start that fails early leaves nothing behind: no uid lease, no box directory."""

from __future__ import annotations

import os

import pytest

from execbox.boxes import jail_box, uids
from tests.integration.jail.conftest import make_provider


def _mine() -> set[str]:
    return {n for n in os.listdir(jail_box.boxes_dir()) if n.startswith(f"jail-{os.getpid()}-")}


def test_a_start_that_fails_before_its_box_exists_gives_its_uid_back(tmp_path, monkeypatch):
    """A failure between taking the uid lease and the start's own clean-up (waiting for the
    session's workspace, reaping stale boxes) kept the uid leased for the life of the process."""
    if os.geteuid() != 0:
        pytest.skip("box uids are leased by a root service only")
    p = make_provider()
    leases = []
    real = uids.acquire

    def recording(*a, **k):
        leases.append(real(*a, **k))
        return leases[-1]

    def fails(path):
        raise OSError("workspace still unmounting")

    monkeypatch.setattr(uids, "acquire", recording)
    monkeypatch.setattr(jail_box, "_wait_for_workspace", fails)
    try:
        before = _mine()
        with pytest.raises(OSError, match="still unmounting"):
            jail_box.start(p._settings, workspace=str(tmp_path))
        assert len(leases) == 1 and not leases[0].held
        assert _mine() == before
    finally:
        p.shutdown()
