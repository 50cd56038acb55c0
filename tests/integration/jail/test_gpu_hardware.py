"""A CUDA program in a jail box with ``gpu: all``, on a real NVIDIA host (skips elsewhere, naming
the missing device). The same probe is what scripts/verify_gpu.sh runs and records in docs/gpu.md."""

from __future__ import annotations

import glob
import importlib.util
import json
import os

import pytest

from .conftest import make_provider, run

pytestmark = pytest.mark.jail

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _probe_code() -> str:
    spec = importlib.util.spec_from_file_location("verify_gpu", os.path.join(REPO, "scripts", "verify_gpu.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.PROBE


def test_cuda_driver_runs_in_a_jail_box_with_the_opt_in():
    if not glob.glob("/dev/nvidia[0-9]*"):
        pytest.skip("an NVIDIA GPU device (/dev/nvidia0) is not present on this host")
    p = make_provider(gpu="all", max_memory="4g", pids_limit=512)
    try:
        inst = p.create_instance()
        out = json.loads(run(p, inst.instance_id, _probe_code(), timeout=300).stdout)
        assert out["cuInit"] == 0 and out["devices"] >= 1 and out["memcpy_roundtrip"] is True, out
        if out.get("torch"):
            assert out["torch_cuda"] and out["matmul_matches_cpu"], out
    finally:
        p.shutdown()
