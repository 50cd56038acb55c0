"""Runtimes page: the runtime templates the server can mount, with their current version."""

from __future__ import annotations

from typing import Any

from tests.browser.conftest import RUNTIME


def test_runtimes_page_lists_templates(signed_in: Any, screenshot: Any) -> None:
    from execbox.boxes import runtime

    page = signed_in
    page.get_by_role("link", name="Runtimes").click()
    page.get_by_role("heading", level=1, name="Runtimes").wait_for()
    system = page.locator('tr[data-runtime="system"]')
    system.wait_for()
    known = runtime.resolve(RUNTIME)  # the browser suite requires it (conftest)
    row = page.locator(f'tr[data-runtime="{RUNTIME}"]')
    row.wait_for()
    assert (known.version or "-") in row.inner_text() and "numpy" in row.inner_text()
    screenshot(page, "runtimes")
