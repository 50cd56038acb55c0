"""The shared attack battery (tests/security/battery.py) against a jail box."""

from __future__ import annotations

import pytest

from tests.integration.jail.conftest import assert_healthy
from tests.security.battery import assert_agent_unharmed, assert_contained, run_battery

pytestmark = pytest.mark.jail


def test_user_code_cannot_reach_the_agent_or_the_kernel_surface(jail, box):
    out = run_battery(jail, box)
    assert_contained(out, signals_refused=False)
    assert out["agent_pid"] == 1  # the agent is the box's pid-namespace init
    assert_agent_unharmed(jail, box, out["agent_pid"])
    assert_healthy(jail, box)
