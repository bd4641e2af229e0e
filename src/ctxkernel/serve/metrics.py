"""Prometheus metrics of one ``serve`` process (``GET /metrics``, text format).

No label carries a session id, a credential or message content: labels are the route, the HTTP
status, the API, the strategy and an error kind, all from small fixed sets.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "ctxkernel_serve_requests_total", "Requests by route and status", ["route", "status"], registry=r
        )
        self.upstream_latency = Histogram(
            "ctxkernel_serve_upstream_latency_seconds",
            "Latency of upstream calls (to the end of the body or stream)",
            ["api"],
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600),
            registry=r,
        )
        self.client_tokens = Counter(
            "ctxkernel_serve_client_prompt_tokens_total",
            "Prompt tokens the clients sent (their whole history, counted with the profile's tokenizer)",
            ["api"],
            registry=r,
        )
        self.upstream_tokens = Counter(
            "ctxkernel_serve_upstream_prompt_tokens_total",
            "Prompt tokens the upstream received (its reported usage)",
            ["api"],
            registry=r,
        )
        self.compactions = Counter(
            "ctxkernel_serve_compactions_total",
            "Committed compactions by strategy and kind",
            ["strategy", "kind"],
            registry=r,
        )
        self.inner_rounds = Counter(
            "ctxkernel_serve_inner_rounds_total",
            "Upstream calls made for strategy tools, inside the proxy",
            ["api"],
            registry=r,
        )
        self.errors = Counter("ctxkernel_serve_errors_total", "Errors by kind", ["kind"], registry=r)
        self._children: dict[tuple[Any, tuple[str, ...]], Any] = {}

    def child(self, metric: Any, *values: str) -> Any:
        """``metric.labels(*values)``, kept for the next request with the same labels.

        ``labels`` checks and converts the values and takes the metric's lock each time: about
        half the instructions of a request's four metric updates (``bench_serve.py``). The child
        kept is the one the metric itself holds for these values (serve never removes one), so
        this holds nothing the registry does not, and the label sets are small and fixed
        (module docstring)."""
        key = (metric, values)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*values)
        return found

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
