"""GPU passthrough check on a real NVIDIA host (run by scripts/verify_gpu.sh; prints PASS/FAIL lines).

1. jail, gpu=all: inside the box, the CUDA driver API (libcuda via ctypes) finds the devices and
   round-trips memory; if the box's Python runtime has torch, torch reports the device and a
   matrix product on the GPU matches the CPU's;
2. jail without the opt-in: no /dev/nvidia* and cuInit reports no device;
3. Docker runc (device request) and runsc (nvproxy) when the host has the NVIDIA Container
   Toolkit / an nvproxy-enabled runsc; otherwise SKIP with the reason.
"""

from __future__ import annotations

import json
import os
import sys
import time

PROBE = r'''
import ctypes, json, os
out = {"dev_nodes": sorted(n for n in os.listdir("/dev") if n.startswith("nvidia"))}
try:
    cuda = ctypes.CDLL("libcuda.so.1")
    rc = cuda.cuInit(0)
    out["cuInit"] = rc
    if rc == 0:
        n = ctypes.c_int()
        cuda.cuDeviceGetCount(ctypes.byref(n))
        out["devices"] = n.value
        names = []
        for i in range(n.value):
            dev = ctypes.c_int()
            cuda.cuDeviceGet(ctypes.byref(dev), i)
            buf = ctypes.create_string_buffer(256)
            cuda.cuDeviceGetName(buf, 256, dev)
            names.append(buf.value.decode())
        out["names"] = names
        dev = ctypes.c_int()
        cuda.cuDeviceGet(ctypes.byref(dev), 0)
        ctx = ctypes.c_void_p()
        cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev)
        size = 1 << 20
        src = (ctypes.c_ubyte * size)(*([7] * 16))
        dst = (ctypes.c_ubyte * size)()
        ptr = ctypes.c_uint64()
        rcs = [cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(size)),
               cuda.cuMemcpyHtoD_v2(ptr, src, ctypes.c_size_t(size)),
               cuda.cuMemcpyDtoH_v2(dst, ptr, ctypes.c_size_t(size)),
               cuda.cuMemFree_v2(ptr)]
        out["memcpy_roundtrip"] = rcs == [0, 0, 0, 0] and bytes(dst[:16]) == bytes([7] * 16)
except OSError as e:
    out["libcuda"] = str(e)
try:
    import time
    t = time.monotonic()
    import torch
    out["torch"] = torch.__version__
    out["torch_import_s"] = round(time.monotonic() - t, 2)
    out["torch_cuda"] = torch.cuda.is_available()
    if out["torch_cuda"]:
        out["torch_device"] = torch.cuda.get_device_name(0)
        a, b = torch.randn(512, 512), torch.randn(512, 512)
        gpu = (a.cuda() @ b.cuda()).cpu()
        out["matmul_matches_cpu"] = bool(torch.allclose(gpu, a @ b, atol=1e-3))
        out["torch_first_cuda_s"] = round(time.monotonic() - t, 2)
        # GPU memory is the driver's, not the box's: max_memory (RLIMIT_DATA, memory.max) bounds host
        # memory only. Allocate more than the box's max_memory on the device to record that.
        try:
            big = torch.empty(int(os.environ.get("GPU_ALLOC_GIB", "8")) << 30, dtype=torch.uint8, device="cuda")
            big.fill_(1)
            torch.cuda.synchronize()
            out["gpu_alloc_gib"] = int(big.numel() >> 30)
            del big
        except Exception as e:  # noqa: BLE001
            out["gpu_alloc_error"] = f"{type(e).__name__}: {str(e)[:200]}"
        _free, total = torch.cuda.mem_get_info()
        out["gpu_mem_total_gib"] = round(total / (1 << 30), 1)
        with open("/proc/self/status") as f:
            out["vm_peak_rss"] = [ln.split(":")[1].strip() for ln in f if ln.startswith(("VmPeak", "VmHWM"))]
except ImportError:
    out["torch"] = None
print(json.dumps(out))
'''

