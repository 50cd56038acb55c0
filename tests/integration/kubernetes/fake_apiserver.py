"""An in-test Kubernetes API server: only the endpoints the provider uses, pods run as real containers.

Implements /version, ConfigMaps (get, create), Pods (create, get, list by label selector,
merge patch, delete) and Events (list by involvedObject.name) under /api/v1/namespaces/<ns>/,
and NetworkPolicies (list; set by the test) under /apis/networking.k8s.io/v1/namespaces/<ns>/,
with bearer-token auth. A pod whose agent ConfigMap is missing waits in ContainerCreating with a
FailedMount event until the ConfigMap exists, as on a kubelet. Each created pod
becomes a Docker container of the pod's image with the pod spec translated (user, read-only
root, dropped capabilities, no-new-privileges, memory/CPU limits, emptyDirs as tmpfs, the
ConfigMap as a read-only bind), on the bridge network, so the pod IP is real and every run in a
test truly executes. The pod turns Ready when its readiness probe port accepts connections,
Failed when its container exits (OOMKilled from Docker's state) or its activeDeadlineSeconds
passes. Faults are injected from the test: 403 per (verb, resource), a delay (API timeout),
pods that are never scheduled, eviction and OOM kills, and deletes held (the pod keeps running,
Ready, with its ``deletionTimestamp`` set, as while a kubelet has not confirmed the delete). Not a
Kubernetes: no scheduler, no watch, no RBAC engine, no NetworkPolicy enforcement.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import shutil
import socket
import tempfile
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

LABEL = "execbox.fake-k8s"


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _quantity(q: str) -> float:
    from kubernetes.utils import parse_quantity

    return float(parse_quantity(q))


def _merge(dst: dict[str, Any], patch: dict[str, Any]) -> None:
    for k, v in patch.items():
        if v is None:
            dst.pop(k, None)
        elif isinstance(v, dict) and isinstance(dst.get(k), dict):
            _merge(dst[k], v)
        else:
            dst[k] = v


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}


class FakePod:
    def __init__(self, body: dict[str, Any]) -> None:
        self.body = body
        self.container: Any = None
        self.deleted = False
        self.started = time.monotonic()
        self.lock = threading.Lock()


class FakeApiServer:
    def __init__(self, docker_client: Any, token: str | None = None) -> None:
        self.docker = docker_client
        self.token = token or uuid.uuid4().hex
        self.id = uuid.uuid4().hex[:8]
        self.pods: dict[tuple[str, str], FakePod] = {}
        self.configmaps: dict[tuple[str, str], dict[str, Any]] = {}
        self.lock = threading.Lock()
        self.forbidden: set[tuple[str, str]] = set()
        self.delay = 0.0
        self.hold_pending = False
        self.hold_deletes = False  # a delete only sets deletionTimestamp until release_deletes()
        self.not_ready: set[str] = set()  # pods whose readiness probe fails (as a kubelet would report)
        self.pod_pids_limit = 128
        self.requests: list[tuple[str, str]] = []
        self.events: list[dict[str, Any]] = []
        self.network_policies: dict[str, list[dict[str, Any]]] = {}  # namespace -> NetworkPolicy objects
        self.created: list[dict[str, Any]] = []
        self.tmp = tempfile.mkdtemp(prefix="execbox-fk8s-")
        os.chmod(self.tmp, 0o755)
        handler = type("Handler", (_Handler,), {"fake": self})
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    # -- test side --------------------------------------------------------------------------
    def kubeconfig(self, path: str) -> str:
        with open(path, "w", encoding="utf-8") as fh:
            json.dump({"apiVersion": "v1", "kind": "Config", "current-context": "fake",
                       "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
                       "users": [{"name": "fake", "user": {"token": self.token}}],
                       "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}]}, fh)
        return path

    def pod(self, name: str, ns: str = "execbox-sandboxes") -> dict[str, Any] | None:
        p = self.pods.get((ns, name))
        return p.body if p else None

    def pod_names(self, ns: str = "execbox-sandboxes") -> list[str]:
        with self.lock:
            return sorted(n for (pns, n) in self.pods if pns == ns)

    def containers(self) -> list[Any]:
        """This fake's containers (id, name, status) from one list call: no per-container inspect races."""
        from types import SimpleNamespace

        return [SimpleNamespace(id=c["Id"], name=c["Names"][0].lstrip("/"), status=c["State"])
                for c in self.docker.api.containers(all=True, filters={"label": f"{LABEL}={self.id}"})]

    def end_pod(self, name: str, *, reason: str, ns: str = "execbox-sandboxes") -> None:
        """Kill a pod's container and record why: 'Evicted' (pod-level) or 'OOMKilled' (container)."""
        p = self.pods[(ns, name)]
        with p.lock:
            st = p.body["status"]
            if reason == "Evicted":
                st["reason"], st["message"] = "Evicted", "The node was low on resource: memory."
            p.body["metadata"].setdefault("annotations", {})["fake/terminated-reason"] = reason
        if p.container is not None:
            try:
                p.container.kill()
            except Exception:  # noqa: BLE001
                pass

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        for c in self.containers():
            try:
                self.docker.api.remove_container(c.id, force=True)
            except Exception:  # noqa: BLE001
                pass
        shutil.rmtree(self.tmp, ignore_errors=True)

    # -- pods -------------------------------------------------------------------------------
    def create_pod(self, ns: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        meta = body.setdefault("metadata", {})
        name = meta.get("name") or f"{meta.get('generateName', 'pod-')}{uuid.uuid4().hex[:5]}"
        meta.update({"name": name, "namespace": ns, "uid": str(uuid.uuid4()), "creationTimestamp": _now(),
                     "resourceVersion": "1"})
        body["status"] = {"phase": "Pending", "conditions": [
            {"type": "PodScheduled", "status": "False" if self.hold_pending else "True",
             **({"reason": "Unschedulable", "message": "0/1 nodes are available: insufficient cpu."}
                if self.hold_pending else {})}]}
        with self.lock:
            if (ns, name) in self.pods:
                return 409, _status(409, "AlreadyExists", f'pods "{name}" already exists')
            pod = FakePod(body)
            self.pods[(ns, name)] = pod
            self.created.append(json.loads(json.dumps(body)))
        if not self.hold_pending:
            threading.Thread(target=self._run_pod, args=(ns, pod), daemon=True).start()
        return 201, body

    def delete_pod(self, ns: str, name: str) -> tuple[int, dict[str, Any]]:
        with self.lock:
            pod = self.pods.get((ns, name)) if self.hold_deletes else self.pods.pop((ns, name), None)
        if pod is None:
            return 404, _status(404, "NotFound", f'pods "{name}" not found')
        if self.hold_deletes:  # accepted, not done: the pod runs on (and stays Ready)
            with pod.lock:
                meta = pod.body["metadata"]
                meta.setdefault("deletionTimestamp", _now())
                meta["deletionGracePeriodSeconds"] = 0
                return 200, json.loads(json.dumps(pod.body))
        with pod.lock:
            pod.deleted = True
            container = pod.container
        if container is not None:
            threading.Thread(target=self._remove, args=(container,), daemon=True).start()
        return 200, pod.body

    def release_deletes(self) -> None:
        """Stop holding deletes and finish those held (pods with a ``deletionTimestamp``)."""
        self.hold_deletes = False
        with self.lock:
            held = [(ns, n) for (ns, n), p in self.pods.items() if p.body["metadata"].get("deletionTimestamp")]
        for ns, name in held:
            self.delete_pod(ns, name)

    @staticmethod
    def _remove(container: Any) -> None:
        try:
            container.remove(force=True)
        except Exception:  # noqa: BLE001
            pass

    def _set_waiting(self, pod: FakePod, reason: str, message: str) -> None:
        c = pod.body["spec"]["containers"][0]
        pod.body["status"]["containerStatuses"] = [{
            "name": c["name"], "image": c["image"], "imageID": "", "ready": False, "restartCount": 0,
            "started": False, "state": {"waiting": {"reason": reason, "message": message}}}]

    def _run_pod(self, ns: str, pod: FakePod) -> None:
        import docker.errors

        try:
            self._run_pod_inner(ns, pod)
        except docker.errors.NotFound:
            if not pod.deleted:  # the container vanished under a live pod: report it like a kubelet
                with pod.lock:
                    pod.body["status"].update({"phase": "Failed", "reason": "ContainerMissing"})

    def _run_pod_inner(self, ns: str, pod: FakePod) -> None:
        import docker.errors

        spec = pod.body["spec"]
        c = spec["containers"][0]
        try:
            self.docker.images.get(c["image"])
        except docker.errors.ImageNotFound:
            with pod.lock:
                self._set_waiting(pod, "ErrImagePull", f'failed to pull image "{c["image"]}": not found')
            return
        cms = [v["configMap"]["name"] for v in spec.get("volumes") or [] if "configMap" in v]
        while not pod.deleted and any((ns, cm) not in self.configmaps for cm in cms):
            with pod.lock:
                if not pod.body["status"].get("containerStatuses"):
                    self._set_waiting(pod, "ContainerCreating", "")
                    missing = next(cm for cm in cms if (ns, cm) not in self.configmaps)
                    self.events.append({"metadata": {"name": f"{pod.body['metadata']['name']}.{uuid.uuid4().hex[:6]}",
                                                     "namespace": ns},
                                        "involvedObject": {"kind": "Pod", "name": pod.body["metadata"]["name"]},
                                        "type": "Warning", "reason": "FailedMount",
                                        "message": f'MountVolume.SetUp failed for volume "agent" : configmap '
                                                   f'"{missing}" not found'})
            time.sleep(0.2)
        if pod.deleted:
            return
        kwargs = self._docker_kwargs(ns, pod.body)
        with pod.lock:
            if pod.deleted:
                return
            pod.body["status"].pop("containerStatuses", None)
            pod.container = self.docker.containers.create(**kwargs)
            pod.body["status"]["startTime"] = _now()
        pod.container.start()
        pod.started = time.monotonic()
        port = (c.get("readinessProbe") or {}).get("tcpSocket", {}).get("port")
        ip = ""
        while True:
            if pod.deleted:
                return
            pod.container.reload()
            state = pod.container.attrs["State"]
            ip = ip or pod.container.attrs["NetworkSettings"].get("IPAddress", "")
            deadline = pod.body["spec"].get("activeDeadlineSeconds")
            if deadline and time.monotonic() - pod.started > deadline and state["Running"]:
                with pod.lock:
                    pod.body["status"].update({"reason": "DeadlineExceeded",
                                               "message": f"Pod was active on the node longer than the specified "
                                                          f"deadline ({deadline}s)"})
                pod.container.kill()
                continue
            if not state["Running"]:
                self._terminated(pod, state)
                return
            ready = bool(ip and port and pod.body["metadata"]["name"] not in self.not_ready and _accepts(ip, int(port)))
            with pod.lock:
                st = pod.body["status"]
                st.update({"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}], "hostIP": "127.0.0.1"})
                st["conditions"] = [{"type": "PodScheduled", "status": "True"},
                                    {"type": "Ready", "status": "True" if ready else "False"}]
                st["containerStatuses"] = [{
                    "name": c["name"], "image": c["image"], "imageID": pod.container.image.id, "ready": ready,
                    "restartCount": 0, "started": True,
                    "state": {"running": {"startedAt": st["startTime"]}}}]
            time.sleep(0.1 if not ready else 0.3)

    def _terminated(self, pod: FakePod, state: dict[str, Any]) -> None:
        with pod.lock:
            forced = (pod.body["metadata"].get("annotations") or {}).get("fake/terminated-reason")
            code = int(state.get("ExitCode") or 0)
            if forced == "OOMKilled" or state.get("OOMKilled"):
                reason, code = "OOMKilled", 137
            else:
                reason = "Completed" if code == 0 else "Error"
            st = pod.body["status"]
            st["phase"] = "Succeeded" if code == 0 and not st.get("reason") else "Failed"
            st["conditions"] = [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "False"}]
            c = pod.body["spec"]["containers"][0]
            st["containerStatuses"] = [{
                "name": c["name"], "image": c["image"], "imageID": "", "ready": False, "restartCount": 0,
                "state": {"terminated": {"exitCode": code, "reason": reason, "finishedAt": _now()}}}]

    def _docker_kwargs(self, ns: str, body: dict[str, Any]) -> dict[str, Any]:
        """The pod spec as Docker sees it: every hardening field the spec sets, mapped one to one."""
        from docker.types import Mount

        spec = body["spec"]
        c = spec["containers"][0]
        psc, sc = spec.get("securityContext") or {}, c.get("securityContext") or {}
        uid = sc.get("runAsUser", psc.get("runAsUser"))
        gid = sc.get("runAsGroup", psc.get("runAsGroup", uid))
        fs_group = psc.get("fsGroup", gid)
        volumes = {v["name"]: v for v in spec.get("volumes") or []}
        mounts, tmpfs = [], {}
        for vm in c.get("volumeMounts") or []:
            vol = volumes[vm["name"]]
            if "emptyDir" in vol:
                size = int(_quantity(vol["emptyDir"].get("sizeLimit", "64Mi")))
                tmpfs[vm["mountPath"]] = f"size={size},uid={uid},gid={fs_group},mode=2770"
            elif "configMap" in vol:
                data = self.configmaps[(ns, vol["configMap"]["name"])]["data"]
                d = os.path.join(self.tmp, f"{body['metadata']['name']}-{vm['name']}")
                os.makedirs(d, exist_ok=True)
                for fname, text in data.items():
                    with open(os.path.join(d, fname), "w", encoding="utf-8") as fh:
                        fh.write(text)
                    os.chmod(os.path.join(d, fname), vol["configMap"].get("defaultMode", 0o644))
                os.chmod(d, 0o755)
                mounts.append(Mount(target=vm["mountPath"], source=d, type="bind", read_only=True))
        limits = (c.get("resources") or {}).get("limits") or {}
        argv = list(c.get("command") or []) + list(c.get("args") or [])
        return {
            "image": c["image"], "command": argv, "name": f"execbox-fk8s-{self.id}-{body['metadata']['name']}"[:120],
            "labels": {LABEL: self.id}, "environment": {e["name"]: e.get("value", "") for e in c.get("env") or []},
            "user": f"{uid}:{gid}" if uid is not None else None, "working_dir": c.get("workingDir"),
            "read_only": bool(sc.get("readOnlyRootFilesystem")),
            "cap_drop": ["ALL"] if "ALL" in ((sc.get("capabilities") or {}).get("drop") or []) else None,
            "security_opt": ["no-new-privileges"] if sc.get("allowPrivilegeEscalation") is False else None,
            "privileged": bool(sc.get("privileged")),
            "runtime": "runsc" if spec.get("runtimeClassName") == "gvisor" else "runc",
            "mem_limit": int(_quantity(limits["memory"])) if "memory" in limits else None,
            "nano_cpus": int(_quantity(limits["cpu"]) * 1e9) if "cpu" in limits else None,
            # Kubernetes has no per-pod pids field: the kubelet's podPidsLimit (a node setting that
            # docs/kubernetes.md asks for) bounds every pod. This fake's node sets it like that.
            "pids_limit": self.pod_pids_limit,
            "tmpfs": tmpfs, "mounts": mounts, "network_mode": "bridge", "detach": True,
        }


def _accepts(ip: str, port: int) -> bool:
    try:
        with socket.create_connection((ip, port), timeout=0.2):
            return True
    except OSError:
        return False


def _selector_matches(selector: str, labels: dict[str, str]) -> bool:
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            k, v = term.split("!=", 1)
            if labels.get(k) == v:
                return False
        elif "=" in term:
            k, v = term.split("=", 1)
            if labels.get(k) != v.lstrip("="):
                return False
        elif term not in labels:
            return False
    return True


POD = re.compile(r"^/api/v1/namespaces/([^/]+)/(pods|configmaps|events)(?:/([^/]+))?$")
NETPOL = re.compile(r"^/apis/networking\.k8s\.io/v1/namespaces/([^/]+)/(networkpolicies)(?:/([^/]+))?$")
VERBS = {"GET": "get", "POST": "create", "PATCH": "patch", "DELETE": "delete"}


class _Handler(BaseHTTPRequestHandler):
    fake: FakeApiServer
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def _reply(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _handle(self) -> None:
        fake = self.fake
        path, _, query = self.path.partition("?")
        params = dict(p.split("=", 1) for p in query.split("&") if "=" in p)
        from urllib.parse import unquote

        fake.requests.append((self.command, path))
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if fake.delay:
            time.sleep(fake.delay)
        if self.headers.get("Authorization") != f"Bearer {fake.token}":
            return self._reply(401, _status(401, "Unauthorized", "Unauthorized"))
        if path.rstrip("/") == "/version":
            return self._reply(200, {"major": "1", "minor": "31", "gitVersion": "v1.31.0-fake"})
        m = POD.match(path) or NETPOL.match(path)
        if not m:
            return self._reply(404, _status(404, "NotFound", f"the fake API server does not serve {path}"))
        ns, resource, name = m.group(1), m.group(2), m.group(3)
        verb = VERBS.get(self.command, "?")
        if verb == "get" and name is None:
            verb = "list"
        if (verb, resource) in fake.forbidden:
            return self._reply(403, _status(403, "Forbidden", f'{resource} is forbidden: User '
                                            f'"system:serviceaccount:execbox:gateway" cannot {verb} resource '
                                            f'"{resource}" in API group "" in the namespace "{ns}"'))
        body = json.loads(raw) if raw else {}
        if resource in ("events", "networkpolicies") and verb == "list":
            field = unquote(params.get("fieldSelector", ""))
            items = (fake.network_policies.get(ns, []) if resource == "networkpolicies" else
                     [e for e in fake.events if e["metadata"]["namespace"] == ns and
                      (not field or field == f"involvedObject.name={e['involvedObject']['name']}")])
            kind = "NetworkPolicyList" if resource == "networkpolicies" else "EventList"
            return self._reply(200, {"kind": kind, "metadata": {}, "items": items})
        if resource == "configmaps":
            if verb == "create":
                key = (ns, body["metadata"]["name"])
                if key in fake.configmaps:
                    return self._reply(409, _status(409, "AlreadyExists", "exists"))
                fake.configmaps[key] = body
                return self._reply(201, body)
            if verb == "get" and (ns, name) in fake.configmaps:
                return self._reply(200, fake.configmaps[(ns, name)])
            return self._reply(404, _status(404, "NotFound", f'configmaps "{name}" not found'))
        if verb == "create":
            return self._reply(*fake.create_pod(ns, body))
        if verb == "list":
            selector = unquote(params.get("labelSelector", ""))
            with fake.lock:
                items = [p for (pns, _), p in fake.pods.items() if pns == ns]
            out = []
            for p in items:
                with p.lock:
                    if _selector_matches(selector, p.body["metadata"].get("labels") or {}):
                        out.append(json.loads(json.dumps(p.body)))
            return self._reply(200, {"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": out})
        if verb == "delete":
            return self._reply(*fake.delete_pod(ns, name))
        pod = fake.pods.get((ns, name))
        if pod is None:
            return self._reply(404, _status(404, "NotFound", f'pods "{name}" not found'))
        with pod.lock:
            if verb == "patch":
                old = pod.body["spec"].get("activeDeadlineSeconds")
                new = (body.get("spec") or {}).get("activeDeadlineSeconds", old)
                if old is not None and (new is None or new > old):
                    return self._reply(422, _status(422, "Invalid", "spec.activeDeadlineSeconds: Invalid value: "
                                                    "must be less than or equal to the previous value"))
                if set(body.get("spec") or {}) - {"activeDeadlineSeconds"}:
                    return self._reply(422, _status(422, "Invalid", "pod updates may not change fields other "
                                                    "than activeDeadlineSeconds, image, tolerations"))
                _merge(pod.body, body)
            return self._reply(200, json.loads(json.dumps(pod.body)))

    do_GET = do_POST = do_PATCH = do_DELETE = _handle
