"""What a console user waits for, in Debian's Chromium, against `execbox serve` (jail) on loopback.

Scenarios, each beside its baseline measured in the same process:
  - console page: navigation to the Providers page with its cards drawn, against the two admin
    API calls the page makes (httpx): what loading and drawing the console adds;
  - playground, first output: Run click to the first streamed line on screen, for a program that
    prints, works 300 ms, prints again; against the same run without streaming (httpx, whole
    JSON result): what streaming saves before the user sees something;
  - playground, finished: Run click to the result drawn, against the same non-streamed baseline
    (and the streamed request read to its end with httpx, to tell SSE cost from browser cost).
Runs use one warm session, so box start-up is not what is measured.
Usage: .venv/bin/python bench/bench_web_console.py [--quick]
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable

import httpx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tests import serve_process  # noqa: E402  (the suite's one start/stop of `execbox serve`)

from _stats import Row, measure, print_table  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]
CODE = 'import time\nprint("first", flush=True)\ntime.sleep(0.3)\nprint("second")\n'

# Browser timings are taken inside the page (performance.now() when a MutationObserver sees the
# change), not by Playwright's wait_for: that polls with growing pauses (up to 500 ms) while the
# element is absent, which made a 0.31 s run read as ~0.8 s "drawn".
PROVIDERS_DRAWN = """
window.__providersDrawn = new Promise((resolve) => {
  const drawn = () => document.querySelector('article[data-provider="jail"]');
  new MutationObserver((_, observer) => {
    if (drawn()) { observer.disconnect(); resolve(performance.now()); }  // ms since navigation start
  }).observe(document, { childList: true, subtree: true });
});
"""
PLAYGROUND_RUN = """
() => new Promise((resolve, reject) => {
  const status = document.querySelector("#pg-status"), output = document.querySelector("#pg-output");
  const marks = {};
  let t0 = 0;
  const observer = new MutationObserver(() => {
    if (marks.first === undefined && output.querySelector(".stdout")) marks.first = performance.now() - t0;
    if (status.dataset.state === "done" || status.dataset.state === "failed") {
      observer.disconnect();
      if (status.dataset.state === "failed") { reject(new Error(status.textContent)); return; }
      marks.done = performance.now() - t0;
      resolve(marks);
    }
  });
  observer.observe(document.body, { childList: true, subtree: true, attributes: true });
  t0 = performance.now();
  document.querySelector("#pg-run").click();
})
"""


def main() -> None:
    from execbox.service.store import open_store

    n = 5 if "--quick" in sys.argv else 20
    if not os.access(CHROMIUM, os.X_OK):
        sys.exit(f"{CHROMIUM} is missing: run scripts/setup/test/50-browser.sh")
    data = tempfile.mkdtemp(prefix="execbox-bench-web-")
    store = open_store(data_dir=data)
    _, token = store.tokens.create("default", "admin", "bench")
    store.close()
    try:
        with serve_process.serve(data, env={"SANDBOX_TYPE": "jail"}) as (url, _log):
            with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=120) as api:
                bench(api, url, token, n)
    finally:
        shutil.rmtree(data, ignore_errors=True)


def in_page_rows(sample: Callable[[], dict[str, float]], n: int, names: dict[str, str], baseline: str) -> list[Row]:
    """One row per mark of ``sample``'s in-page timings (ms), after two warm-up calls."""
    for _ in range(2):
        sample()
    got: dict[str, list[float]] = {k: [] for k in names}
    start = time.perf_counter()
    for _ in range(n):
        marks = sample()
        for k in names:
            got[k].append(marks[k])
    wall = time.perf_counter() - start
    return [Row(label, got[k], wall, 1, baseline) for k, label in names.items()]


def bench(api: httpx.Client, url: str, token: str, n: int) -> None:
    from playwright.sync_api import sync_playwright

    body = {"code": CODE, "language": "python", "tenant_id": "bench", "session_id": "web"}
    api.post("/v1/sandbox/execute", json=body).raise_for_status()  # warm the session

    def api_page() -> None:
        api.get("/api/admin/sandbox/providers").raise_for_status()
        api.get("/api/admin/sandbox/config").raise_for_status()

    def api_run() -> None:
        api.post("/v1/sandbox/execute", json=body).raise_for_status()

    def api_stream() -> None:
        with api.stream("POST", "/v1/sandbox/execute", json=body,
                        headers={"Accept": "text/event-stream"}) as r:
            r.raise_for_status()
            for _ in r.iter_bytes():
                pass

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        page = browser.new_page(base_url=url, viewport={"width": 1280, "height": 900})
        page.add_init_script(PROVIDERS_DRAWN)
        page.goto("/admin/")
        page.fill("#token", token)
        page.keyboard.press("Enter")
        page.locator("#nav").wait_for()

        def console_page() -> dict[str, float]:
            page.goto("about:blank")
            page.goto("/admin/#/providers")
            return {"drawn": page.evaluate("window.__providersDrawn")}

        rows = [measure("admin API calls of the Providers page (httpx)", api_page, n=n, warmup=2)]
        rows += in_page_rows(console_page, n, {"drawn": "Providers page drawn (chromium)"},
                             "admin API calls of the Providers page (httpx)")
        rows += [measure("execute, not streamed (httpx)", api_run, n=n, warmup=2),
                 measure("execute, streamed to the end (httpx SSE)", api_stream, n=n, warmup=2,
                         baseline="execute, not streamed (httpx)")]

        page.goto("/admin/#/playground")
        page.fill("#pg-code", CODE)
        page.fill("#pg-args", "")
        page.fill("#pg-tenant", "bench")
        page.fill("#pg-session", "web")
        page.locator("#pg-run").wait_for()
        rows += in_page_rows(lambda: page.evaluate(PLAYGROUND_RUN), n,
                             {"first": "playground: Run to first output drawn",
                              "done": "playground: Run to result drawn"}, "execute, not streamed (httpx)")
        browser.close()
    print_table(f"web console on jail, warm session, {n} samples each", rows)


if __name__ == "__main__":
    main()
