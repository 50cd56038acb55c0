"""Sandbox runtimes: built by `execbox runtime install` (old spelling of `runtime build`), mounted
read-only, heavy imports preloaded."""

from __future__ import annotations

import os
import time

import pytest
from typer.testing import CliRunner

from execbox.boxes import runtime
from execbox.cli import app
from tests.conftest import require

from .conftest import make_provider, run

pytestmark = pytest.mark.jail


def _has_sci() -> bool:
    return any(r["name"] == "sci" for r in runtime.list_runtimes())


def test_cli_installs_a_runtime_that_boxes_mount_read_only():
    name = f"t-empty-{os.getpid()}"
    cli = CliRunner()
    try:
        res = cli.invoke(app, ["runtime", "install", "--name", name])
        assert res.exit_code == 0, res.output
        assert name in cli.invoke(app, ["runtime", "list"]).output
        p = make_provider(runtime=name)
        try:
            inst = p.create_instance()
            r = run(p, inst.instance_id, "import sys, json, os\n"
                                         "try:\n    open(sys.prefix + '/x', 'w')\n    w = 'WROTE'\n"
                                         "except OSError as e:\n    w = e.strerror\n"
                                         "print(json.dumps([sys.prefix, sys.executable, w]))")
            prefix, exe, write = __import__("json").loads(r.stdout)
            assert prefix == runtime.RUNTIME_MOUNT and exe.startswith(runtime.RUNTIME_MOUNT)
            assert write in ("Read-only file system", "Permission denied")
            assert inst.metadata["runtime"] == f"{name}@v1"  # the version it mounts
        finally:
            p.shutdown()
    finally:
        assert cli.invoke(app, ["runtime", "remove", name]).exit_code == 0
    assert name not in cli.invoke(app, ["runtime", "list"]).output


def test_cli_rejects_bad_runtime_names_with_sb002():
    res = CliRunner().invoke(app, ["runtime", "install", "--name", "../evil", "numpy"])
    assert res.exit_code == 2 and "SB002" in res.output
    res = CliRunner().invoke(app, ["runtime", "remove", "never-installed-x"])
    assert res.exit_code == 2 and "not installed" in res.output
    with pytest.raises(runtime.RuntimeNotUsable):
        runtime.install("ok-name", ["--index-url=http://evil"])


def test_heavy_packages_are_preloaded_so_user_imports_cost_nothing():
    require(_has_sci(), "jail runtime 'sci' (scripts/setup/test/20-jail-runtime.sh)")
    p = make_provider(runtime="sci", preload="auto", max_memory="512m", disk_quota_mb=64)
    try:
        inst = p.create_instance()
        assert set(inst.metadata["preloaded"]) == {"numpy", "pandas", "matplotlib.pyplot"}
        # The agent rendered a throwaway figure at start-up (so each run's first plot starts warm);
        # user code sees none of it: no open figure, and only the user's own figure is an artifact.
        code = ("import sys\nbefore = 'pandas' in sys.modules\nimport pandas as pd, matplotlib.pyplot as plt\n"
                "print(before, plt.get_fignums(), 'matplotlib.backends.backend_agg' in sys.modules)\n"
                "plt.plot(pd.Series([1, 3, 2]))")
        r = run(p, inst.instance_id, code, timeout=60)
        assert r.stdout == "True [] True\n", r.stderr[-500:]
        assert [a.mime_type for a in r.artifacts] == ["image/png"]  # the figure was saved automatically
    finally:
        p.shutdown()