DIAG = r'''
import ctypes, json, os, resource, sys
out = {"uid": os.getuid()}
for arg in sys.argv[1:]:  # limits as the agent sets them for a run: data=BYTES nofile=N
    name, value = arg.split("=")
    which = {"data": resource.RLIMIT_DATA, "nofile": resource.RLIMIT_NOFILE}[name]
    resource.setrlimit(which, (int(value), int(value)))
    out[name] = int(value)
for n in ("nvidiactl", "nvidia0", "nvidia-uvm"):
    try:
        st = os.stat("/dev/" + n)
        out[n] = f"uid={st.st_uid} mode={oct(st.st_mode & 0o7777)}"
        os.close(os.open("/dev/" + n, os.O_RDWR))
        out[n] += " open=ok"
    except OSError as e:
        out[n] = out.get(n, "") + f" errno={e.errno}"
try:
    with open("/proc/driver/nvidia/params") as f:
        out["params"] = [ln.strip() for ln in f if ln.startswith(("ModifyDevice", "DeviceFileUID", "DeviceFileMode"))]
except OSError as e:
    out["params"] = f"errno={e.errno}"
out["sys_pci"] = os.path.isdir("/sys/bus/pci/devices")
try:
    out["cuInit"] = ctypes.CDLL("libcuda.so.1").cuInit(0)
except OSError as e:
    out["libcuda"] = str(e)
print(json.dumps(out))
'''

results: list[tuple[str, str, str]] = []


def diagnose(memory: int) -> None:
    """Where a box loses the GPU: the same probe (device nodes, driver params, cuInit) under one
    more of the jail's layers per step, so the first step whose cuInit is not 0 names the cause.
    Fixed argv lists only (no shell); runs only when the jail check failed."""
    import glob
    import subprocess

    from execbox.boxes import seccomp

    nobody = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"]
    nodes = sorted(n for n in glob.glob("/dev/nvidia*") + glob.glob("/dev/nvidia-caps/*") if not os.path.isdir(n))
    dev_binds = [a for n in nodes for a in ("--dev-bind", n, n)]
    userns = ["bwrap", "--unshare-user", "--unshare-pid", "--uid", "1000", "--gid", "1000", "--bind", "/", "/"]
    jail_flags = ["--unshare-all", "--disable-userns", "--cap-drop", "ALL", "--new-session", "--as-pid-1"]
    remount_ro = [a for n in nodes for a in ("--remount-ro", n)]
    fresh_dev = [*nobody, *userns, "--dev", "/dev", *dev_binds, "--proc", "/proc"]
    fd = seccomp.bpf_fd()
    steps = [
        ("host, root", []),
        ("host, uid 65534", nobody),
        ("bwrap, mount namespace only, host /dev", ["bwrap", "--bind", "/", "/", "--dev-bind", "/dev", "/dev"]),
        ("+ uid 65534, user and pid namespaces", [*nobody, *userns, "--dev-bind", "/dev", "/dev", "--proc", "/proc"]),
        ("+ a fresh /dev with the NVIDIA nodes bound", fresh_dev),
        ("+ no /sys", [*fresh_dev, "--tmpfs", "/sys"]),
        ("+ execbox's seccomp filter", [*fresh_dev, "--seccomp", str(fd)]),
        ("+ an empty environment", [*fresh_dev, "--seccomp", str(fd), "--clearenv"]),
        ("+ the jail's other namespaces and flags", [*fresh_dev, "--seccomp", str(fd), "--clearenv", *jail_flags]),
        ("+ read-only device mounts", [*fresh_dev, "--seccomp", str(fd), "--clearenv", *jail_flags, *remount_ro]),
    ]
    limited = [  # the same, plus the run's limits (apply_rlimits): which one, if any, costs the GPU
        ("+ RLIMIT_NOFILE 1024", ["nofile=1024"]),
        (f"+ RLIMIT_DATA {memory >> 20} MiB (max_memory)", [f"data={memory}"]),
        ("+ RLIMIT_DATA 64 GiB", [f"data={64 << 30}"]),
    ]
    print("--- diagnosis: one jail layer more per step", flush=True)
    last = steps[-1][1]
    try:
        for label, prefix, args in [(*st, []) for st in steps] + [(lb, last, a) for lb, a in limited]:
            os.lseek(fd, 0, os.SEEK_SET)
            r = subprocess.run([*prefix, "/usr/bin/python3", "-I", "-c", DIAG, *args], capture_output=True,
                               text=True, timeout=120, pass_fds=(fd,))
            print(f"{label}: {r.stdout.strip() or r.stderr.strip()[-400:]}", flush=True)
    finally:
        os.close(fd)


