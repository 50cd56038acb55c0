"""Playground: Python and JavaScript through /v1/sandbox/execute on the jail provider, output
shown while the run is still going (SSE read with fetch), result value, a matplotlib figure
rendered inline, timing and isolation tier; bad input answered in words."""

from __future__ import annotations

import time
from typing import Any

PYTHON = """import os, time
import matplotlib.pyplot as plt

print("first line", flush=True)
waited = time.monotonic()
while not os.path.exists("go") and time.monotonic() - waited < 60:  # the test writes it
    time.sleep(0.05)
os.remove("go")
print("second line")

def main(n):
    plt.plot([i * i for i in range(n)])
    plt.title("squares")
    return {"n": n, "squares": [i * i for i in range(n)]}
"""

JAVASCRIPT = """function main(args) {
  console.log("hello from node", process.version.startsWith("v"));
  console.error("a warning on stderr");
  return { doubled: args.x * 2 };
}
"""


def set_code(page: Any, code: str) -> None:
    page.fill("#pg-code", code)


def test_python_output_streams_and_matplotlib_figure_renders(signed_in: Any, server: Any, jail_active: None,
                                                            screenshot: Any) -> None:
    """The program prints its second line only once the test has written the file ``go`` (a file
    write runs beside the run), so the state in between is seen however slow the machine is."""
    page = signed_in
    page.get_by_role("link", name="Playground").click()
    page.select_option("#pg-language", "python")
    set_code(page, PYTHON)
    page.fill("#pg-args", '{"n": 4}')
    page.fill("#pg-tenant", "acme")
    page.fill("#pg-session", "play-1")
    page.get_by_role("button", name="Run", exact=True).click()

    output = page.locator("#pg-output")
    output.get_by_text("first line").wait_for(timeout=60_000)
    # streamed: the first line is on screen while the run still waits before the second
    assert page.locator("#pg-status").inner_text() == "Running…"
    assert "second line" not in output.inner_text()
    assert page.get_by_role("button", name="Stop").is_enabled()
    with server.api() as api:
        r = api.post("/v1/sandbox/write", json={"tenant_id": "acme", "session_id": "play-1", "path": "go",
                                                "content": ""})
    assert r.status_code == 200, r.text

    page.locator('#pg-status[data-state="done"]').wait_for(timeout=60_000)
    assert "second line" in output.inner_text()
    facts = page.locator("#pg-result .facts").inner_text()
    assert "Exit code\n0" in facts and "Isolation\njail" in facts and "Provider\njail" in facts, facts
    assert "Session\nacme / play-1" in facts
    assert "Execution time\n" in facts
    value = page.locator("#pg-result-value").inner_text()
    assert '"squares": [' in value and '"n": 4' in value

    img = page.locator("#pg-artifacts img")
    img.wait_for()
    assert img.evaluate("i => i.complete && i.naturalWidth > 100 && i.naturalHeight > 100")
    assert img.get_attribute("src").startswith("blob:")
    assert "image/png" in page.locator("#pg-artifacts figcaption").first.inner_text()
    screenshot(page, "playground-python")


def test_javascript_one_shot_with_arguments(signed_in: Any, jail_active: None, screenshot: Any) -> None:
    page = signed_in
    page.goto("/admin/#/playground")
    page.select_option("#pg-language", "javascript")
    set_code(page, JAVASCRIPT)
    page.fill("#pg-args", '{"x": 21}')
    page.fill("#pg-session", "")
    page.get_by_role("button", name="Run", exact=True).click()
    page.locator('#pg-status[data-state="done"]').wait_for(timeout=60_000)
    assert "hello from node true" in page.locator("#pg-output .stdout").first.inner_text()
    assert "a warning on stderr" in page.locator("#pg-output .stderr").first.inner_text()
    assert '"doubled": 42' in page.locator("#pg-result-value").inner_text()
    facts = page.locator("#pg-result .facts").inner_text()
    assert "Isolation\njail" in facts and "one-shot" in facts
    screenshot(page, "playground-javascript")


