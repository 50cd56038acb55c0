"""The jail's runtime registry with a runtime directory that is still being built (or half-made).

Such a directory has no current version yet. It must be skipped, not break every provider start:
naming it used to recurse (resolve -> list_runtimes -> resolve) until RecursionError.
"""

from __future__ import annotations

import json
import os

import pytest

from execbox.boxes import runtime


@pytest.fixture
def jail_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("EXECBOX_JAIL_DIR", str(tmp_path))
    root = tmp_path / "runtimes"
    (root / "half").mkdir(parents=True)  # a build in progress: no version, no current link
    good = root / "good" / "v1"
    good.mkdir(parents=True)
    (good / runtime.MANIFEST).write_text(json.dumps({"packages": ["six"], "npm": []}))
    os.symlink("v1", root / "good" / runtime.CURRENT)
    return root


def test_half_built_runtime_is_skipped_in_the_list(jail_dir):
    names = [r["name"] for r in runtime.list_runtimes()]
    assert names == [runtime.SYSTEM, "good"]


def test_naming_a_half_built_runtime_is_a_clear_error(jail_dir):
    with pytest.raises(runtime.RuntimeNotUsable) as e:
        runtime.resolve("half", list_known=True)  # the operator's CLI and admin API
    assert "'half' is not installed" in e.value.message and "good" in e.value.message
    assert runtime.resolve("good").packages == ["six"]


@pytest.mark.parametrize("ref", ["nope", "good@v7"])
def test_a_tenants_unknown_runtime_lists_no_template_names(jail_dir, ref):
    """Templates are host-wide: the error a tenant gets (runtime= on a session or run) names what
    it asked for, never the other templates."""
    with pytest.raises(runtime.RuntimeNotUsable) as e:
        runtime.resolve_runtime(ref)
    text = f"{e.value.message} {e.value.details}"
    assert repr(ref.partition("@")[0]) in text and "installed:" not in text and "half" not in text
    assert ref != "nope" or "good" not in text
