"""`podman kube play` of the pod spec the provider generates: a real container runtime reads the real
spec (ConfigMap volume, security context, command, probe port) and the agent answers on the pod IP.

Needs podman (scripts/setup/test/60-podman.sh installs podman and catatonit from Debian), root and
the worker image (copied from dockerd into podman's storage once, ~30 s). podman does not enforce
emptyDir sizeLimit or NetworkPolicies; test_manifests.py covers those fields offline.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid

import pytest
import yaml

from execbox.boxes import k8s_spec as ks
from execbox.boxes.k8s_box import connect_agent
from tests.conftest import require

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]
SETUP = os.path.join(os.path.dirname(__file__), "..", "..", "..", "scripts", "setup", "test", "60-podman.sh")
IMAGE = "execbox/python:latest"


def _podman(*args, env=None, check=True, timeout=120):
    r = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout, env=env)  # noqa: S603,S607
    assert not check or r.returncode == 0, f"podman {' '.join(args)}: {r.stderr[-2000:]}"
    return r


@pytest.fixture(scope="module")
def podman_env(docker_engine, tmp_path_factory):
    if shutil.which("podman") is None and os.geteuid() == 0:
        subprocess.run(["bash", SETUP], check=False, timeout=900)  # noqa: S603,S607
    require(shutil.which("podman") is not None and os.geteuid() == 0, "podman (rootful, Debian package)")
    conf = tmp_path_factory.mktemp("podman") / "containers.conf"
    # podman raises RLIMIT_NOFILE/NPROC to its defaults (1048576); VMs with lower hard limits refuse that.
    conf.write_text('[containers]\ndefault_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]\n')
    env = {**os.environ, "CONTAINERS_CONF": str(conf)}
    want = docker_engine.images.get(IMAGE).id.split(":")[-1]
    have = _podman("image", "inspect", "--format", "{{.Id}}", f"docker.io/{IMAGE}", check=False, env=env)
    if have.returncode != 0 or have.stdout.strip() != want:
        _podman("pull", "-q", f"docker-daemon:{IMAGE}", env=env, timeout=600)
    return env


def test_podman_kube_play_runs_the_generated_pod(podman_env, tmp_path):
    name = f"execbox-podman-{uuid.uuid4().hex[:8]}"
    token = uuid.uuid4().hex
    t = ks.PodTemplate(namespace="execbox-sandboxes", image=f"docker.io/{IMAGE}", preload="none", memory="256Mi")
    cm = ks.agent_configmap(t.namespace)
    pod = ks.pod_manifest(t, name=name, token=token, configmap=cm["metadata"]["name"], labels={}, annotations={})
    spec_file = tmp_path / "pod.yaml"
    spec_file.write_text(yaml.safe_dump_all([cm, pod]))
    try:
        _podman("kube", "play", str(spec_file), env=podman_env)
        infra = _podman("pod", "inspect", name, "--format", "{{.InfraContainerID}}", env=podman_env).stdout.strip()
        ip = _podman("inspect", infra, "--format", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
                     env=podman_env).stdout.strip()
        deadline = time.monotonic() + 30
        while True:
            try:
                client = connect_agent(ip, ks.AGENT_PORT, token, name, timeout=5)
                break
            except Exception:
                assert time.monotonic() < deadline, _podman("logs", f"{name}-agent", check=False).stdout
                time.sleep(0.3)
        v = client.call("exec", {"language": "bash", "code": "id -u; grep CapEff /proc/self/status; touch /x",
                                 "timeout": 10, "output_cap": 4096, "stream": False, "inline_artifacts": False})
        client.close()
        assert v["stdout"].split("\n")[:2] == ["1000", "CapEff:\t0000000000000000"], v
        assert "Read-only file system" in v["stderr"]
        with pytest.raises(Exception):  # noqa: B017 - a wrong secret is refused by the relay
            connect_agent(ip, ks.AGENT_PORT, "wrong" * 8, name, timeout=5)
    finally:
        _podman("pod", "rm", "-f", name, check=False, env=podman_env)