def test_numpy_values_main_returns_are_json_and_numpys_failed_allocation_keeps_its_message():
    """review 24: ``df.x.sum()`` (a numpy int64) failed the whole run as not JSON-serializable, and
    every MemoryError became a bare 'out of memory' without numpy's message or the line."""
    require(_has_sci(), "jail runtime 'sci' (scripts/setup/test/20-jail-runtime.sh)")
    p = make_provider(max_memory="512m", disk_quota_mb=64)  # the system runtime by default
    try:
        iid = p.create_instance(runtime="sci").instance_id
        code = ("import numpy as np, pandas as pd\ndef main():\n    df = pd.DataFrame({'x': [1, 2, 3]})\n"
                "    return {'total': df.x.sum(), 'mean': df.x.mean(), 'arr': np.arange(3), 's': df.x * 2}")
        r = run(p, iid, code, timeout=60)
        assert (r.result, r.exit_code) == ({"total": 6, "mean": 2.0, "arr": [0, 1, 2], "s": [2, 4, 6]}, 0), r.stderr
        assert r.metadata["limits"]["runtime"] == r.metadata["runtime"] and r.metadata["runtime"].startswith("sci@")
        r = run(p, iid, "import numpy as np\ndef grow():\n    return np.zeros((100000, 100000))\ngrow()", timeout=60)
        assert r.error_code == "SB006" and "line 3, in grow" in r.stderr and "Unable to allocate" in r.stderr, r.stderr
    finally:
        p.shutdown()


def test_a_plotting_session_s_idle_spare_draws_ahead_and_leaves_no_figure_behind():
    require(_has_sci(), "jail runtime 'sci' (scripts/setup/test/20-jail-runtime.sh)")
    p = make_provider(runtime="sci", preload="auto", max_memory="512m", disk_quota_mb=64)
    try:
        iid = p.create_instance(session_id="plots").instance_id  # a session: one-shot boxes never warm
        client = p._instances[iid].box.client
        plot = "import matplotlib.pyplot as plt\nprint(plt.get_fignums())\nplt.plot([1, 3, 2])"
        first = run(p, iid, plot, timeout=60)
        assert (first.stdout, first.stderr) == ("[]\n", ""), first.stderr[-500:]
        state = None
        for _ in range(100):  # idle: pings 0.2 s apart leave the spare its FIGURE_IDLE
            time.sleep(0.2)
            state = client.call("ping")["spare_figures"]
            if state == "warm":
                break
        assert state == "warm"
        r = run(p, iid, plot, timeout=60)
        assert (r.exit_code, r.stdout, r.stderr) == (0, "[]\n", ""), r.stderr[-500:]
        assert [a.mime_type for a in r.artifacts] == ["image/png"]  # the user's figure only
    finally:
        p.shutdown()


def test_a_box_copies_the_runtime_s_font_cache_and_matplotlib_uses_it_as_is():
    """A runtime built with matplotlib carries its font list (mpl-seed); a box's agent copies it
    into the box's empty MPLCONFIGDIR, so the first import does not scan every font again."""
    sci = next((r for r in runtime.list_runtimes() if r["name"] == "sci"), None)
    require(sci is not None and os.path.isdir(os.path.join(sci["path"] or "", runtime.MPL_SEED)),
            "jail runtime 'sci' built with its font cache (scripts/setup/test/20-jail-runtime.sh)")
    p = make_provider(runtime="sci", preload="none", max_memory="512m", disk_quota_mb=64)
    try:
        iid = p.create_instance(session_id="fonts").instance_id
        code = ("import os\n"
                "names = [n for n in os.listdir('/tmp') if n.startswith('fontlist-')]\n"
                "box = '/tmp/' + names[0]\n"
                "before = os.stat(box).st_mtime_ns\n"
                "import matplotlib.pyplot as plt\n"
                "plt.plot([1, 2])\n"
                "seed = open('/opt/execbox/runtime/mpl-seed/' + names[0], 'rb').read()\n"
                "print(len(names), os.stat(box).st_mtime_ns == before, seed == open(box, 'rb').read())")
        r = run(p, iid, code, timeout=60)
        assert (r.exit_code, r.stdout, r.stderr) == (0, "1 True True\n", ""), r.stderr[-500:]
    finally:
        p.shutdown()
