"""Egress page: the gateway's audit rows (allowed/denied, bytes, reason) with a decision filter."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy.orm import sessionmaker

from tests.browser.conftest import Server


def test_egress_audit_page(signed_in: Any, server: Server, screenshot: Any) -> None:
    from execbox.egress.audit import AuditRecord
    from execbox.service.store import open_store
    from execbox.service.store.egress_store import EgressAuditRepo

    store = open_store(data_dir=server.data_dir)
    repo = EgressAuditRepo(sessionmaker(store.engine, expire_on_commit=False))
    now = time.time()
    repo.insert_many([
        AuditRecord(box="b1", kind="tcp", host="pypi.example.test", ip="203.0.113.5", port=443, decision="allowed",
                    reason="allowed", tenant_id="acme", session_id="s1", bytes_up=512, bytes_down=2 * 1024 * 1024,
                    duration_ms=41.0, ts=now),
        AuditRecord(box="b1", kind="tcp", host=None, ip="169.254.169.254", port=80, decision="denied",
                    reason="169.254.169.254 is in an always-denied range (169.254.0.0/16)", tenant_id="acme",
                    session_id="s1", ts=now + 1),
    ])
    page = signed_in
    page.get_by_role("link", name="Egress").click()
    denied = page.locator('tr[data-decision="denied"]').filter(has_text="169.254.169.254")
    denied.wait_for()
    assert "always-denied" in denied.inner_text()
    allowed = page.locator('tr[data-decision="allowed"]').filter(has_text="pypi.example.test:443")
    assert "2.0 MiB" in allowed.inner_text() or "MiB" in allowed.inner_text() or "MB" in allowed.inner_text()
    screenshot(page, "egress")
    page.select_option("#egress-decision", "denied")
    page.get_by_role("button", name="Refresh").click()
    allowed.wait_for(state="detached")
    assert denied.count() == 1
