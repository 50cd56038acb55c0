"""Which modules a box preloads: ``auto`` is dropped under gVisor below 512 MiB (providers/preload.py)."""

from __future__ import annotations

import pytest

from execbox.providers.preload import GVISOR_AUTO_PRELOAD_MIN, effective_preload

MIB = 1024 * 1024


@pytest.mark.parametrize("runtime", ["runsc", "runsc-net", "runsc-systrap", "gvisor"])
def test_auto_is_dropped_under_gvisor_below_512m(runtime):
    choice, note = effective_preload("auto", runtime, 256 * MIB)
    assert choice == "none"
    assert note is not None and "512 MiB" in note and runtime in note and "'none'" in note


def test_named_modules_are_kept_and_only_auto_goes():
    assert effective_preload("auto,torch", "runsc", 384 * MIB)[0] == "torch"
    assert effective_preload(" numpy , auto ", "runsc", 128 * MIB)[0] == "numpy"
    assert effective_preload("numpy,pandas", "runsc", 128 * MIB) == ("numpy,pandas", None)


@pytest.mark.parametrize("choice,runtime,memory", [
    ("auto", "runsc", GVISOR_AUTO_PRELOAD_MIN),  # the default 512m keeps it
    ("auto", "runsc", 1024 * MIB),
    ("auto", "runc", 128 * MIB),  # runc shares the preloaded pages: no gVisor heap accounting
    ("auto", "", 128 * MIB),  # kubernetes without a RuntimeClass
    ("none", "runsc", 128 * MIB),
])
def test_left_as_configured(choice, runtime, memory):
    assert effective_preload(choice, runtime, memory) == (choice, None)


def test_an_empty_choice_means_auto():
    assert effective_preload("", "runc", 128 * MIB) == ("auto", None)
    assert effective_preload("", "runsc", 128 * MIB)[0] == "none"
