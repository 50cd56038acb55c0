"""Make a runtime version from packages already installed in a venv, for a host with no package index.

    python3 scripts/device_runtime_from_venv.py NAME SITE_PACKAGES

A verification aid, not a product path: `execbox runtime build` installs from an index (or an
internal mirror), which the lent device machine does not have, while it does have torch installed
in a venv of the same interpreter the boxes run. This lays out what a build would: a venv of
/usr/bin/python3 with those packages in its site-packages, a manifest, published as the next
version under EXECBOX_JAIL_DIR's runtimes. Files are hard-linked when the source is on the same
filesystem (torch and its CUDA libraries are gigabytes), copied otherwise; hard-linked files keep
their modes (the version is mounted read-only in boxes all the same).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import time

from execbox.boxes import runtime as rt
from execbox.boxes import runtime_build, staging


def dists(site: str) -> list[str]:
    return sorted(f"{d.metadata['Name']}=={d.version}" for d in importlib.metadata.distributions(path=[site]))


def main() -> int:
    name, site = sys.argv[1], os.path.abspath(sys.argv[2])
    rt.check_name(name)
    top = os.path.join(rt.runtimes_dir(), name)
    os.makedirs(top, mode=0o755, exist_ok=True)
    staging.make_traversable(rt.runtimes_dir())
    work, held = runtime_build.new_build_dir(top)  # locked: a concurrent `runtime build` leaves it alone
    os.chmod(work, 0o755)
    started = time.monotonic()
    subprocess.run([rt.SYSTEM_PYTHON, "-m", "venv", "--without-pip", work], check=True)
    purelib = subprocess.run([os.path.join(work, "bin", "python"), "-c",
                              "import sysconfig; print(sysconfig.get_path('purelib'))"],
                             check=True, capture_output=True, text=True).stdout.strip()
    entries = [os.path.join(site, n) for n in os.listdir(site) if not n.startswith("__pycache__")]
    how = "hard links"
    if subprocess.run(["cp", "-al", "--", *entries, purelib + "/"], stderr=subprocess.PIPE).returncode != 0:
        how = "copies"
        subprocess.run(["cp", "-a", "--", *entries, purelib + "/"], check=True)
    runtime_build.make_writable(work)  # directories 0755 for the box's uid, links never followed
    packages = dists(site)
    info = {"name": name, "python": rt.SYSTEM_PYTHON, "packages": packages, "npm": [], "from": None,
            "pip_index": f"adopted from {site} (scripts/device_runtime_from_venv.py)", "npm_registry": None,
            "installed_at": time.time()}
    with open(os.path.join(work, rt.MANIFEST), "w", encoding="utf-8") as f:
        json.dump(info, f, indent=1)
    version = runtime_build.publish(top, work)
    os.close(held)
    print(json.dumps({"runtime": f"{name}@{version}", "path": os.path.join(top, version), "files": how,
                      "packages": len(packages), "seconds": round(time.monotonic() - started, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
