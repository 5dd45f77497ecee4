"""Ingestion health read from the service's ``GET /metrics`` (Prometheus text).

The counters are the service process's own: they start at zero when it starts.

>>> h = parse_metrics('shapewatch_events_total{outcome="accepted",model="m",prompt_version="p"} 3.0\\n')
>>> h.events_by_outcome
{'accepted': 3.0}
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["IngestionHealth", "parse_metrics"]


@dataclass(frozen=True)
class IngestionHealth:
    events_by_outcome: dict[str, float] = field(default_factory=dict)
    events_by_cohort: dict[tuple[str, str], dict[str, float]] = field(default_factory=dict)  # (model, prompt)
    rejected_by_reason: dict[str, float] = field(default_factory=dict)
    duplicates: float = 0.0
    provider_outcomes: dict[tuple[str, str], float] = field(default_factory=dict)  # (provider, kind)
    analyzer_runs: dict[str, float] = field(default_factory=dict)  # result -> count
    analyzer_last_success: float = 0.0  # Unix time, 0 when none
    alerts: dict[tuple[str, str], float] = field(default_factory=dict)  # (state, severity)
    notifications_pending: dict[str, float] = field(default_factory=dict)
    job_runs: dict[tuple[str, str], float] = field(default_factory=dict)  # (job, outcome)

    @property
    def events_total(self) -> float:
        return sum(self.events_by_outcome.values())


def parse_metrics(text: str) -> IngestionHealth:
    outcome: dict[str, float] = defaultdict(float)
    cohort: dict[tuple[str, str], dict[str, float]] = defaultdict(lambda: defaultdict(float))
    rejected: dict[str, float] = defaultdict(float)
    provider: dict[tuple[str, str], float] = defaultdict(float)
    runs: dict[str, float] = {}
    alerts: dict[tuple[str, str], float] = {}
    pending: dict[str, float] = {}
    jobs: dict[tuple[str, str], float] = {}
    duplicates = last_success = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = s.labels
            if s.name == "shapewatch_events_total":
                outcome[labels.get("outcome", "")] += s.value
                cohort[(labels.get("model", ""), labels.get("prompt_version", ""))][labels.get("outcome", "")] += (
                    s.value
                )
            elif s.name == "shapewatch_events_rejected_total":
                rejected[labels.get("reason", "")] += s.value
            elif s.name == "shapewatch_dedup_hits_total":
                duplicates += s.value
            elif s.name == "shapewatch_provider_outcomes_total":
                provider[(labels.get("provider", ""), labels.get("kind", ""))] += s.value
            elif s.name == "shapewatch_analyzer_runs_total":
                runs[labels.get("result", "")] = s.value
            elif s.name == "shapewatch_analyzer_last_success_timestamp_seconds":
                last_success = s.value
            elif s.name == "shapewatch_alerts":
                alerts[(labels.get("state", ""), labels.get("severity", ""))] = s.value
            elif s.name == "shapewatch_notifications_pending":
                pending[labels.get("target", "")] = s.value
            elif s.name == "shapewatch_job_runs_total":
                jobs[(labels.get("job", ""), labels.get("outcome", ""))] = s.value
    return IngestionHealth(
        dict(outcome),
        {k: dict(v) for k, v in cohort.items()},
        dict(rejected),
        duplicates,
        dict(provider),
        runs,
        last_success,
        alerts,
        pending,
        jobs,
    )
