"""When a `run_code` cell fails for a reason that is not its code, through the official SDK against a
real `execbox serve` (review 38, F4, F7, F8):

- cells waiting their turn on one sandbox hold none of the tenant's execution slots (E2B queues
  them on the kernel), so they do not make another sandbox's cell fail with SB008;
- a cell the service refuses before it runs (SB008) is an HTTP error the SDK raises, not the cell's
  `execution.error`;
- a failure of the service once the cell's stream has started (the box died under it), and a
  cell cut off by `kill()` or the sandbox's expiry, end the stream without its end, so the SDK
  raises (for a killed sandbox its own "The sandbox was killed while the request was in
  progress"), never a `KeyboardInterrupt` of the user's code;
- a cell that runs out of memory reports a `MemoryError` like any other cell error: only the
  cell's own frames, and not repeated on `logs.stderr`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from .conftest import Server, kill_box, module_sandbox

e2b = pytest.importorskip("e2b")
ci = pytest.importorskip("e2b_code_interpreter")


@pytest.fixture(scope="module")
def sbx(e2b_server: Server) -> Iterator[object]:
    with module_sandbox(e2b_server, lambda: ci.Sandbox.create(timeout=300)) as sandbox:
        yield sandbox


def _in_thread(fn) -> tuple[threading.Thread, dict]:  # noqa: ANN001
    out: dict[str, object] = {}

    def go() -> None:
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - the test looks at it
            out["exc"] = e

    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t, out


def _running_cell(sandbox, code: str, stderr: list | None = None) -> tuple[threading.Thread, dict]:  # noqa: ANN001
    """A cell on a thread, returned once it has printed (it runs)."""
    printed = threading.Event()
    t, out = _in_thread(lambda: sandbox.run_code(code, on_stdout=lambda _m: printed.set(),
                                                 on_stderr=(stderr.append if stderr is not None else None),
                                                 timeout=60))
    assert printed.wait(30), f"the cell did not start: {out}"
    return t, out


# -- F4 (a): cells queued on one sandbox hold no tenant slot -------------------------------------
def test_cells_queued_on_one_sandbox_do_not_use_up_the_tenants_slots(e2b_env: Server) -> None:
    a = ci.Sandbox.create(timeout=120)
    b = ci.Sandbox.create(timeout=120)
    try:
        assert a.run_code("0").text == "0" and b.run_code("0").text == "0"
        n = 12  # over the tenant's 10 executions (tenant_max_executions)
        with ThreadPoolExecutor(n) as pool:
            cells = [pool.submit(a.run_code, f"import time\ntime.sleep(0.4)\n{i}", timeout=60) for i in range(n)]
            time.sleep(1.0)  # one runs, the others wait their turn
            other = b.run_code("1 + 1", timeout=30)
            assert other.error is None and other.text == "2", other.error
            done = [c.result(timeout=60) for c in cells]
        assert [e.error for e in done] == [None] * n
        assert sorted(int(e.text) for e in done) == list(range(n))
    finally:
        a.kill()
        b.kill()


# -- F4 (b): a cell refused before it runs is an HTTP error --------------------------------------
def test_a_cell_refused_for_the_tenants_quota_is_an_sdk_exception(e2b_env: Server, sbx) -> None:
    assert sbx.run_code("0").text == "0"
    hold = f"hold-{time.monotonic_ns()}"
    headers = {"Authorization": f"Bearer {e2b_env.token_a}"}

    def run(code: str, session: str | None = hold) -> httpx.Response:
        return httpx.post(f"{e2b_env.url}/v1/sandbox/execute", headers=headers, timeout=60,
                          json={"session_id": session, "language": "python", "code": code})

    try:
        assert run("pass").status_code == 200  # the session's box is up
        with ThreadPoolExecutor(10) as pool:
            # the tenant's 10 executions in use: a session run and nine one-shots (which count
            # from their arrival; runs queued on one session would not)
            first = pool.submit(run, "import time; time.sleep(4)")
            time.sleep(0.5)
            rest = [pool.submit(run, "import time; time.sleep(4)", None) for _ in range(9)]
            time.sleep(1.0)
            with pytest.raises(e2b.SandboxException) as caught:
                sbx.run_code("1 + 1", timeout=30)
            assert "429" in str(caught.value) and "SB008" in str(caught.value), caught.value
            assert [r.result().status_code for r in [first, *rest]] == [200] * 10
        assert sbx.run_code("1 + 1").text == "2"  # nothing of it ran, nothing is held
    finally:
        httpx.delete(f"{e2b_env.url}/v1/sandbox/sessions/alpha/{hold}", headers=headers, timeout=30)


# -- F4: a service failure after the stream started ends it; the SDK raises ------------------------
def test_a_box_death_under_a_running_cell_fails_the_request_not_the_code(sbx) -> None:
    stderr: list = []
    cell, out = _running_cell(sbx, "print('started', flush=True)\nimport time\ntime.sleep(30)", stderr)
    kill_box(sbx)
    cell.join(30)
    assert not cell.is_alive()
    assert "value" not in out, f"the box death came back as the cell's result: {out['value'].error}"
    assert isinstance(out["exc"], httpx.RemoteProtocolError), repr(out["exc"])  # the stream was cut short
    assert any("SB009" in m.line for m in stderr), stderr  # on_stderr was told why
    assert sbx.run_code("6 * 7").text == "42"  # the sandbox goes on, on a new box


# -- F7: kill() or the expiry under a running cell: the SDK raises, as on E2B ----------------------
@pytest.mark.parametrize("how", ["kill", "expiry"])
def test_a_cell_cut_off_by_the_sandboxs_end_raises_in_the_sdk(e2b_env: Server, how: str) -> None:
    sandbox = ci.Sandbox.create(timeout=4 if how == "expiry" else 120)
    try:
        cell, out = _running_cell(sandbox, "print('started', flush=True)\nimport time\ntime.sleep(60)")
        queued, queued_out = _in_thread(lambda: sandbox.run_code("'queued'", timeout=60))  # waits its turn
        time.sleep(0.3)
        if how == "kill":
            assert sandbox.kill()
        cell.join(30)
        queued.join(30)
        assert not cell.is_alive() and not queued.is_alive()
        for got in (out, queued_out):
            assert "value" not in got, f"came back as a result: {got['value']}"
            assert isinstance(got["exc"], e2b.TimeoutException), repr(got["exc"])
            assert "was killed while the request was in progress" in str(got["exc"])
        assert not sandbox.is_running()
    finally:
        try:
            sandbox.kill()
        except Exception:  # noqa: BLE001 - gone already
            pass


# -- F8: out of memory is a cell error like the others ---------------------------------------------
@pytest.mark.parametrize("code", ["x = bytearray(2 * 1024 ** 3)", "raise MemoryError()"])
def test_a_memory_error_shows_only_the_cells_frames_and_not_on_stderr(sbx, code: str) -> None:
    execution = sbx.run_code(f"y = 1\n{code}", timeout=60)
    err = execution.error
    assert err is not None and err.name == "MemoryError", err
    assert err.traceback.startswith("Traceback (most recent call last):\n"), err.traceback
    assert 'File "Cell In[' in err.traceback and ", line 2, in <module>" in err.traceback, err.traceback
    for machinery in ("__e2b_m", "<string>", "py_cells", "runners", "<cell "):
        assert machinery not in err.traceback, err.traceback
    assert "Traceback" not in "".join(execution.logs.stderr), execution.logs.stderr
    assert sbx.run_code("y + 1").text == "2"  # the context lives on
