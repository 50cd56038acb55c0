"""A second, private dockerd for tests that stop or restart the engine (never the shared one).

It runs on its own socket, data root and exec root under a temporary directory (its own containerd
too), on a bridge of its own and without iptables, with the host's daemon.json (runc, runsc). Not
``--bridge=none``: a dockerd started so deletes the host's ``docker0`` (moby's
``removeDefaultBridgeInterface``), which the shared engine's containers need (in CI every later
test of a bridged container failed "could not find bridge docker0"). The worker image
is imported from the rootfs tarball the shared engine's fixture cached (``images.build_image``,
~6 s here); nothing is pulled. ``close`` removes every container on it, undoes their host side,
stops it and deletes its directories. With ``--live-restore`` in its flags a stop leaves the
containers running (their shims outlive dockerd and its containerd), as on a production engine so
configured.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time

DAEMON_JSON = "/etc/docker/daemon.json"


class PrivateEngine:
    def __init__(self, flags: tuple[str, ...] = ()) -> None:
        self.flags = list(flags)  # more dockerd flags, on every start (``--live-restore``)
        self.dir = tempfile.mkdtemp(prefix="xbd", dir="/tmp")  # short: containerd's socket path is bounded
        self.sock = os.path.join(self.dir, "docker.sock")
        self.url = f"unix://{self.sock}"
        self.proc: subprocess.Popen | None = None
        self.client = None
        self.bridge = "xbd" + os.path.basename(self.dir)[3:11]  # <= 15 characters, as a link name must be
        self.bridge_made = False

    def start(self, timeout: float = 60.0) -> None:
        self._make_bridge()
        argv = ["dockerd", "-H", self.url, "--data-root", os.path.join(self.dir, "root"),
                "--exec-root", os.path.join(self.dir, "exec"), "--pidfile", os.path.join(self.dir, "docker.pid"),
                "--bridge", self.bridge, "--iptables=false", "--ip-masq=false", "--shutdown-timeout", "2"]
        if os.path.exists(DAEMON_JSON):
            argv += ["--config-file", DAEMON_JSON]
        argv += self.flags
        log = open(os.path.join(self.dir, "dockerd.log"), "ab")  # noqa: SIM115 - the daemon's, closed by close()
        self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)  # noqa: S603
        log.close()
        import docker

        deadline = time.monotonic() + timeout
        while True:
            try:
                client = docker.DockerClient(base_url=self.url, timeout=60)
                client.ping()
                break
            except Exception:  # noqa: BLE001 - not up yet
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"private dockerd did not come up: {self.log_tail()}") from None
                time.sleep(0.1)
        if self.client is not None:
            self.client.close()
        self.client = client

    def _make_bridge(self) -> None:
        if self.bridge_made:
            return
        subnet = 1 + int.from_bytes(os.urandom(1), "big") % 250  # 10.213.N.0/24: boxes here use no network
        for argv in (["ip", "link", "add", "name", self.bridge, "type", "bridge"],
                     ["ip", "addr", "add", f"10.213.{subnet}.1/24", "dev", self.bridge],
                     ["ip", "link", "set", self.bridge, "up"]):
            subprocess.run(argv, check=True, capture_output=True)  # noqa: S603
        self.bridge_made = True

    def stop(self, timeout: float = 60.0) -> None:
        """SIGTERM, as an operator's restart does; waits until the daemon has exited."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)

    def import_image(self, flavor: str = "python") -> str:
        from execbox.boxes import images

        return images.build_image(self.client, images.image_for(flavor))[0]

    def log_tail(self) -> str:
        try:
            with open(os.path.join(self.dir, "dockerd.log"), encoding="utf-8", errors="replace") as f:
                return f.read()[-2000:]
        except OSError:
            return "(no log)"

    def close(self) -> None:
        from execbox.boxes import docker_host

        if "--live-restore" in self.flags and self.proc is not None and self.proc.poll() is not None:
            try:  # its containers outlive a stopped daemon: start it again to remove them
                self.start()
            except Exception:  # noqa: BLE001 - best effort
                pass
        if self.proc is not None and self.proc.poll() is None and self.client is not None:
            try:
                for c in self.client.containers.list(all=True, ignore_removed=True):
                    labels = c.labels or {}
                    c.remove(force=True)
                    docker_host.release_removed(labels)
            except Exception:  # noqa: BLE001 - best effort: the daemon goes next
                pass
        self.stop()
        if self.client is not None:
            self.client.close()
        # dockerd unmounts its overlays on a clean stop; anything a killed one left goes lazily
        for mp in sorted(_mounts_under(self.dir), reverse=True):
            subprocess.run(["umount", "-l", mp], capture_output=True, check=False)  # noqa: S603,S607
        if self.bridge_made:
            subprocess.run(["ip", "link", "del", self.bridge], capture_output=True, check=False)  # noqa: S603,S607
        from execbox.agent.fileops import remove_tree

        remove_tree(self.dir)


def _mounts_under(root: str) -> list[str]:
    found = []
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        for line in f:
            mp = line.split()[4].encode().decode("unicode_escape")
            if mp == root or mp.startswith(root + "/"):
                found.append(mp)
    return found
