"""Egress audit: one record per connection attempt (and per refused DNS name), fanned out to sinks.

The gateway never blocks on a sink: records go to an in-memory view (what the admin API reads
when no store is configured; shared fairly between tenants, ``_keep``), to per-decision counters
(Prometheus) and to any registered sink (e.g. the SQL store), each called from the gateway
thread and guarded against exceptions.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

log = logging.getLogger("execbox.egress")


@dataclass
class AuditRecord:
    box: str
    kind: str  # "tcp" | "dns"
    host: str | None
    ip: str | None
    port: int | None
    decision: str = "denied"  # "allowed" | "denied" | "limited"
    reason: str = ""
    tenant_id: str | None = None
    session_id: str | None = None
    run_id: str | None = None
    bytes_up: int = 0
    bytes_down: int = 0
    duration_ms: float = 0.0
    injected: bool = False
    ts: float = field(default_factory=time.time)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


Sink = Callable[[AuditRecord], None]

_lock = threading.Lock()
VIEW_SIZE = 10000
"""Records the in-memory view holds, all tenants together (``_keep``)."""
_views: dict[str | None, deque[tuple[int, AuditRecord]]] = {}  # per tenant: (sequence, record), oldest first
_held = 0
_seq = itertools.count()
_sinks: list[Sink] = []
_counts: Counter[tuple[str, str]] = Counter()


def add_sink(sink: Sink) -> None:
    with _lock:
        _sinks.append(sink)


def remove_sink(sink: Sink) -> None:
    with _lock:
        if sink in _sinks:
            _sinks.remove(sink)


def record(rec: AuditRecord, counted: bool = True) -> None:
    """``counted=False``: a row summing up attempts already counted (``count_only``)."""
    with _lock:
        _keep(rec)
        if counted:
            _counts[(rec.kind, rec.decision)] += 1
        sinks = list(_sinks)
    for sink in sinks:
        try:
            sink(rec)
        except Exception:  # noqa: BLE001 - an audit sink must never break the data path
            log.exception("egress audit sink failed")


def _keep(rec: AuditRecord) -> None:
    """Add to the in-memory view (under ``_lock``). Full, it drops the oldest record of the tenant
    holding the most: one shared FIFO let one tenant's volume push every other tenant's records
    out, now a tenant holding less than an equal share keeps them. The appending tenant's own
    oldest goes when it holds its share or more (O(1) for the tenant that floods)."""
    global _held
    view = _views.get(rec.tenant_id)
    if view is None:
        view = _views[rec.tenant_id] = deque()
    view.append((next(_seq), rec))
    _held += 1
    if _held <= VIEW_SIZE:
        return
    if len(view) * len(_views) < VIEW_SIZE:
        key = max(_views, key=lambda k: len(_views[k]))
        view = _views[key]
    else:
        key = rec.tenant_id
    view.popleft()
    _held -= 1
    if not view:
        del _views[key]


def count_only(kind: str, decision: str, n: int = 1) -> None:
    """Count attempts that get no row of their own (the metrics stay exact; see RowBudget)."""
    with _lock:
        _counts[(kind, decision)] += n


class RowBudget:
    """Per source of refusals (a box's refused DNS names, a proxy client's refused requests): the
    first ``per_second`` in a second get a row each; the rest are counted and summed up in one row
    when that second is over (or the source goes).

    A box can ask its resolver for random names as fast as it likes: one row each grew the audit
    table by ~7000 rows a second and pushed every other tenant's records out of the in-memory view.
    """

    def __init__(self, per_second: int = 20) -> None:
        self.per_second = per_second
        self._start = 0.0
        self._rows = 0
        self.suppressed = 0
        self._held_bytes = (0, 0)
        self.carried_bytes = (0, 0)
        """Bytes up and down of the records last summed up (for a summarizer of connections)."""
        self.clock = time.monotonic

    def admit(self, now: float | None = None) -> tuple[bool, int]:
        """(record this one?, how many the second before held back, to be summed up now)."""
        now = self.clock() if now is None else now
        carried = 0
        if now - self._start >= 1.0:
            carried, self.suppressed, self._start, self._rows = self.suppressed, 0, now, 0
            self.carried_bytes, self._held_bytes = self._held_bytes, (0, 0)
        if self._rows < self.per_second:
            self._rows += 1
            return True, carried
        self.suppressed += 1
        return False, carried

    def drain(self) -> int:
        carried, self.suppressed = self.suppressed, 0
        self.carried_bytes, self._held_bytes = self._held_bytes, (0, 0)
        return carried

    def submit(self, rec: AuditRecord, summarize: Callable[[int], None], started: float | None = None) -> None:
        """Record ``rec`` within the budget (with its duration since ``started`` when given), else
        only count it; ``summarize(n)`` records the row for the ``n`` the second before held back."""
        row, carried = self.admit()
        if carried:
            summarize(carried)
        if not row:
            count_only(rec.kind, rec.decision)
            self._held_bytes = (self._held_bytes[0] + rec.bytes_up, self._held_bytes[1] + rec.bytes_down)
        elif started is not None:
            finish(rec, started)
        else:
            record(rec)


class ConnectionRows(RowBudget):
    """The rows of one box's connections that were not refused. Allowed ones (a failed upstream
    connect included) get a row each up to ``per_second``, the rest one summing-up row that
    carries their bytes, so totals stay exact: a box opening, or failing to open, connections
    thousands of times a second pushed every other tenant's rows out. Others (``limited``: a cap
    or a narrowing cut it) cannot be repeated at will and always get their row, as does every
    connection once ``closed`` (the box is gone: what still ends is no flood)."""

    def __init__(self, make: Callable[..., AuditRecord], per_second: int = 50) -> None:
        super().__init__(per_second)
        self.make = make  # a record of the box: make(kind=..., host=..., ...)
        self.closed = False

    def add(self, rec: AuditRecord, started: float | None = None) -> None:
        if rec.decision == "allowed" and not self.closed:
            self.submit(rec, self.summarize, started)
        elif started is not None:
            finish(rec, started)
        else:
            record(rec)

    def summarize(self, n: int) -> None:
        if n:
            up, down = self.carried_bytes
            record(self.make(kind="tcp", host=None, ip=None, port=None, decision="allowed", bytes_up=up,
                             bytes_down=down, reason=f"{n} more connections allowed within one second (over "
                             f"{self.per_second} a second: counted, not recorded one by one; their bytes are "
                             "this row's)"), counted=False)


def finish(rec: AuditRecord, started: float) -> None:
    """Record a connection with its duration since ``started`` (time.monotonic)."""
    rec.duration_ms = round((time.monotonic() - started) * 1000, 3)
    record(rec)


def recent(*, tenant_id: str | None = None, session_id: str | None = None, box: str | None = None,
           decision: str | None = None, limit: int = 200) -> list[AuditRecord]:
    """Newest first, filtered (the in-memory view; the SQL store keeps the long history)."""
    with _lock:
        if tenant_id:
            items = list(_views.get(tenant_id, ()))
        else:
            items = sorted((x for view in _views.values() for x in view), key=lambda x: x[0])
    out: list[AuditRecord] = []
    for _, r in reversed(items):
        if ((tenant_id and r.tenant_id != tenant_id) or (session_id and r.session_id != session_id)
                or (box and r.box != box) or (decision and r.decision != decision)):
            continue
        out.append(r)
        if len(out) >= limit:
            break
    return out


def counts() -> dict[tuple[str, str], int]:
    with _lock:
        return dict(_counts)


class EgressCollector:
    """Prometheus collector: execbox_egress_connections_total{kind, decision}."""

    def collect(self) -> Iterable[Any]:
        from prometheus_client.core import CounterMetricFamily

        c = CounterMetricFamily("execbox_egress_connections", "Egress attempts by kind and decision",
                                labels=["kind", "decision"])
        for (kind, decision), n in sorted(counts().items()):
            c.add_metric([kind, decision], n)
        yield c
