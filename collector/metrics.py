"""Prometheus metrics of the collector, on a registry passed in explicitly.

Label values come from bounded sets only: model and prompt version pairs are
kept up to ``max_cohort_labels`` distinct pairs (25), after which new pairs are
counted under ``other``; reasons are the closed set of ``FieldError.code``.
25 pairs x 3 outcomes x 2 samples (``_total`` and ``_created``) is 150 series:
with the histograms and the analyzer's gauges, the whole exposition stays
under 500 series whatever the traffic (reliability/test_metric_cardinality.py).

>>> m = CollectorMetrics(CollectorRegistry())
>>> m.count_events("accepted", "gpt-4o", "v1", 3)
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = ["CollectorMetrics", "CollectorRegistry", "UncheckedOutputs"]

_OTHER = "other"


class CollectorMetrics:
    """Counters and histograms of ingestion."""

    def __init__(self, registry: CollectorRegistry, *, max_cohort_labels: int = 25) -> None:
        self._max = max_cohort_labels
        self._pairs: set[tuple[str, str]] = set()
        self._lock = threading.Lock()
        self.events = Counter(
            "shapewatch_events_total",
            "Events received, by outcome, model and prompt version.",
            ["outcome", "model", "prompt_version"],
            registry=registry,
        )
        self.rejected = Counter(
            "shapewatch_events_rejected_total", "Events rejected, by reason code.", ["reason"], registry=registry
        )
        self.dedup_hits = Counter(
            "shapewatch_dedup_hits_total", "Events whose event_id was already stored (retries).", registry=registry
        )
        self.provider_outcomes = Counter(
            "shapewatch_provider_outcomes_total",
            "Provider responses that yielded no usable output, by provider and kind.",
            ["provider", "kind"],
            registry=registry,
        )
        self.otlp_spans = Counter(
            "shapewatch_otlp_spans_total",
            "Spans received on POST /v1/traces, by outcome: mapped, error, or the reason a span was "
            "skipped (content_not_captured, no_structured_output, operation_not_mapped, not_genai).",
            ["outcome"],
            registry=registry,
        )
        self.request_seconds = Histogram(
            "shapewatch_request_seconds",
            "HTTP ingest request latency.",
            ["route"],
            registry=registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )
        self.batch_events = Histogram(
            "shapewatch_commit_batch_events",
            "Events per group-commit transaction.",
            registry=registry,
            buckets=(1, 5, 10, 50, 100, 500, 1000, 5000, 10000, 50000),
        )
        self.commit_seconds = Histogram(
            "shapewatch_commit_seconds",
            "Time to store and commit one batch.",
            registry=registry,
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )

    def _labels(self, model: str, prompt_version: str) -> tuple[str, str]:
        pair = (model, prompt_version)
        with self._lock:
            if pair in self._pairs:
                return pair
            if len(self._pairs) < self._max:
                self._pairs.add(pair)
                return pair
        return (_OTHER, _OTHER)

    def count_events(self, outcome: str, model: str, prompt_version: str, n: int = 1) -> None:
        m, p = self._labels(model, prompt_version)
        self.events.labels(outcome, m, p).inc(n)
        if outcome == "duplicate":
            self.dedup_hits.inc(n)

    def count_rejected(self, codes: set[str] | frozenset[str]) -> None:
        """One rejected event, whose reasons had these codes (each reason counted once)."""
        self.events.labels("rejected", _OTHER, _OTHER).inc()
        for code in codes:
            self.rejected.labels(code).inc()

    def observe_batch(self, events: int, seconds: float) -> None:
        self.batch_events.observe(events)
        self.commit_seconds.observe(seconds)


class UncheckedOutputs(Collector):
    """Outputs of registered contract versions counted ``unchecked``, by reason (slow: one check
    over its time limit; budget: a version's checks over their time per merge; other: beyond the
    bucket's quota, or a check that raised), read from the store at scrape time.

    >>> registry.register(UncheckedOutputs(store.unchecked_counts))   # doctest: +SKIP
    """

    REASONS = ("slow", "budget", "other")

    def __init__(self, read: Callable[[], Mapping[str, int]]) -> None:
        self._read = read

    def collect(self) -> Iterator[Metric]:
        counts = dict(self._read())
        family = CounterMetricFamily(
            "shapewatch_contract_unchecked_outputs",
            "Outputs of registered contract versions not checked, by reason.",
            labels=["reason"],
        )
        for reason in self.REASONS:
            family.add_metric([reason], counts.get(reason, 0))
        yield family
