"""`execbox serve` refuses bad settings at start with SB002 naming them (docs/http-api.md): the
audit retentions were taken silently (a typo, a negative value: "keep everything"), and
`--open-run` off loopback said SB000, the "this is a bug" code (review 28, findings 5 and 7)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from .conftest import free_port, traversable_tmpdir

EXECBOX = os.path.join(os.path.dirname(sys.executable), "execbox")


def _refused(env_extra: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    base = traversable_tmpdir("execbox-serve-")
    env = {**os.environ, "EXECBOX_DATA_DIR": os.path.join(base, "data"), "SANDBOX_TYPE": "local", **env_extra}
    proc = subprocess.run([EXECBOX, "serve", "--port", str(free_port()), *args], env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    return proc


@pytest.mark.parametrize("var", ["EXECBOX_AUDIT_DAYS", "EXECBOX_EGRESS_AUDIT_DAYS"])
@pytest.mark.parametrize("value", ["-1", "abc", "nan"])
def test_a_bad_audit_retention_stops_the_start_naming_it(var: str, value: str) -> None:
    err = _refused({var: value}).stderr
    assert f"execbox: SB002: {var}:" in err and f'"field": "{var}"' in err


def test_open_run_off_loopback_is_sb002() -> None:
    err = _refused({}, "--host", "0.0.0.0", "--open-run").stderr
    assert "execbox: SB002: --open-run" in err and "loopback" in err
