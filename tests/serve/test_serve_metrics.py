"""The metrics' kept label children (``Metrics.child``): whatever sequence of updates a process
makes, each kept child is the one ``labels()`` gives for its values, and the exposition is the
one the same updates through ``labels()`` give."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ctxkernel.serve.metrics import Metrics

#: (metric attribute, how many label values it takes)
METRICS = [
    ("requests", 2),
    ("upstream_latency", 1),
    ("client_tokens", 1),
    ("upstream_tokens", 1),
    ("compactions", 2),
    ("inner_rounds", 1),
    ("errors", 1),
]
VALUES = st.sampled_from(["openai", "anthropic", "/v1/chat/completions", "200", "502", "basic", "", "é"])
UPDATES = st.lists(
    st.tuples(st.sampled_from(METRICS), st.lists(VALUES, min_size=2, max_size=2), st.integers(0, 5_000)),
    max_size=40,
)


def apply(metrics: Metrics, updates: list, *, kept: bool) -> None:
    for (name, arity), values, amount in updates:
        metric = getattr(metrics, name)
        labels = values[:arity]
        child = metrics.child(metric, *labels) if kept else metric.labels(*labels)
        if name == "upstream_latency":
            child.observe(amount / 1000)
        else:
            child.inc(amount)


def samples(metrics: Metrics) -> list:
    # the ``_created`` samples are the children's creation times: not what is compared
    return sorted(
        (s.name, tuple(sorted(s.labels.items())), s.value)
        for family in metrics.registry.collect()
        for s in family.samples
        if not s.name.endswith("_created")
    )


@settings(max_examples=60, deadline=None)
@given(UPDATES)
def test_kept_children_are_the_metrics_own(updates: list) -> None:
    kept, fresh = Metrics(), Metrics()
    apply(kept, updates, kept=True)
    apply(fresh, updates, kept=False)
    assert samples(kept) == samples(fresh)
    for (name, arity), values, _ in updates:
        metric = getattr(kept, name)
        assert kept.child(metric, *values[:arity]) is metric.labels(*values[:arity])
