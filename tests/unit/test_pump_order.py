"""The agent's output pump hands on output in the order it was written across stdout and stderr,
also when both pipes turn readable between two of its waits (a busy host)."""

from __future__ import annotations

import os
import time

from execbox.agent import pump


def test_stderr_written_before_stdout_is_emitted_first_when_both_are_ready_at_once():
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    res_r, res_w = os.pipe()
    wake_r, wake_w = os.pipe()
    emitted: list[tuple[str, str]] = []
    streams = [pump.Stream("stdout", out_r, 1 << 20, lambda n, t: emitted.append((n, t))),
               pump.Stream("stderr", err_r, 1 << 20, lambda n, t: emitted.append((n, t)))]
    calls = 0

    def is_done():  # noqa: ANN202 - first call: after the pump registered its fds, before it waits
        nonlocal calls
        calls += 1
        if calls == 1:
            os.write(err_w, b"two\n")
            os.write(out_w, b"three\n")
            for fd in (out_w, err_w, res_w):
                os.close(fd)
        return None

    watch = pump.Watch(pid=0, is_done=is_done, finished=lambda raw: {"exit_code": 0, "signal": None})
    try:
        pump.pump(watch, streams, res_r, time.monotonic() + 5, wake_r, None, lambda b: False, lambda: None,
                  lambda: None)
    finally:
        for fd in (out_r, err_r, res_r, wake_r, wake_w):
            os.close(fd)
    assert emitted == [("stderr", "two\n"), ("stdout", "three\n")]
