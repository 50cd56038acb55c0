"""The jail on a non-root host: bwrap in an unprivileged user namespace, no cgroup, tmpfs quota.

Simulated by running execbox as an unprivileged uid (the test itself must be root to switch).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile

import pytest

from tests.conftest import require

from .conftest import jail_ready

pytestmark = pytest.mark.jail

SCRIPT = r"""
import json, os, sys
from execbox.providers.jail import JailProvider
ok, reason = JailProvider.availability()
p = JailProvider(); p.initialize({"pool_size": 0, "disk_quota_mb": 16, "preload": "none", "pids_limit": 32})
i = p.create_instance().instance_id
r1 = p.execute_code(i, "import os; print(os.getuid())", "python", 20)
r2 = p.execute_code(i, "import os\ntry:\n    for n in 'fg':\n        open(n,'wb').write(b'x' * (10 << 20))\n"
                       "except OSError as e:\n    print(e.strerror)", "python", 20)
r3 = p.execute_code(i, "import os, time\nn = 0\ntry:\n    while n < 1000:\n        if os.fork() == 0:\n"
                       "            time.sleep(5); os._exit(0)\n        n += 1\nexcept OSError as e:\n"
                       "    print(n, e.strerror)", "python", 20)
r4 = p.execute_code(i, "import os\nm, s = os.openpty()\nos.write(s, b'pty-ok')\nprint(os.read(m, 6).decode(), "
                       "[l.split()[-1] for l in open('/proc/self/mountinfo') if l.split()[4] == '/dev/pts'])",
                    "python", 20)
box = p._instances[i].box
pid = box.proc.pid
own_pts = box.pts is not None or os.path.exists(os.path.join(box.box_dir, "pts"))
p.destroy_instance(i)
p.shutdown()
print(json.dumps({"ok": ok, "reason": reason, "uid": r1.stdout.strip(), "fill": r2.stdout.strip(),
                  "warnings": r1.metadata.get("warnings", []), "workspace": box.workspace,
                  "bwrap_alive": os.path.exists(f"/proc/{pid}"), "forks": r3.stdout.strip(),
                  "pty": r4.stdout.strip(), "own_pts": own_pts}))
"""


@pytest.fixture
def open_tmp():
    d = tempfile.mkdtemp(prefix="execbox-nonroot-")  # pytest's tmp_path is not traversable by others
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_unprivileged_host_uses_user_namespaces_and_a_tmpfs_quota(open_tmp):
    jail_ready()
    require(os.geteuid() == 0, "root (to switch to an unprivileged uid for this test)")
    uid = 61001
    home = os.path.join(open_tmp, "home")
    os.mkdir(home)
    os.chown(home, uid, uid)
    src = os.path.dirname(os.path.dirname(os.path.abspath(__import__("execbox").__file__)))
    site = sysconfig.get_paths()["purelib"]

    def drop() -> None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)

    py = "/usr/bin/python3" if sys.version_info[:2] == (3, 11) else sys.executable
    proc = subprocess.run([py, "-c", SCRIPT], capture_output=True, text=True, timeout=120, preexec_fn=drop,
                          cwd=open_tmp, env={"PATH": "/usr/bin:/bin", "HOME": home,
                                                  "PYTHONPATH": f"{src}:{site}"})
    if proc.returncode != 0 and "Permission denied" in proc.stderr and site in proc.stderr:
        pytest.skip("execbox's site-packages are not readable by an unprivileged uid here")
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["ok"] is True and "degraded" in out["reason"]
    assert out["uid"] == "1000" and out["fill"] == "No space left on device"
    assert out["workspace"] is None  # the workspace lived only inside the box (a --size tmpfs)
    assert any("tmpfs" in w for w in out["warnings"])
    assert out["bwrap_alive"] is False
    forked, _, err = out["forks"].partition(" ")
    assert err == "Resource temporarily unavailable" and int(forked) < 32  # RLIMIT_NPROC stands in
    # no devpts mount of the service's (only root may mount one): bwrap's own instance, ptys work
    assert out["own_pts"] is False and out["pty"].startswith("pty-ok ") and "max=" not in out["pty"], out["pty"]
