"""`execbox serve` as a subprocess: first-start admin token printed once, jail chosen, clean shutdown."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx

from .conftest import free_port, registry_workspaces, traversable_tmpdir

EXECBOX = os.path.join(os.path.dirname(sys.executable), "execbox")


def _serve(env: dict[str, str], *args: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([EXECBOX, "serve", "--port", str(port), *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return proc, f"http://127.0.0.1:{port}"


def _wait_ready(proc: subprocess.Popen, url: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise AssertionError("execbox serve did not come up")


def _stop(proc: subprocess.Popen) -> str:
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    return err


def test_first_start_prints_an_admin_token_once_and_serves_on_jail(jail_provider) -> None:
    base = traversable_tmpdir("execbox-serve-")
    env = {**os.environ, "EXECBOX_DATA_DIR": os.path.join(base, "data"),
           "EXECBOX_WORKSPACES_DIR": os.path.join(base, "ws"), "SANDBOX_TYPE": "jail"}
    proc, url = _serve(env)
    try:
        _wait_ready(proc, url)
        assert httpx.get(f"{url}/readyz").json()["provider"] == "jail"
    finally:
        err = _stop(proc)
    token = next(line.strip() for line in err.splitlines() if line.strip().startswith("ebx_"))
    assert "created an admin token" in err and err.count(token) == 1

    proc, url = _serve(env)
    try:
        _wait_ready(proc, url)
        r = httpx.post(f"{url}/v1/sandbox/execute", headers={"Authorization": f"Bearer {token}"},
                       json={"code": "print(6 * 7)", "session_id": "cli"}, timeout=60)
        assert r.status_code == 200 and r.json()["stdout"] == "42\n" and r.json()["metadata"]["isolation"] == "jail"
        assert httpx.get(f"{url}/api/admin/sandbox/providers", headers={"Authorization": f"Bearer {token}"}
                         ).status_code == 200
    finally:
        err = _stop(proc)
    assert "created an admin token" not in err and token not in err  # second start: nothing printed
    assert '"operation": "execute_code"' in err  # one JSON log line per execution
    ws = registry_workspaces(os.path.join(base, "ws"), os.path.join(base, "data"))
    assert os.listdir(os.path.join(ws, "default")) == ["cli"]  # the session survives a shutdown


def test_serve_refuses_the_unisolated_provider_off_loopback() -> None:
    base = traversable_tmpdir("execbox-serve-")
    env = {**os.environ, "EXECBOX_DATA_DIR": os.path.join(base, "data"), "SANDBOX_TYPE": "local"}
    proc = subprocess.run([EXECBOX, "serve", "--host", "0.0.0.0", "--port", str(free_port())], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "--allow-no-isolation" in proc.stderr


def test_open_run_serves_ragflow_run_without_a_token_on_loopback_only() -> None:
    import base64

    base = traversable_tmpdir("execbox-serve-")
    env = {**os.environ, "EXECBOX_DATA_DIR": os.path.join(base, "data"), "SANDBOX_TYPE": "local"}
    body = {"code_b64": base64.b64encode(b"def main():\n    return 6 * 7\n").decode(), "language": "python",
            "arguments": {}}
    proc, url = _serve(env)
    try:
        _wait_ready(proc, url)
        assert httpx.post(f"{url}/run", json=body, timeout=60).status_code == 401  # token by default
    finally:
        _stop(proc)
    proc, url = _serve(env, "--open-run")
    try:
        _wait_ready(proc, url)
        r = httpx.post(f"{url}/run", json=body, timeout=60)
        assert r.status_code == 200 and r.json()["result"]["value"] == 42
        assert httpx.get(f"{url}/v1/sandbox/sessions", timeout=10).status_code == 401  # only /run is open
    finally:
        _stop(proc)
    refused = subprocess.run([EXECBOX, "serve", "--open-run", "--host", "0.0.0.0", "--port", str(free_port())],
                             env=env, capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0 and "loopback" in refused.stderr
