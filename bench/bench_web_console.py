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
import signal
import socket
import subprocess
import sys
import tempfile
import time

import httpx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _stats import measure, print_table  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]
CODE = 'import time\nprint("first", flush=True)\ntime.sleep(0.3)\nprint("second")\n'


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    from playwright.sync_api import sync_playwright

    from execbox.service.store import open_store

    n = 5 if "--quick" in sys.argv else 20
    if not os.access(CHROMIUM, os.X_OK):
        sys.exit(f"{CHROMIUM} is missing: run scripts/setup/test/50-browser.sh")
    data = tempfile.mkdtemp(prefix="execbox-bench-web-")
    store = open_store(data_dir=data)
    _, token = store.tokens.create("default", "admin", "bench")
    store.close()
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDBOX_")}
    env.update(EXECBOX_DATA_DIR=data, SANDBOX_TYPE="jail")
    log = open(os.path.join(data, "serve.log"), "wb")  # noqa: SIM115 - closed in finally
    proc = subprocess.Popen([sys.executable, "-m", "execbox", "serve", "--host", "127.0.0.1", "--port", str(port),
                             "--log-level", "warning"], stdout=log, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    api = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=120)
    try:
        for _ in range(300):
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
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
            page.goto("/admin/")
            page.fill("#token", token)
            page.keyboard.press("Enter")
            page.locator("#nav").wait_for()

            def console_page() -> None:
                page.goto("about:blank")
                page.goto("/admin/#/providers")
                page.locator('article[data-provider="jail"]').wait_for()

            rows = [measure("admin API calls of the Providers page (httpx)", api_page, n=n, warmup=2),
                    measure("Providers page drawn (chromium)", console_page, n=n, warmup=2,
                            baseline="admin API calls of the Providers page (httpx)"),
                    measure("execute, not streamed (httpx)", api_run, n=n, warmup=2),
                    measure("execute, streamed to the end (httpx SSE)", api_stream, n=n, warmup=2,
                            baseline="execute, not streamed (httpx)")]

            page.goto("/admin/#/playground")
            page.fill("#pg-code", CODE)
            page.fill("#pg-args", "")
            page.fill("#pg-tenant", "bench")
            page.fill("#pg-session", "web")
            run = page.locator("#pg-run")
            first = page.locator("#pg-output .stdout").first
            done = page.locator('#pg-status[data-state="done"]')
            marks: dict[str, float] = {}

            def ui_run() -> None:
                t = time.perf_counter()
                run.click()
                first.wait_for()
                marks["first"] = (time.perf_counter() - t) * 1000
                done.wait_for()

            firsts: list[float] = []

            def ui_first() -> None:
                ui_run()
                firsts.append(marks["first"])

            finished = measure("playground: Run to result drawn", ui_first, n=n, warmup=2,
                               baseline="execute, not streamed (httpx)")
            first_row = type(finished)("playground: Run to first output drawn", firsts[-n:], finished.wall_s, 1,
                                       "execute, not streamed (httpx)")
            rows += [first_row, finished]
            browser.close()
        print_table(f"web console on jail, warm session, {n} samples each", rows)
    finally:
        api.close()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main()