def record(name: str, ok: bool | None, detail: str) -> None:
    status = "SKIP" if ok is None else ("PASS" if ok else "FAIL")
    results.append((status, name, detail))
    print(f"{status}: {name}: {detail}", flush=True)


def probe(provider, label: str) -> dict:
    inst = provider.create_instance(tenant_id="gpu-verify")
    try:
        r = provider.execute_code(inst.instance_id, PROBE, "python", 300)
        print(f"--- {label}: exit {r.exit_code}\n{r.stdout}{r.stderr[-2000:]}", flush=True)
        return json.loads(r.stdout) if r.exit_code == 0 else {"error": r.stderr[-500:]}
    finally:
        provider.destroy_instance(inst.instance_id)


def check_gpu_box(name: str, out: dict) -> None:
    ok = out.get("cuInit") == 0 and out.get("devices", 0) >= 1 and out.get("memcpy_roundtrip") is True
    record(f"{name}: CUDA driver API", ok, json.dumps({k: out.get(k) for k in
                                                      ("dev_nodes", "cuInit", "devices", "names", "memcpy_roundtrip")}))
    if out.get("torch"):
        record(f"{name}: torch", bool(out.get("torch_cuda") and out.get("matmul_matches_cpu")),
               f"torch {out['torch']} cuda={out.get('torch_cuda')} device={out.get('torch_device')} "
               f"matmul_matches_cpu={out.get('matmul_matches_cpu')}")
        print("INFO: torch in the box:", json.dumps({k: out.get(k) for k in (
            "torch_import_s", "torch_first_cuda_s", "gpu_alloc_gib", "gpu_alloc_error", "gpu_mem_total_gib",
            "vm_peak_rss")}), flush=True)
    else:
        record(f"{name}: torch", None, "torch is not in the box's runtime (EXECBOX_GPU_RUNTIME names one that has it)")


def outcome(r) -> str:  # noqa: ANN001 - an ExecutionResult
    """A run's stdout, or its exit code and the end of its stderr when it failed."""
    return r.stdout.strip() if r.exit_code == 0 else f"exit {r.exit_code}: {r.stderr[-300:]}"


TORCH_RUN = (
    "import sys\nwarm = 'torch' in sys.modules\nimport torch\n"
    "x = torch.ones(1 << 20, device='cuda')\nprint(warm, int(x.sum().item()))"
)


def torch_sessions(base: dict) -> None:
    """Three session runs that import torch and use CUDA, with ``preload`` none and auto,torch.

    Each run is a fresh child forked from the agent: with torch preloaded the child inherits the
    import, and CUDA (never initialised in the agent) starts in the child. Times are wall ms of
    ``execute_code`` as the service sees them."""
    from execbox.providers.jail import JailProvider

    for preload in ("none", "auto,torch"):
        p = JailProvider()
        p.initialize({**base, "gpu": "all", "preload": preload})
        try:
            t = time.monotonic()
            inst = p.create_instance(tenant_id="gpu-verify", session_id=f"torch-{preload.replace(',', '-')}")
            made = (time.monotonic() - t) * 1000
            preloaded = p._instances[inst.instance_id].box.hello.get("preloaded")
            runs, outs = [], []
            for _ in range(3):
                t = time.monotonic()
                r = p.execute_code(inst.instance_id, TORCH_RUN, "python", 300)
                runs.append(round((time.monotonic() - t) * 1000))
                outs.append(outcome(r))
            want = f"{'torch' in preload} {1 << 20}"
            record(f"jail session, preload {preload}: torch + CUDA in each run", all(o == want for o in outs),
                   f"session create {made:.0f} ms (preloaded {preloaded}); runs {runs} ms; outputs {outs}")
            p.destroy_instance(inst.instance_id)
        finally:
            p.shutdown()


