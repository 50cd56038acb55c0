"""The agent's spare: the child forked ahead of the next run, waiting for its job.

Split from children.py along its seam: here the spare is forked, warmed (an empty run; in boxes
that plot, a throwaway figure while idle), handed its job or dropped; children.py runs requests
and Python contexts and takes a spare for each run.
"""

from __future__ import annotations

import os
import sys
import time

from . import procs, protocol, pump, runners

TYPE_CHECKING = False  # importing typing costs ~2 ms of every box start; annotations only
if TYPE_CHECKING:
    from typing import Any

EARLY_SPARE_MAX_FORK = 0.002
"""Seconds: fork the next spare while a run executes only when forking (averaged) is this cheap."""
FIGURE_IDLE = 0.05
"""Seconds without a request before the spare of a box whose runs draw figures draws one itself."""
WARM_FIGURES = {"op": "warm-figures"}
FIGURE_WORDS = ("matplotlib", "plot", "savefig", "plt.", "seaborn")
"""A run whose code says one of these (or that left figures) marks its box as one that draws.
Only a hint for when spares warm figures (``warm_spare_when_idle``): a wrong guess costs time."""


class Spare:
    """A forked child waiting for its one-shot job on ``ctl_w``.

    ``ready_r`` (-1 when matplotlib is not preloaded) carries one byte once the spare has drawn
    its warm-up figure; ``figures`` is None (not asked), "warming" or "warm".
    """

    __slots__ = ("pid", "out_r", "err_r", "res_r", "ctl_w", "ready_r", "figures")

    def __init__(self, pid: int, out_r: int, err_r: int, res_r: int, ctl_w: int, ready_r: int = -1) -> None:
        self.pid, self.out_r, self.err_r, self.res_r, self.ctl_w = pid, out_r, err_r, res_r, ctl_w
        self.ready_r = ready_r
        self.figures: str | None = None

    def fds(self) -> tuple[int, ...]:
        return (self.ctl_w, self.out_r, self.err_r, self.res_r) + ((self.ready_r,) if self.ready_r >= 0 else ())


def _warm_figures(ready_w: int) -> None:
    """In a spare: draw the warm-up figure with its output sent nowhere, then say so on ``ready_w``.

    stdout/stderr already are the next run's pipes: a library warning must not land in them.
    """
    runners.flush_stdio()
    saved = os.dup(1), os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    os.close(devnull)
    try:
        runners.warm_figures()
    except Exception:  # noqa: BLE001 - only a warm-up: the user's own plot reports any real error
        pass
    finally:
        runners.flush_stdio()
        for fd, old in ((1, saved[0]), (2, saved[1])):
            os.dup2(old, fd)
            os.close(old)
    os.write(ready_w, b"w")


