"""Box code and host reads shared by the jail's and Docker's pty tests: one pty round trip in a
box, a victim that needs one pty, and the host's pty count (kernel.pty.nr)."""

from __future__ import annotations

PTY_NR = "/proc/sys/kernel/pty/nr"

PTYS = r"""
import json, os, pty, select, shutil, subprocess
out = {"uid": os.getuid()}
m, s = os.openpty()
st = os.stat(os.ttyname(s))
out["slave"] = [os.ttyname(s).rsplit("/", 1)[0], st.st_uid, st.st_gid, oct(st.st_mode & 0o777)]
os.close(os.open(os.ttyname(s), os.O_RDWR | os.O_NOCTTY))  # the box user opens its slave by name
if os.fork() == 0:  # a child on the slave side writes, the master reads it back
    os.close(m)
    os.write(s, b"through-the-pty\n")
    os._exit(0)
os.wait()
out["read"] = os.read(m, 100).decode().strip()
os.close(s)
pid, fd = pty.fork()
if pid == 0:
    print("child-tty", os.isatty(0), flush=True)
    os._exit(0)
data = b""
while b"True" not in data and select.select([fd], [], [], 10)[0]:  # gVisor: no EIO once the child is gone
    try:
        chunk = os.read(fd, 100)
    except OSError:
        break
    if not chunk:
        break
    data += chunk
os.waitpid(pid, 0)
out["fork"] = data.decode().strip()
if shutil.which("script"):
    out["script"] = subprocess.run(["script", "-qc", "tty", "/dev/null"], capture_output=True, text=True).stdout.strip()
pts = [line.split() for line in open("/proc/self/mountinfo") if line.split()[4] == "/dev/pts"]
out["pts"] = [p[-1] for p in pts]  # mount options, the top one last: what /dev/ptmx (pts/ptmx) opens
out["ptmx"] = os.readlink("/dev/ptmx") if os.path.islink("/dev/ptmx") else "node"
print(json.dumps(out))
"""

VICTIM = """
import os
m, s = os.openpty()
name = os.ttyname(s)
if os.fork() == 0:
    os.write(s, b"victim-ok\\n")
    os._exit(0)
os.wait()
print(name, os.read(m, 64).decode().strip())
"""


def pty_nr() -> int:
    with open(PTY_NR) as f:
        return int(f.read())