def test_bad_input_is_explained_and_nothing_runs(signed_in: Any, jail_active: None) -> None:
    page = signed_in
    page.goto("/admin/#/playground")
    page.fill("#pg-args", "[1, 2]")
    page.get_by_role("button", name="Run", exact=True).click()
    assert page.locator("#pg-args-error").inner_text() == (
        'Arguments are not valid: must be a JSON object, like {"n": 5}')
    assert page.locator("#pg-args").get_attribute("aria-invalid") == "true"
    assert page.locator("#pg-status").inner_text() == "Ready."

    page.fill("#pg-args", "")
    page.fill("#pg-tenant", "no spaces allowed")
    page.get_by_role("button", name="Run", exact=True).click()
    error = page.locator("#pg-error .notice.error")
    error.wait_for()
    assert error.inner_text().startswith("The run failed: invalid request: tenant_id")
    assert "(SB002, HTTP 400)" in error.inner_text()


def test_timeout_is_reported_with_partial_output(signed_in: Any, jail_active: None) -> None:
    page = signed_in
    page.goto("/admin/#/playground")
    page.select_option("#pg-language", "bash")
    set_code(page, "echo started; sleep 30")
    page.fill("#pg-args", "")
    page.fill("#pg-timeout", "1")
    page.get_by_role("button", name="Run", exact=True).click()
    page.locator('#pg-status[data-state="failed"]').wait_for(timeout=60_000)
    assert "started" in page.locator("#pg-output").inner_text()
    assert "(SB005)" in page.locator("#pg-error").inner_text()


def test_editor_tab_indents_and_escape_releases_focus(signed_in: Any) -> None:
    page = signed_in
    page.goto("/admin/#/playground")
    set_code(page, "def f():\nreturn 1")
    editor = page.locator("#pg-code")
    editor.evaluate("t => t.setSelectionRange(t.value.length - 8, t.value.length - 8)")  # start of line 2
    page.keyboard.press("Tab")
    assert editor.input_value() == "def f():\n    return 1"
    assert page.evaluate("document.activeElement.id") == "pg-code"
    page.keyboard.press("Shift+Tab")
    assert editor.input_value() == "def f():\nreturn 1"
    page.keyboard.press("Escape")
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.id") == "pg-args"


def test_stop_cancels_the_run_on_the_server(signed_in: Any, server: Any, jail_active: None) -> None:
    page = signed_in
    page.goto("/admin/#/playground")
    page.select_option("#pg-language", "python")
    set_code(page, 'import time\nprint("working", flush=True)\ntime.sleep(60)\nprint("never")\n')
    page.fill("#pg-args", "")
    page.fill("#pg-tenant", "acme")
    page.fill("#pg-session", "stopped")
    page.get_by_role("button", name="Run", exact=True).click()
    page.locator("#pg-output").get_by_text("working").wait_for(timeout=60_000)
    page.get_by_role("button", name="Stop").click()
    page.locator('#pg-status[data-state="failed"]').wait_for()
    assert "stopped: the run was cancelled" in page.locator("#pg-error").inner_text()
    # the server killed the run: the session is idle again long before the 60 s sleep ends
    deadline = time.monotonic() + 20
    with server.api() as api:
        while True:
            live = {(s["tenant_id"], s["session_id"]): s for s in api.get("/v1/sandbox/sessions").json()["sessions"]}
            if not live[("acme", "stopped")]["busy"]:
                break
            assert time.monotonic() < deadline, "the session is still busy 20 s after Stop"
            time.sleep(0.2)
        r = api.post("/v1/sandbox/execute", json={"code": "print('next')", "tenant_id": "acme",
                                                  "session_id": "stopped"})
    assert r.status_code == 200 and r.json()["stdout"] == "next\n"