class Spares:
    """Mixin for :class:`execbox.agent.children.Children`: the spare's life cycle."""

    def make_spare(self) -> None:
        """Fork the child for the next one-shot run ahead of time, off the request's hot path.

        The spare has its pipes wired and waits on a control pipe for its job; fork cost and
        copy-on-write set-up are paid while the previous run executes (``_start_oneshot``
        forks the next spare as soon as it hands a job over) or while the host is busy with the
        reply. The spare holds only its own pipes (``procs.close_fds_except``): not the agent's
        ends of a run in flight, nor a context's.
        """
        if self.spare is None:
            try:
                self.spare = self._fork_child()
            except procs.NoRoomForProcess:  # the box's own processes fill it: the run that
                pass  # needs a child forks it itself (_take_spare) and says why it cannot

    def _fork_child(self) -> Spare:
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        res_r, res_w = os.pipe()
        ctl_r, ctl_w = os.pipe()
        ready_r = ready_w = -1
        if self.figures_preloaded:
            ready_r, ready_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        started = time.monotonic()
        pid = procs.fork("the run's process", (out_r, out_w, err_r, err_w, res_r, res_w, ctl_r, ctl_w)
                         + ((ready_r, ready_w) if ready_r >= 0 else ()))
        if pid == 0:  # the spare child
            try:
                self.child_prepare()
                os.dup2(out_w, 1)
                os.dup2(err_w, 2)
                procs.close_fds_except((res_w, ctl_r, ready_w))
                runners.warm_up()
                while True:
                    try:
                        job = protocol.read_frame(ctl_r)
                    except (EOFError, OSError, ValueError):
                        os._exit(0)  # discarded unused
                    if job != WARM_FIGURES or ready_w < 0:
                        break
                    _warm_figures(ready_w)
                os.close(ctl_r)
                if ready_w >= 0:
                    os.close(ready_w)
                self._child_run(job, res_w)
            except BaseException:  # noqa: BLE001
                try:
                    import traceback  # only on this failure path: not on every box start

                    os.write(2, traceback.format_exc().encode())
                finally:
                    os._exit(127)
            os._exit(1)
        self.exited.pop(pid, None)  # a reused pid's old status is not this child's
        took = time.monotonic() - started
        self.fork_cost = took if self.fork_cost is None else 0.8 * self.fork_cost + 0.2 * took
        for fd in (out_w, err_w, res_w, ctl_r):
            os.close(fd)
        if ready_w >= 0:
            os.close(ready_w)
        return Spare(pid, out_r, err_r, res_r, ctl_w, ready_r)

    def warm_spare_when_idle(self) -> None:
        """Have the spare draw a throwaway figure when no request came for ``FIGURE_IDLE``.

        In a forked child the first figure copies some 4000 interpreter pages (copy-on-write)
        that the agent's own warm-up figure cannot share; drawn in the spare, while the box is
        idle, they are copied before the run that plots arrives. Only in boxes whose runs have
        drawn figures (``draws_figures``): elsewhere it would be CPU and memory for nothing. Not
        while requests keep coming: a run arriving while the spare draws gets a fresh child
        instead (``_take_spare``), which back-to-back runs would otherwise always pay.
        """
        spare = self.spare
        if (spare is None or spare.ready_r < 0 or spare.figures is not None or not self.draws_figures
                or self.pending or self._request_within(FIGURE_IDLE)):
            return
        try:
            protocol.write_frame(spare.ctl_w, WARM_FIGURES)
            spare.figures = "warming"
        except OSError:  # the spare died while waiting: the next run forks anew
            self._discard_spare()

    def spare_figures(self) -> str | None:
        """The spare's figure state, "warming" turning "warm" once it said so on ``ready_r``."""
        spare = self.spare
        if spare is not None and spare.figures == "warming":
            try:
                got = os.read(spare.ready_r, 1)
            except BlockingIOError:
                return "warming"
            if got:
                spare.figures = "warm"
            else:  # it died while drawing: the next run forks anew
                self._discard_spare()
                return None
        return spare.figures if spare is not None else None

    def _take_spare(self) -> Spare:
        """The waiting spare for a run. One still drawing its figure is killed instead of waited
        for: on a box's CPU quota it would also slow the fresh child that takes its place."""
        if self.spare_figures() == "warming":
            self._discard_spare()
        spare, self.spare = self.spare, None
        return spare if spare is not None else self._fork_child()

    def _discard_spare(self) -> None:
        spare, self.spare = self.spare, None
        if spare is not None:
            self._drop(spare)

    def _drop(self, spare: Spare) -> None:
        for fd in spare.fds():
            try:
                os.close(fd)
            except OSError:
                pass
        pump.kill_quietly(spare.pid, keep=self._keep_pids())

    def _child_run(self, job: dict[str, Any], res_w: int) -> None:
        """Body of a one-shot child once its job arrived; never returns."""
        spec = job["spec"]
        lang = spec["language"]
        os.chdir(spec["cwd"])
        env = dict(os.environ)
        env.update(spec["env"])
        if job["args_path"]:
            env[runners.ARGUMENTS_ENV] = job["args_path"]
        limits = job["limits"]
        procs.apply_rlimits(limits, allow_address_space=lang != "javascript")
        if lang == "python":
            os.environ.update(spec["env"])
            runners.setup_stdio(bool(job["stream"]))
            inherited = sys.modules.get("atexit")  # imported before the fork (a preloaded library)
            if inherited is not None:
                inherited._clear()  # their exit functions are not the run's
            rc = runners.run_python(spec["code"], spec["arguments"], {}, res_w, self.artifacts, job["prefix"])
            runners.finish_python(res_w)
            runners.flush_stdio()
            code = rc & 0xFF if rc >= 0 else 1
            pump.write_exit_record(res_w, code)
            os._exit(code)
        if lang == "javascript":
            os.dup2(res_w, 3)
            os.set_inheritable(3, True)
            heap = limits.get("memory_bytes")
            runners.exec_node(self.node or "node", job["code_path"], job["args_path"], env,
                              int(heap // (1024 * 1024) * 3 // 4) if heap else None)
        runners.exec_bash(self.bash, job["code_path"], env)
