"""What an alert tells the on-call engineer besides what changed: since when, which model, where to
look and what to do; and whether a cohort's traffic stopped.

- ``served_models``: the served models of the window and of the baseline with their shares, and
  those new since the baseline (an alias answered by a new snapshot);
- ``with_context``: each alert that opens gets its ``onset`` (``onset.py``) and its ``links``: the
  field page of the dashboard on a period that starts before the onset
  (``{dashboard_url}/field?cohort=ID&field=PATH&since=T&until=T``) and the runbook of its kind;
- ``runbook``: the runbooks shipped in ``analysis/runbooks/KIND.md`` (what it means, what to check,
  what to do), served at ``GET /v1/runbooks/{kind}``; a contract's ``runbook_url`` overrides them;
- ``traffic_check``: ``traffic_stopped``, a cohort with an active baseline receiving under
  ``traffic_min_share`` of its baseline's rate over ``traffic_period``.

>>> served_models({"gpt-4o-2024-11-20": 30, "gpt-4o-2024-08-06": 70}, {"gpt-4o-2024-08-06": 100})  # doctest: +SKIP
{'window': [{'model': 'gpt-4o-2024-08-06', 'share': 0.7}, ...], 'new': ['gpt-4o-2024-11-20'], ...}
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

from scipy.stats import poisson

from shapewatch.collector import Store

from .alerts import Alert, AlertState
from .config import AlertKind, AnalyzerConfig, FieldRules
from .onset import find_onset

if TYPE_CHECKING:
    from .rules import Check

__all__ = [
    "TRAFFIC_FIELD",
    "dashboard_link",
    "runbook",
    "runbook_url",
    "served_models",
    "traffic_check",
    "with_context",
]

log = logging.getLogger(__name__)

#: The field of a traffic_stopped alert: the cohort's outputs as a whole.
TRAFFIC_FIELD = "$"
#: How much earlier than the onset the linked field page starts, as a share of the time since it.
_LEAD = 0.25
_MIN_LEAD = timedelta(hours=1)


def _iso(t: datetime) -> str:
    return t.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _parse(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _shares(counts: Mapping[str, int]) -> list[dict[str, Any]]:
    total = sum(counts.values())
    if not total:
        return []
    return [
        {"model": m, "share": round(n / total, 6)} for m, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    ]


def served_models(window: Mapping[str, int], baseline: Mapping[str, int]) -> dict[str, Any]:
    """The served models of the window and of the baseline, by share, and those new since it."""
    return {
        "window": _shares(window),
        "baseline": _shares(baseline),
        "new": sorted(m for m, n in window.items() if n and m not in baseline) if baseline else [],
    }


# --- runbooks -----------------------------------------------------------------------------------


@cache
def runbook(kind: str) -> str | None:
    """The runbook shipped for an alert kind (Markdown), or None for an unknown kind."""
    try:
        AlertKind(kind)
    except ValueError:
        return None
    base = resources.files("shapewatch.analysis") / "runbooks"
    for name in (f"{kind}.md", "default.md"):
        page = base / name
        if page.is_file():
            return page.read_text(encoding="utf-8")
    return None


def runbook_url(config: AnalyzerConfig, contract: str, kind: str) -> str | None:
    """The contract's own runbook, else the shipped one served by the service (when
    ``[oncall] service_url`` says where), else None."""
    own = config.runbook_urls.get(contract)
    if own:
        return own
    if config.oncall.service_url:
        return f"{config.oncall.service_url}/v1/runbooks/{quote(kind)}"
    return None


def dashboard_link(
    dashboard_url: str | None, cohort_id: int, field: str, onset: Mapping[str, Any] | None, at: datetime
) -> str | None:
    """The field page on a period that shows the onset: from before it to ``at`` (rounded up to
    the minute), or the last day when the onset is unknown."""
    if not dashboard_url:
        return None
    until = (at + timedelta(minutes=1)).replace(second=0, microsecond=0)
    start = _parse(str(onset["low"])) if onset else until - timedelta(days=1)
    since = start - max(_MIN_LEAD, (until - start) * _LEAD)
    since = since.replace(minute=0, second=0, microsecond=0)
    query = urlencode({"cohort": cohort_id, "field": field, "since": _iso(since), "until": _iso(until)})
    return f"{dashboard_url}/field?{query}"


def with_context(
    store: Store,
    config: AnalyzerConfig,
    cohort_ids: Mapping[Any, int],
    changed: dict[str, Alert],
    at: datetime,
) -> dict[str, Alert]:
    """Changed alerts that are open and have no onset yet get their onset and links (kept while
    they stay open: ``alerts._kept``). Never raises: an alert without context is still an alert."""
    out = {}
    for fp, a in changed.items():
        if a.state is not AlertState.resolved and "links" not in a.diff and a.cohort in cohort_ids:
            try:
                cid = cohort_ids[a.cohort]
                onset = find_onset(store, a.to_json(), cid, at, config.oncall.onset_lookback)
                links = {
                    "dashboard": dashboard_link(config.oncall.dashboard_url, cid, a.field, onset, at),
                    "runbook": runbook_url(config, a.cohort.contract, a.kind.value),
                }
                a = replace(a, diff={**a.diff, "onset": onset, "links": links})
            except Exception:  # context helps; its failure must not cost the alert
                log.exception("finding the onset of %s on %s failed", a.kind.value, a.field)
        out[fp] = a
    return out


# --- traffic_stopped ------------------------------------------------------------------------------


def traffic_check(
    baseline_events: int,
    baseline_span: timedelta,
    recent_events: int,
    config: AnalyzerConfig,
    rules: FieldRules,
) -> Check | None:
    """``traffic_stopped`` for one cohort with an active baseline: the outputs of the last
    ``traffic_period`` against the baseline's rate over the same time. A breach needs under
    ``traffic_min_share`` of the expected outputs and a Poisson p-value under alpha (so a quiet
    cohort whose baseline expects 3 outputs an hour is not called stopped); None when the
    baseline's rate is unknown."""
    from .rules import Check

    hours = baseline_span.total_seconds() / 3600
    period = config.oncall.traffic_period
    if baseline_events <= 0 or hours <= 0 or period is None:
        return None
    expected = baseline_events / hours * period.total_seconds() / 3600
    share = recent_events / expected if expected else 1.0
    p = float(poisson.cdf(recent_events, expected))
    effect = max(0.0, 1.0 - share)
    label = f"{period.total_seconds() / 3600:g}h"
    return Check(
        TRAFFIC_FIELD,
        AlertKind.traffic_stopped,
        None,
        rules.severity_of(AlertKind.traffic_stopped),
        round(effect, 6),
        round(1.0 - config.oncall.traffic_min_share, 6),
        p,
        rules.alpha,
        {
            "expected_outputs": round(expected, 3),
            "baseline_outputs": baseline_events,
            "baseline_hours": round(hours, 3),
        },
        {"outputs": recent_events, "share_of_expected": round(share, 6), "period": label},
        f"{recent_events} outputs in the last {label}, {100 * share:.1f}% of the {expected:.0f} the baseline's rate expects",
        q_value=p,
        window=label,
    )
