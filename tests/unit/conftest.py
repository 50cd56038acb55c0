"""Fixtures shared by unit tests in different modules."""

import pytest

from .client_fakes import serve  # noqa: F401 - a fixture: raw hostile HTTP servers (test_client_*)


@pytest.fixture
def own_uid_leases(tmp_path, monkeypatch):
    """A jail dir and a uid lease directory of the test's own, with the default uid range: tests
    that lease box uids (as root: not the host's /run/execbox/uids) assert exact uids and pins."""
    from execbox.boxes import uids

    monkeypatch.setenv("EXECBOX_JAIL_DIR", str(tmp_path))
    monkeypatch.setattr(uids, "HOST_LOCK_DIR", str(tmp_path / "run" / "uids"))
    monkeypatch.delenv("EXECBOX_JAIL_HOST_UID", raising=False)
    monkeypatch.delenv("EXECBOX_JAIL_UID_RANGE", raising=False)
