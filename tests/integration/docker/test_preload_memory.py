"""gVisor counts a preloaded agent's heap against the box: below 512m a runsc box preloads nothing
(providers/preload.py), at the default 512m it preloads what ``auto`` says, and the operator sees why."""

from __future__ import annotations

import pytest

from execbox.providers.docker import DockerProvider
from tests.conftest import require

from .conftest import runtimes_of

pytestmark = pytest.mark.docker

PRELOADED = "import sys; print(sorted(m for m in ('numpy', 'pandas', 'matplotlib.pyplot') if m in sys.modules))"


def test_the_suites_runsc_box_at_512m_runs_preloaded(provider, instance):
    r = provider.execute_code(instance, PRELOADED, "python")
    assert r.exit_code == 0, r.stderr
    assert r.stdout.strip() == "['matplotlib.pyplot', 'numpy', 'pandas']"
    assert not any("preload" in w for w in provider.warnings())


def test_a_runsc_box_below_512m_preloads_nothing_and_says_why(docker_engine):
    require("runsc" in runtimes_of(docker_engine), "docker runtime runsc")
    small = DockerProvider()
    small.initialize({"runtime": "runsc", "pool_size": 0, "max_memory": "256m"})
    try:
        (note,) = [w for w in small.warnings() if "preload" in w]
        assert "512 MiB" in note and "'none'" in note
        iid = small.create_instance(tenant_id="t1", session_id="small").instance_id
        r = small.execute_code(iid, PRELOADED, "python")
        assert r.exit_code == 0 and r.stdout.strip() == "[]", (r.stdout, r.stderr)
        # what it would have preloaded still imports: only the speed differs
        r = small.execute_code(iid, "import pandas; print(pandas.Series([1, 2]).sum())", "python")
        assert r.exit_code == 0 and r.stdout.strip() == "3", r.stderr
    finally:
        small.shutdown()
