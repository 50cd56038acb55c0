"""Prometheus metrics of one service instance (its own registry, so several apps can share a process).

Counters and the duration histogram are updated on the request path; session and pool gauges
are computed when /metrics is scraped, from the live SessionManager and providers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

DURATION_BUCKETS = (0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)


class _LiveGauges(Collector):
    """Active sessions and pooled boxes, read at scrape time."""

    def __init__(self, sessions: Callable[[], int], pools: Callable[[], Iterable[tuple[str, dict[str, Any]]]]):
        self._sessions = sessions
        self._pools = pools

    def collect(self):  # noqa: ANN201 - prometheus-client protocol
        g = GaugeMetricFamily("execbox_active_sessions", "Sessions currently holding a box")
        g.add_metric([], self._sessions())
        yield g
        p = GaugeMetricFamily("execbox_pool_boxes", "Boxes in a provider's warm pool", labels=["provider", "state"])
        for provider, status in self._pools():
            for state, value in status.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    p.add_metric([provider, state], value)
        yield p


class ServiceMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.executions = Counter(
            "execbox_executions", "Executions by provider, language and status",
            ["provider", "language", "status"], registry=self.registry)
        self.duration = Histogram(
            "execbox_execution_duration_seconds", "Wall time of executions as seen by the service",
            ["provider", "language"], buckets=DURATION_BUCKETS, registry=self.registry)
        self.file_operations = Counter(
            "execbox_file_operations", "Workspace file operations by operation and status",
            ["operation", "status"], registry=self.registry)
        self.errors = Counter("execbox_errors", "Error responses by SB code", ["code"], registry=self.registry)
        self.rate_limited = Counter(
            "execbox_rate_limit_rejections", "Requests rejected by a per-tenant limit", ["limit"],
            registry=self.registry)
        self.sessions_reaped = Counter("execbox_sessions_reaped", "Idle sessions reaped", registry=self.registry)
        self.sessions_fenced = Counter("execbox_sessions_fenced",
                                       "Sessions whose box this replica stopped, its leases unrenewed",
                                       registry=self.registry)
        self.boxes_died = Counter("execbox_box_deaths", "Session boxes found dead (SB009)", registry=self.registry)

    def bind_live(self, sessions: Callable[[], int],
                  pools: Callable[[], Iterable[tuple[str, dict[str, Any]]]]) -> None:
        self.registry.register(_LiveGauges(sessions, pools))

    def observe_execution(self, provider: str, language: str, status: str, seconds: float) -> None:
        self.executions.labels(provider, language, status).inc()
        self.duration.labels(provider, language).observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
