"""An in-session install puts the session's policy back when it ends; a narrowing that lands while
it does so is not overwritten by the older, wider policy (the restore reads and writes under the
instance's egress lock, as a narrowing does)."""

from __future__ import annotations

import threading
import types

from execbox.egress.gateway import BoxLink, Limits
from execbox.egress.policy import parse_policy
from execbox.providers import install
from execbox.providers.agent_backed import Instance
from execbox.providers.agent_egress import AgentEgressMixin


def test_a_narrowing_during_the_restore_is_not_undone(monkeypatch):
    link = BoxLink("b", parse_policy("none"), Limits(), None, None)
    inst = Instance("i", types.SimpleNamespace(net=types.SimpleNamespace(link=link)), "t", "s")
    narrowed: list[dict] = []

    class P(AgentEgressMixin):
        name = "jail"
        config = {"max_timeout": 60}
        egress_cap = parse_policy("allowlist", ["api.example.com", "203.0.113.0/24"])

        def _get(self, _iid):
            return inst

        def applied_limits(self):
            return {}

        def _exec(self, *_a, **_k):
            return types.SimpleNamespace(error_code=None, result={"ok": True, "bytes": 1}, metadata={}, stderr="")

        def enforced_egress(self, i):
            policy = super().enforced_egress(i)
            if threading.current_thread().name == "install" and not narrowed:
                # another request narrows the session right after the restore read the policy
                put = threading.Thread(target=lambda: narrowed.append(
                    self.set_network_policy("i", "allowlist", ["api.example.com:443"])))
                put.start()
                put.join(0.5)  # done at once without the lock; blocked until the restore ends with it
            return policy

    p = P()
    p._bind_egress(inst)
    monkeypatch.setattr(install, "index_hosts", lambda *a: parse_policy("allowlist", ["pypi.org:443"]))
    results: list[dict] = []
    t = threading.Thread(target=lambda: results.append(install.run_install(p, "i", ["x"], None, 10)), name="install")
    t.start()
    t.join(10)
    for th in threading.enumerate():
        if th is not threading.current_thread() and not th.daemon and th.name != "install":
            th.join(5)
    assert results and results[0]["installed"] is True, results
    assert narrowed == [{"network": "allowlist", "allow": ["api.example.com:443"]}]
    assert link.policy.to_dict() == p.effective_network("i") == narrowed[0]
