"""A jail on a host without box cgroups runs degraded unless the operator requires the limits."""

from __future__ import annotations

import pytest

from execbox.boxes import cgroups
from execbox.errors import ProviderUnavailableError

from .conftest import cgroups_ready, make_provider


@pytest.fixture
def no_cgroups(monkeypatch):
    """This host as one that delegates no controllers to execbox (the lent device machine's default)."""
    def detect():
        raise cgroups.CgroupUnavailable("cgroup v2 controllers not delegated to /process_api/x: pids, cpu")

    monkeypatch.setattr(cgroups, "detect", detect)


def test_required_cgroups_refuse_to_start_naming_the_missing_delegation(no_cgroups):
    with pytest.raises(ProviderUnavailableError) as e:
        make_provider(require_cgroups=True)
    assert e.value.code == "SB009" and e.value.http_status == 503
    assert "require_cgroups" in e.value.message and "not delegated" in e.value.message
    assert e.value.details["missing"] == "cgroup limits"


def test_without_the_requirement_boxes_run_degraded_and_say_so(no_cgroups):
    p = make_provider(require_cgroups="false")  # as EXECBOX_JAIL_REQUIRE_CGROUPS=false arrives
    try:
        assert any("no cgroup limits" in w for w in p.warnings())
        assert p.applied_limits()["enforced_by"] == "rlimit"
        inst = p.create_instance()
        r = p.execute_code(inst.instance_id, "print(6 * 7)", "python", 20)
        assert r.exit_code == 0 and r.stdout == "42\n"
        p.destroy_instance(inst.instance_id)
    finally:
        p.shutdown()


def test_required_cgroups_start_where_the_host_has_them():
    cgroups_ready()
    p = make_provider(require_cgroups=True)
    try:
        assert p.applied_limits()["enforced_by"] == "cgroup+rlimit"
        assert not any("no cgroup limits" in w for w in p.warnings())
    finally:
        p.shutdown()
