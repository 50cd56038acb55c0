"""``__main__`` of the agent zipapp uploaded into cloud sandboxes (see agent/oneshot.py).

A zip cannot hold files that other programs open by path (node opens js_runner.js), so the first
run extracts the archive to ``/tmp/<its name without .pyz>/`` and removes the uploaded archive
(it was staged in the workspace, the one place every cloud's file API can write). Later runs
start that directory (``python3 /tmp/execbox-agent-<hash> oneshot ...``), which holds this file
as ``__main__.py``. Extraction is atomic: concurrent first runs each extract to a private
directory and only one rename wins. The hash in the name versions the code, so a sandbox never
runs a stale agent. Stdlib only.
"""

from __future__ import annotations

import os
import shutil
import sys
import zipfile

INSTALL_DIR = "/tmp"


def extracted(pyz: str) -> str:
    """The directory the agent package is importable from, extracting the archive on first use."""
    if os.path.isdir(pyz):
        return pyz
    name = os.path.basename(pyz).lstrip(".")  # staged as a dot file in the workspace
    dest = os.path.join(INSTALL_DIR, name[:-4] if name.endswith(".pyz") else name + ".d")
    if not os.path.isfile(os.path.join(dest, "execbox_agent", "main.py")):
        tmp = f"{dest}.{os.getpid()}.tmp"
        with zipfile.ZipFile(pyz) as z:
            z.extractall(tmp)
        try:
            os.rename(tmp, dest)
        except OSError:  # another run extracted it first
            shutil.rmtree(tmp, ignore_errors=True)
    try:
        os.unlink(pyz)  # staged in the user's workspace: leave it clean
    except OSError:
        pass
    return dest


def main() -> int:
    pyz = os.path.abspath(sys.argv[0])
    sys.path[:] = [extracted(pyz)] + [p for p in sys.path if os.path.abspath(p or ".") != pyz]
    from execbox_agent import main as agent_main
    from execbox_agent import oneshot

    if sys.argv[1:2] == ["oneshot"]:
        return oneshot.main(sys.argv[2:])
    agent_main.main(sys.argv[1:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