RESIDUE_WRITE = (
    "import torch\nx = torch.full((4 << 30,), 0x5A, dtype=torch.uint8, device='cuda')\n"
    "torch.cuda.synchronize()\nprint(int((x == 0x5A).sum()))"
)
RESIDUE_READ = (
    "import torch\ny = torch.empty((4 << 30,), dtype=torch.uint8, device='cuda')\n"
    "torch.cuda.synchronize()\nprint(int((y == 0x5A).sum()), int((y != 0).sum()))"
)


def gpu_memory_residue(base: dict) -> None:
    """One tenant's box fills 4 GiB of GPU memory with a byte and ends; another tenant's new box
    allocates 4 GiB without initialising it and counts that byte: the driver must hand out device
    memory cleared (or at least not the previous context's contents)."""
    from execbox.providers.jail import JailProvider

    p = JailProvider()
    p.initialize({**base, "gpu": "all"})
    try:
        outs = []
        for tenant, code in (("tenant-a", RESIDUE_WRITE), ("tenant-b", RESIDUE_READ)):
            inst = p.create_instance(tenant_id=tenant)
            r = p.execute_code(inst.instance_id, code, "python", 300)
            outs.append(outcome(r))
            p.destroy_instance(inst.instance_id)
        wrote, read = outs[0].split(), outs[1].split()
        ok = len(wrote) == 1 and wrote[0] == str(4 << 30) and len(read) == 2 and read[0] == "0"
        record("a new box does not see GPU memory another box left", ok,
               f"tenant-a wrote {outs[0]} bytes of 0x5A; tenant-b found 0x5A, non-zero bytes: {outs[1]}")
    finally:
        p.shutdown()


def main() -> int:
    from execbox.providers.jail import JailProvider

    runtime = os.environ.get("EXECBOX_GPU_RUNTIME", "system")
    base = {"max_memory": "4g", "pool_size": 0, "preload": "none", "runtime": runtime, "pids_limit": 512}
    p = JailProvider()
    p.initialize({**base, "gpu": "all"})
    try:
        print("jail argv GPU part:", p._settings.device_args if p._settings else None)
        out = probe(p, "jail gpu=all")
        check_gpu_box("jail gpu=all", out)
    finally:
        p.shutdown()
    if out.get("torch_cuda"):
        torch_sessions(base)
        gpu_memory_residue(base)
    if out.get("cuInit") != 0:
        diagnose(p._settings.memory_bytes if p._settings else 4 << 30)
        p = JailProvider()
        p.initialize({**base, "gpu": "all", "max_memory": "64g"})
        try:
            probe(p, "diagnosis: the jail box again, max_memory 64g (RLIMIT_DATA and memory.max)")
        finally:
            p.shutdown()
    p = JailProvider()
    p.initialize(base)
    try:
        out = probe(p, "jail without opt-in")
        record("jail without opt-in sees no GPU", out.get("dev_nodes") == [] and out.get("cuInit") != 0,
               json.dumps({k: out.get(k) for k in ("dev_nodes", "cuInit", "libcuda")}))
    finally:
        p.shutdown()
    try:
        import docker

        client = docker.from_env(timeout=10)
        runtimes = set(client.info().get("Runtimes") or {})
    except Exception as e:  # noqa: BLE001
        record("docker", None, f"no Docker engine: {e}")
        runtimes = set()
    for rt in ("runc", "runsc"):
        if rt not in runtimes:
            if runtimes:
                record(f"docker {rt}", None, "runtime not registered")
            continue
        from execbox.providers.docker import DockerProvider  # needs the docker SDK: only with an engine

        p = DockerProvider()
        try:
            p.initialize({"runtime": rt, "pool_size": 0, "gpu": "all", "max_memory": "4g"})
            check_gpu_box(f"docker {rt} gpu=all", probe(p, f"docker {rt}"))
        except Exception as e:  # noqa: BLE001 - toolkit / nvproxy missing is reported, not raised
            record(f"docker {rt} gpu=all", None, f"{type(e).__name__}: {e}")
        finally:
            p.shutdown()
    failed = [r for r in results if r[0] == "FAIL"]
    print("SUMMARY:", "FAIL" if failed else "PASS", f"({len(results)} checks, {len(failed)} failed, "
          f"{sum(r[0] == 'SKIP' for r in results)} skipped)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
