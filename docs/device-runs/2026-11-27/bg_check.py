"""A jail background process writing 700 MB in total while it is read: it must run to its end (exit 0),
every byte arriving (before the relay, the box's 512 MiB file-size limit killed it)."""
import time
from execbox.providers.jail import JailProvider

p = JailProvider()
p.initialize({"pool_size": 0, "preload": "none"})
iid = p.create_instance(tenant_id="t", session_id="bg").instance_id
pid = p.start_process(iid, "head -c 700000000 /dev/zero; echo done >&2")
out = err = 0
t0 = time.monotonic()
while True:
    v = p.poll_process(iid, pid, out, err)
    out += len(v["stdout"])
    err += len(v["stderr"])
    if v.get("exited"):
        break
    if not v["stdout"]:
        time.sleep(0.01)
print(f"bg: exit {v.get('exit_code')} signal {v.get('signal')} stdout {out} bytes stderr {err} bytes "
      f"in {time.monotonic() - t0:.1f} s")
p.shutdown()
