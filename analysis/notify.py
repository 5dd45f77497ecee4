"""Notifiers: page alerts to a pager, through a durable outbox in the store's file.

A page alert goes to one or more targets: PagerDuty (Events API v2), a
receiver that accepts Alertmanager's webhook body, or a generic JSON webhook.
Warn alerts go to the dashboard, and optionally to a daily digest
(``send_digest``).

Why an outbox. The issue's promise is "never a second incident, on retry or
after a restart". Sending from the code that changes an alert's state cannot
keep it: a crash between the state change and the send loses the page, and a
crash between the send and recording it sends it again with nothing to tell
the pager it is the same one. So notifications are rows:

- ``enqueue`` writes one row per (target, notice) in the *same transaction*
  that changes the alert's state, so the change and its notification commit
  together or not at all. The key (target, fingerprint, episode, action) makes
  enqueueing idempotent: evaluating the same firing alert again adds nothing.
- ``Notifier.deliver`` (called by the scheduler) sends the due pending rows
  and then marks each one sent, retried later (429, 5xx, timeouts, refused or
  dropped connections; exponential backoff with jitter, Retry-After honoured)
  or failed (any other answer, or ``max_attempts`` used up). After a restart
  the pending rows are simply sent then.
- A row sent but not yet marked sent (a crash in between, or an answer lost
  with a dropped connection) is sent again with the *same* dedup key: the
  alert's fingerprint. PagerDuty folds a trigger for an incident that is
  still open into that incident, so the pager sees one incident; the generic
  webhook carries ``Idempotency-Key: fingerprint:episode:action`` for the
  same purpose, and Alertmanager-style receivers deduplicate on the alert's
  labels (which hold the fingerprint).

An alert that resolves and fires again is a new *episode* (1, 2, ...): a new
incident. Because the dedup key is the fingerprint in every episode, the rows
of one (target, fingerprint) are sent strictly in order (episode, trigger
before resolve) and nothing overtakes a row still waiting for a retry: a
trigger of episode 2 sent before the resolve of episode 1 would be folded
into the old incident and then closed with it.

>>> with store.transaction("updating alerts") as con:          # doctest: +SKIP
...     ...                                                   # the alert state change
...     enqueue(con, targets, [notice_for(alert, episode=1, action=NoticeAction.trigger)], now)
>>> notifier = Notifier(store, targets, registry=registry)     # doctest: +SKIP
>>> notifier.deliver()                                         # doctest: +SKIP
DeliveryReport(sent=1, retried=0, failed=0)
"""

from __future__ import annotations

import heapq
import logging
import math
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import Enum
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit

import httpx
import orjson
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from shapewatch.collector import Store, StoreError, parse_retry_after
from shapewatch.collector.store import NOTIFY_SCHEMA
from shapewatch.collector.store.outbox import add_notification, trigger_started

from .errors import NotifyConfigInvalid

if TYPE_CHECKING:
    import duckdb

__all__ = [
    "NOTIFY_SCHEMA",
    "PAGERDUTY_EVENTS_URL",
    "DeliveryReport",
    "Notice",
    "NoticeAction",
    "Notifier",
    "Target",
    "TargetKind",
    "alertname",
    "digest_url_from_config",
    "enqueue",
    "notice_for",
    "send_digest",
    "summarize_alert",
    "targets_from_config",
]

log = logging.getLogger(__name__)


PAGERDUTY_EVENTS_URL = "https://events.pagerduty.com/v2/enqueue"

_SEVERITIES = ("page", "warn")
# PagerDuty's and Alertmanager's usual vocabulary for our two severities.
_MAPPED_SEVERITY = {"page": "critical", "warn": "warning"}
_PD_SUMMARY_MAX = 1024
_ERROR_BODY_MAX = 300
_RETRY_AFTER_MAX = 3600.0  # a server asking for more than an hour is not taken at its word
_USER_AGENT = "shapewatch-notifier"
_AM_ZERO_TIME = "0001-01-01T00:00:00Z"  # Alertmanager's endsAt of a firing alert


class NoticeAction(str, Enum):
    trigger = "trigger"
    resolve = "resolve"


class TargetKind(str, Enum):
    pagerduty = "pagerduty"
    alertmanager = "alertmanager"
    webhook = "webhook"


@dataclass(frozen=True)
class Notice:
    """One thing to tell the pagers about an alert: it fired (trigger) or cleared (resolve).

    >>> Notice("9f2c", 1, NoticeAction.trigger, "page", summarize_alert(alert), alert)   # doctest: +SKIP
    """

    fingerprint: str
    #: the alert's firing episode, 1, 2, ...: an alert that resolves and fires again is a new incident
    episode: int
    action: NoticeAction
    severity: str  # page | warn
    summary: str  # one line
    alert: dict[str, Any] = field(hash=False)  # the alert JSON (Alert.to_json)
    dashboard_url: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "action", NoticeAction(self.action))
        if self.severity not in _SEVERITIES:
            raise ValueError(f"Notice.severity must be one of {_SEVERITIES}, not {self.severity!r}")
        if self.episode < 1:
            raise ValueError(f"Notice.episode counts from 1, got {self.episode}")
        if not self.fingerprint:
            raise ValueError("Notice.fingerprint must not be empty")


def summarize_alert(alert: Mapping[str, Any]) -> str:
    """One line: ``presence_drop on customer.tier (model, intake-v3, intake): presence 61.0% -> 30.0%``."""
    cohort = alert.get("cohort") or {}
    parts = [str(cohort.get(k)) for k in ("model", "prompt_version", "contract") if cohort.get(k) is not None]
    line = f"{alert.get('kind', 'alert')} on {alert.get('field', '?')}"
    if parts:
        line += f" ({', '.join(parts)})"
    if alert.get("detail"):
        line += f": {alert['detail']}"
    return " ".join(line.split())  # one line, whatever the detail held


def notice_for(
    alert: Mapping[str, Any], *, episode: int, action: NoticeAction | str, dashboard_url: str | None = None
) -> Notice:
    """The notice for an alert JSON (``Alert.to_json``: fingerprint, severity, cohort, field, kind, detail)."""
    return Notice(
        str(alert["fingerprint"]),
        episode,
        NoticeAction(action),
        str(alert["severity"]),
        summarize_alert(alert),
        dict(alert),
        dashboard_url,
    )


@dataclass(frozen=True)
class Target:
    """Where notices go. Build them from configuration with ``targets_from_config``.

    >>> Target("pd", TargetKind.pagerduty, PAGERDUTY_EVENTS_URL, routing_key="R0UT1NGKEY")   # doctest: +SKIP
    """

    name: str
    kind: TargetKind
    url: str
    routing_key: str | None = field(default=None, repr=False)  # a secret: kept out of logs
    severities: tuple[str, ...] = ("page",)
    timeout_seconds: float = 10.0
    max_attempts: int = 8
    headers: dict[str, str] = field(default_factory=dict, repr=False, hash=False)
    #: webhook only: "shapewatch" (the notice as JSON) or "alertmanager-webhook" (the body
    #: Alertmanager sends its webhook receivers, version 4: what kind "alertmanager" posted before)
    format: str = "shapewatch"
    #: alertmanager only: firing alerts are posted again this often (Alertmanager resolves an
    #: alert it has not heard of for its resolve_timeout, 5 minutes by default)
    repeat_seconds: float = 60.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", TargetKind(self.kind))
        object.__setattr__(self, "severities", tuple(self.severities))
        where = f"target {self.name!r}"
        if self.kind is TargetKind.pagerduty and not self.routing_key:
            raise NotifyConfigInvalid(f"{where}.routing_key", 'required for kind "pagerduty"')
        if not self.severities or any(s not in _SEVERITIES for s in self.severities):
            raise NotifyConfigInvalid(f"{where}.severities", f"must be a non-empty subset of {list(_SEVERITIES)}")
        if not self.timeout_seconds > 0:
            raise NotifyConfigInvalid(f"{where}.timeout_seconds", "must be > 0")
        if self.max_attempts < 1:
            raise NotifyConfigInvalid(f"{where}.max_attempts", "must be >= 1")


# --- configuration ----------------------------------------------------------------------------

_NOTIFY_KEYS = ("digest", "targets")
_TARGET_KEYS = (
    "format",
    "headers",
    "kind",
    "max_attempts",
    "name",
    "repeat_seconds",
    "routing_key",
    "severities",
    "timeout_seconds",
    "url",
)
_WEBHOOK_FORMATS = ("shapewatch", "alertmanager-webhook")
_AM_ALERTS_PATH = "/api/v2/alerts"


def _check_notify_table(data: Mapping[str, Any]) -> None:
    if not isinstance(data, Mapping):
        raise NotifyConfigInvalid("notify", "must be a table", "write it as [notify] with [[notify.targets]] entries")
    for key in data:
        if key not in _NOTIFY_KEYS:
            raise NotifyConfigInvalid(f"notify.{key}", "unknown key", f"use one of: {', '.join(_NOTIFY_KEYS)}")


def _check_url(key: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise NotifyConfigInvalid(key, "required, a string", "set it to an http:// or https:// URL")
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise NotifyConfigInvalid(key, f"{value!r} is not an http(s) URL", "set it to an http:// or https:// URL")
    return value


def _check_number(key: str, value: object, *, integer: bool, minimum: float, strict: bool) -> float:
    ok_type = isinstance(value, int) if integer else isinstance(value, int | float)
    if isinstance(value, bool) or not ok_type:
        raise NotifyConfigInvalid(key, f"must be {'an integer' if integer else 'a number'}, not {value!r}")
    assert isinstance(value, int | float)
    if math.isnan(value) or (value <= minimum if strict else value < minimum):
        raise NotifyConfigInvalid(key, f"must be {'>' if strict else '>='} {minimum:g}, not {value!r}")
    return float(value)


def _target_from_table(i: int, item: object, seen: dict[str, int]) -> Target:
    where = f"notify.targets[{i}]"
    if not isinstance(item, Mapping):
        raise NotifyConfigInvalid(where, "must be a table", "write each target as a [[notify.targets]] table")
    for key in item:
        if key not in _TARGET_KEYS:
            raise NotifyConfigInvalid(f"{where}.{key}", "unknown key", f"use one of: {', '.join(_TARGET_KEYS)}")
    name = item.get("name")
    if not isinstance(name, str) or not name.strip():
        raise NotifyConfigInvalid(
            f"{where}.name",
            "required, a non-empty string",
            'name the target (it labels metrics and the outbox rows), e.g. name = "pd"',
        )
    if name in seen:
        raise NotifyConfigInvalid(
            f"{where}.name",
            f"{name!r} is already the name of notify.targets[{seen[name]}]",
            "give each target its own name",
        )
    raw_kind = item.get("kind")
    kinds = ", ".join(f'"{k.value}"' for k in TargetKind)
    try:
        kind = TargetKind(raw_kind)
    except ValueError:
        problem = "required" if raw_kind is None else f"unknown kind {raw_kind!r}"
        raise NotifyConfigInvalid(f"{where}.kind", problem, f"use one of: {kinds}") from None
    if kind is TargetKind.pagerduty and "url" not in item:
        url = PAGERDUTY_EVENTS_URL
    else:
        url = _check_url(f"{where}.url", item.get("url"))
    if kind is TargetKind.alertmanager and not urlsplit(url).path.rstrip("/").endswith(_AM_ALERTS_PATH):
        url = url.rstrip("/") + _AM_ALERTS_PATH  # Alertmanager's address; its API path is known
    fmt = item.get("format", "shapewatch")
    if "format" in item and kind is not TargetKind.webhook:
        raise NotifyConfigInvalid(f"{where}.format", f'only used by kind "webhook", not "{kind.value}"', "remove it")
    if fmt not in _WEBHOOK_FORMATS:
        raise NotifyConfigInvalid(
            f"{where}.format", f"unknown format {fmt!r}", f"use one of: {', '.join(map(repr, _WEBHOOK_FORMATS))}"
        )
    if "repeat_seconds" in item and kind is not TargetKind.alertmanager:
        raise NotifyConfigInvalid(
            f"{where}.repeat_seconds", f'only used by kind "alertmanager", not "{kind.value}"', "remove it"
        )
    repeat = _check_number(
        f"{where}.repeat_seconds", item.get("repeat_seconds", 60.0), integer=False, minimum=0, strict=True
    )
    if repeat > 86400:
        raise NotifyConfigInvalid(
            f"{where}.repeat_seconds", f"must be at most 86400, not {repeat:g}", "Alertmanager forgets in minutes"
        )
    routing_key = item.get("routing_key")
    if kind is TargetKind.pagerduty:
        if not isinstance(routing_key, str) or not routing_key.strip():
            raise NotifyConfigInvalid(
                f"{where}.routing_key",
                'required for kind "pagerduty"',
                "set it to the integration key of the PagerDuty service (Events API v2)",
            )
    elif routing_key is not None:
        raise NotifyConfigInvalid(
            f"{where}.routing_key", f'only used by kind "pagerduty", not "{kind.value}"', "remove it"
        )
    severities = item.get("severities", ["page"])
    if (
        not isinstance(severities, list)
        or not severities
        or any(not isinstance(s, str) or s not in _SEVERITIES for s in severities)
    ):
        raise NotifyConfigInvalid(
            f"{where}.severities",
            f"must be a non-empty list of {list(_SEVERITIES)}, not {severities!r}",
            'e.g. severities = ["page"]',
        )
    timeout = _check_number(
        f"{where}.timeout_seconds", item.get("timeout_seconds", 10.0), integer=False, minimum=0, strict=True
    )
    max_attempts = int(
        _check_number(f"{where}.max_attempts", item.get("max_attempts", 8), integer=True, minimum=1, strict=False)
    )
    headers = item.get("headers", {})
    if not isinstance(headers, Mapping) or any(
        not isinstance(k, str) or not isinstance(v, str) for k, v in headers.items()
    ):
        raise NotifyConfigInvalid(
            f"{where}.headers", "must be a table of strings", 'e.g. headers = { Authorization = "Bearer ..." }'
        )
    seen[name] = i
    return Target(
        name=name,
        kind=kind,
        url=url,
        routing_key=routing_key,
        severities=tuple(dict.fromkeys(severities)),
        timeout_seconds=timeout,
        max_attempts=max_attempts,
        headers=dict(headers),
        format=fmt,
        repeat_seconds=repeat,
    )


def targets_from_config(data: Mapping[str, Any]) -> list[Target]:
    """The targets of the ``notify`` table of a parsed TOML configuration, validated.

    Raises ``NotifyConfigInvalid`` naming the key and the fix, e.g.
    ``notify.targets[0].routing_key: required for kind "pagerduty"; set it to ...``.
    A PagerDuty target without ``url`` uses the public Events API v2 endpoint.
    """
    _check_notify_table(data)
    raw = data.get("targets", [])
    if not isinstance(raw, list):
        raise NotifyConfigInvalid(
            "notify.targets", "must be an array of tables", "write each target as a [[notify.targets]] table"
        )
    seen: dict[str, int] = {}
    return [_target_from_table(i, item, seen) for i, item in enumerate(raw)]


def digest_url_from_config(data: Mapping[str, Any]) -> str | None:
    """The URL of ``[notify.digest]`` (the daily digest of warn alerts), or None when there is none."""
    _check_notify_table(data)
    digest = data.get("digest")
    if digest is None:
        return None
    if not isinstance(digest, Mapping):
        raise NotifyConfigInvalid("notify.digest", "must be a table", 'write it as [notify.digest] with url = "..."')
    for key in digest:
        if key != "url":
            raise NotifyConfigInvalid(f"notify.digest.{key}", "unknown key", "the digest takes only url")
    return _check_url("notify.digest.url", digest.get("url"))


# --- the outbox ---------------------------------------------------------------------------------


def _utc(t: datetime) -> datetime:
    # A naive time is taken as UTC (as the SDK does); everything stored is zone-aware.
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _rfc3339(t: datetime) -> str:
    return _utc(t).isoformat().replace("+00:00", "Z")


def enqueue(con: duckdb.DuckDBPyConnection, targets: Sequence[Target], notices: Iterable[Notice], now: datetime) -> int:
    """Add the notices to the outbox; returns how many rows were new.

    Call it with the connection of the ``store.transaction(...)`` that changes the
    alerts' state, so a state change and its notifications commit together.
    A trigger goes to every target whose ``severities`` include the notice's; a
    resolve only to targets that got the trigger of the same episode or still
    have it pending. A notice already in the outbox adds nothing.
    """
    now = _utc(now)
    added = 0
    for notice in notices:
        for target in targets:
            if notice.action is NoticeAction.trigger:
                if notice.severity not in target.severities:
                    continue
                started = now
            else:
                queued = trigger_started(con, target.name, notice.fingerprint, notice.episode)
                if queued is None:
                    continue
                started = _utc(queued)
            payload = {
                "severity": notice.severity,
                "summary": notice.summary,
                "alert": notice.alert,
                "dashboard_url": notice.dashboard_url,
                "started_at": _rfc3339(started),
                "ended_at": _rfc3339(now) if notice.action is NoticeAction.resolve else None,
            }
            added += add_notification(
                con,
                (target.name, notice.fingerprint, notice.episode, notice.action.value),
                orjson.dumps(payload, default=str).decode(),
                now,
            )
    return added


@dataclass(frozen=True)
class _Row:
    target: str
    fingerprint: str
    episode: int
    action: NoticeAction
    payload: dict[str, Any]
    created_at: datetime
    attempts: int
    next_attempt_at: datetime

    @property
    def key(self) -> list[Any]:
        return [self.target, self.fingerprint, self.episode, self.action.value]

    @property
    def order(self) -> tuple[datetime, int, int, str]:
        return (self.created_at, self.episode, self.action is NoticeAction.resolve, self.fingerprint)


# --- wire formats -------------------------------------------------------------------------------


def _cohort(alert: Mapping[str, Any]) -> dict[str, str]:
    cohort = alert.get("cohort") or {}
    return {k: str(cohort[k]) for k in ("model", "prompt_version", "contract") if cohort.get(k) is not None}


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _pagerduty_body(target: Target, row: _Row) -> dict[str, Any]:
    body: dict[str, Any] = {
        "routing_key": target.routing_key,
        "event_action": row.action.value,
        "dedup_key": row.fingerprint,
    }
    if row.action is NoticeAction.resolve:
        return body
    p = row.payload
    alert: dict[str, Any] = p["alert"]
    details: dict[str, Any] = {
        "summary": _clip(p["summary"], _PD_SUMMARY_MAX),
        "source": "shapewatch",
        "severity": _MAPPED_SEVERITY[p["severity"]],
    }
    if alert.get("field") is not None:
        details["component"] = str(alert["field"])
    cohort = _cohort(alert)
    if len(cohort) == 3:
        details["group"] = f"{cohort['model']}/{cohort['prompt_version']}/{cohort['contract']}"
    if alert.get("kind") is not None:
        details["class"] = str(alert["kind"])
    details["custom_details"] = alert
    body["payload"] = details
    links = _links(p)
    if links:
        body["links"] = [
            {"href": href, "text": text}
            for href, text in ((links.get("dashboard"), "shapewatch dashboard"), (links.get("runbook"), "runbook"))
            if href
        ]
    return body


def _links(p: Mapping[str, Any]) -> dict[str, Any]:
    """The notice's links: the alert's own (dashboard, runbook), or the notice's dashboard_url."""
    links = dict((p.get("alert") or {}).get("links") or {})
    if not links.get("dashboard") and p.get("dashboard_url"):
        links["dashboard"] = p["dashboard_url"]
    return {k: v for k, v in links.items() if v}


def alertname(kind: object) -> str:
    """``presence_drop`` -> ``ShapewatchPresenceDrop`` (Alertmanager's CamelCase alert names)."""
    return "Shapewatch" + "".join(part.capitalize() for part in str(kind or "alert").split("_"))


def _alertmanager_alert(row: _Row, now: datetime) -> dict[str, Any]:
    """One alert of ``POST /api/v2/alerts``: labels identify it (the fingerprint, here the
    incident's id, keeps each one apart), a firing one has no endsAt, a resolved one ends when
    it resolved."""
    p = row.payload
    alert: dict[str, Any] = p["alert"]
    labels = {
        "alertname": alertname(alert.get("kind")),
        "severity": _MAPPED_SEVERITY[p["severity"]],
        **_cohort(alert),
        "fingerprint": row.fingerprint,
    }
    if alert.get("field") is not None:
        labels["field"] = str(alert["field"])
    links = _links(p)
    annotations = {"summary": p["summary"], "description": str(alert.get("detail") or p["summary"])}
    if links.get("runbook"):
        annotations["runbook_url"] = links["runbook"]
    onset = alert.get("onset")
    if isinstance(onset, Mapping) and onset.get("at"):
        annotations["onset"] = str(onset["at"])
    body: dict[str, Any] = {
        "labels": labels,
        "annotations": annotations,
        "startsAt": p["started_at"],
        "generatorURL": links.get("dashboard", ""),
    }
    if row.action is NoticeAction.resolve:
        body["endsAt"] = p.get("ended_at") or _rfc3339(now)
    return body


def _alertmanager_webhook_body(target: Target, row: _Row) -> dict[str, Any]:
    # The body Alertmanager POSTs to a webhook_config receiver (version 4), one alert per body.
    p = row.payload
    alert: dict[str, Any] = p["alert"]
    status = "firing" if row.action is NoticeAction.trigger else "resolved"
    labels = {
        "alertname": str(alert.get("kind", "shapewatch")),
        "severity": _MAPPED_SEVERITY[p["severity"]],
        **_cohort(alert),
    }
    if alert.get("field") is not None:
        labels["field"] = str(alert["field"])
    labels["fingerprint"] = row.fingerprint
    annotations = {"summary": p["summary"], "description": str(alert.get("detail") or p["summary"])}
    url = _links(p).get("dashboard", "")
    return {
        "version": "4",
        "groupKey": f'{{}}:{{fingerprint="{row.fingerprint}"}}',
        "truncatedAlerts": 0,
        "status": status,
        "receiver": target.name,
        "groupLabels": {"fingerprint": row.fingerprint},
        "commonLabels": labels,
        "commonAnnotations": annotations,
        "externalURL": url,
        "alerts": [
            {
                "status": status,
                "labels": labels,
                "annotations": annotations,
                "startsAt": p["started_at"],
                "endsAt": p.get("ended_at") or _AM_ZERO_TIME,
                "generatorURL": url,
                "fingerprint": row.fingerprint,
            }
        ],
    }


def _webhook_body(row: _Row) -> dict[str, Any]:
    p = row.payload
    links = _links(p)
    return {
        "action": row.action.value,
        "fingerprint": row.fingerprint,
        "episode": row.episode,
        "severity": p["severity"],
        "summary": p["summary"],
        "alert": p["alert"],
        "dashboard_url": links.get("dashboard"),
        "links": {"dashboard": links.get("dashboard"), "runbook": links.get("runbook")},
    }


def _request(target: Target, row: _Row, now: datetime | None = None) -> tuple[bytes, dict[str, str]]:
    headers = {"Content-Type": "application/json", **target.headers}
    body: Any
    if target.kind is TargetKind.pagerduty:
        body = _pagerduty_body(target, row)
    elif target.kind is TargetKind.alertmanager:
        body = [_alertmanager_alert(row, now or _utcnow())]
    elif target.format == "alertmanager-webhook":
        body = _alertmanager_webhook_body(target, row)
    else:
        body = _webhook_body(row)
        headers["Idempotency-Key"] = f"{row.fingerprint}:{row.episode}:{row.action.value}"
    return orjson.dumps(body, default=str), headers


# --- delivery ----------------------------------------------------------------------------------


def _parse_retry_after(value: str | None, now: datetime) -> float | None:
    """Seconds to wait from a Retry-After header (the SDK's reading), capped at an hour."""
    seconds = parse_retry_after(value, _utc(now))
    return None if seconds is None else min(seconds, _RETRY_AFTER_MAX)


def _backoff(base: float, cap: float, attempt: int, rng: random.Random) -> float:
    # Exponential, with "equal jitter": at least half the step, so retries spread out
    # without ever coming back immediately.
    step = min(cap, base * 2.0 ** min(attempt - 1, 62))
    return step / 2 + rng.random() * step / 2


_Result = Literal["sent", "retried", "failed"]
_RESULTS: tuple[_Result, ...] = ("sent", "retried", "failed")


@dataclass(frozen=True)
class _Answer:
    """What one attempt got: success, a retryable failure (with Retry-After), or a final one."""

    result: _Result
    error: str | None = None
    retry_after: float | None = None


def _post(
    client: httpx.Client, url: str, body: bytes, headers: Mapping[str, str], timeout: float, now: datetime
) -> _Answer:
    """One POST, classified; retryable: 429, 5xx, timeouts and connection errors. Never raises."""
    try:
        response = client.post(url, content=body, headers=headers, timeout=timeout)
    except httpx.TransportError as exc:  # timeouts, refused, reset or dropped connections
        return _Answer("retried", f"{type(exc).__name__}: {exc}".rstrip(": "))
    except Exception as exc:  # a delivery problem must never reach the scheduler
        log.exception("notification POST to %s failed unexpectedly", url)
        return _Answer("failed", f"{type(exc).__name__}: {exc}")
    status = response.status_code
    if 200 <= status < 300:
        return _Answer("sent")
    error = f"HTTP {status}: {' '.join(response.text.split())[:_ERROR_BODY_MAX]}".rstrip(": ")
    if status == 429 or status >= 500:
        return _Answer("retried", error, _parse_retry_after(response.headers.get("Retry-After"), now))
    return _Answer("failed", error)


@dataclass(frozen=True)
class DeliveryReport:
    """What one ``Notifier.deliver`` pass did, in attempts."""

    sent: int = 0
    retried: int = 0  # failed for now, scheduled again
    failed: int = 0  # given up: a final answer, or max_attempts used


class _OutboxCollector(Collector):
    """Pending notifications per target, read from the outbox at scrape time."""

    def __init__(self, store: Store, targets: Sequence[str], clock: Callable[[], datetime]) -> None:
        self._store, self._targets, self._clock = store, list(targets), clock

    def _families(self) -> tuple[GaugeMetricFamily, GaugeMetricFamily]:
        return (
            GaugeMetricFamily(
                "shapewatch_notifications_pending",
                "Notifications in the outbox not delivered yet, by target.",
                labels=["target"],
            ),
            GaugeMetricFamily(
                "shapewatch_notifications_oldest_pending_seconds",
                "Age of the oldest undelivered notification, by target (0 when none).",
                labels=["target"],
            ),
        )

    def describe(self) -> Iterable[GaugeMetricFamily]:
        return self._families()

    def collect(self) -> Iterable[GaugeMetricFamily]:
        pending, oldest = self._families()
        try:
            pending_rows = self._store.pending_by_target()
        except StoreError as exc:
            log.warning("cannot read the notification outbox for metrics: %s", exc)
            return ()
        found = {name: (n, _utc(first)) for name, (n, first) in pending_rows.items()}
        now = _utc(self._clock())
        for name in self._targets:
            n, first = found.get(name, (0, None))
            pending.add_metric([name], n)
            oldest.add_metric([name], max(0.0, (now - first).total_seconds()) if first is not None else 0.0)
        return (pending, oldest)


class Notifier:
    """Delivers the outbox to the targets; the scheduler calls ``deliver`` every few seconds.

    >>> notifier = Notifier(store, targets_from_config(config["notify"]), registry=registry)  # doctest: +SKIP
    >>> notifier.deliver()                                                                     # doctest: +SKIP
    DeliveryReport(sent=2, retried=1, failed=0)
    >>> notifier.close()                                                                       # doctest: +SKIP

    ``deliver`` never raises for a delivery problem (it logs, records the error on
    the row and counts it in ``shapewatch_notifications_total{target, result}``);
    a store error may propagate as ``StoreError``. Pass ``now`` (or ``clock``) and
    ``rng`` for deterministic schedules in tests.
    """

    def __init__(
        self,
        store: Store,
        targets: Sequence[Target],
        *,
        registry: CollectorRegistry,
        client: httpx.Client | None = None,
        clock: Callable[[], datetime] = _utcnow,
        backoff_base: float = 1.0,
        backoff_max: float = 300.0,
        rng: random.Random | None = None,
    ) -> None:
        names = [t.name for t in targets]
        if len(set(names)) != len(names):
            raise NotifyConfigInvalid("notify.targets", f"target names repeat: {names}", "give each its own name")
        self._store = store
        self._targets = {t.name: t for t in targets}
        self._own_client = client is None
        self._client = client if client is not None else httpx.Client(headers={"User-Agent": _USER_AGENT})
        self._clock = clock
        self._backoff_base = backoff_base
        self._backoff_max = backoff_max
        self._rng = rng or random.Random()
        self._lock = threading.Lock()  # one pass at a time, so a row is never sent by two at once
        self._reposted: dict[str, datetime] = {}  # alertmanager target -> when its alerts were last re-posted
        self._registry = registry
        self._results = Counter(
            "shapewatch_notifications",
            "Notification delivery attempts, by target and result.",
            ["target", "result"],
            registry=registry,
        )
        for name in names:
            for result in _RESULTS:
                self._results.labels(name, result)
        self._outbox = _OutboxCollector(store, names, clock)
        registry.register(self._outbox)
        for name, n in store.pending_elsewhere(names):
            log.warning("%d notifications for target %r stay pending: it is not configured any more", n, name)

    def close(self) -> None:
        """Unregister the metrics and close the HTTP client if this notifier made it."""
        for collector in (self._results, self._outbox):
            try:
                self._registry.unregister(collector)
            except KeyError:
                pass
        if self._own_client:
            self._client.close()

    def __enter__(self) -> Notifier:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def deliver(self, now: datetime | None = None) -> DeliveryReport:
        """Send every due pending notification, oldest first; returns what was done.

        Per (target, fingerprint) rows go strictly in order (episode, then trigger
        before resolve) and none overtakes one waiting for a retry. After a
        retryable failure the target is left alone until the next pass: it is
        down or asked to slow down, and every row would only spend an attempt.
        """
        now = _utc(now or self._clock())
        counts = dict.fromkeys(_RESULTS, 0)
        with self._lock:
            queues: dict[tuple[str, str], deque[_Row]] = {}
            for row in self._pending_rows():
                queues.setdefault((row.target, row.fingerprint), deque()).append(row)
            heads = [(q[0].order, key) for key, q in queues.items()]
            heapq.heapify(heads)
            resting: set[str] = set()
            while heads:
                _, key = heapq.heappop(heads)
                queue = queues[key]
                row = queue[0]
                if row.target in resting or row.next_attempt_at > now:
                    continue  # this fingerprint waits, with everything queued behind it
                result = self._attempt(row, now)
                counts[result] += 1
                if result == "retried":
                    resting.add(row.target)
                    continue
                queue.popleft()
                if queue:
                    heapq.heappush(heads, (queue[0].order, key))
            for target in self._targets.values():
                if target.kind is TargetKind.alertmanager and target.name not in resting:
                    self._repost(target, now)
        return DeliveryReport(**counts)

    def _repost(self, target: Target, now: datetime) -> None:
        """Post the firing alerts of an Alertmanager target again, every ``repeat_seconds``: it
        takes an alert without ``endsAt`` as resolved once ``resolve_timeout`` passes unheard. One
        request for all of them; a failure waits for the next pass (the next repeat is as good)."""
        last = self._reposted.get(target.name)
        if last is not None and (now - last).total_seconds() < target.repeat_seconds:
            return
        self._reposted[target.name] = now
        rows = self._store.open_triggers([target.name])
        if last is None or not rows:
            return  # the first pass after a start sends what is pending; repeats start a period later
        alerts = [
            _alertmanager_alert(
                _Row(str(t), str(fp), int(ep), NoticeAction.trigger, orjson.loads(payload), now, 0, now), now
            )
            for t, fp, ep, payload in rows
        ]
        headers = {"Content-Type": "application/json", **target.headers}
        answer = _post(
            self._client, target.url, orjson.dumps(alerts, default=str), headers, target.timeout_seconds, now
        )
        if answer.result != "sent":
            log.warning("re-posting %d firing alerts to %s failed: %s", len(alerts), target.name, answer.error)

    def _pending_rows(self) -> list[_Row]:
        rows = self._store.pending_notifications(list(self._targets))
        return [
            _Row(
                str(t),
                str(fp),
                int(ep),
                NoticeAction(action),
                orjson.loads(payload),
                _utc(created),
                int(attempts),
                _utc(due),
            )
            for t, fp, ep, action, payload, created, attempts, due in rows
        ]

    def _attempt(self, row: _Row, now: datetime) -> _Result:
        target = self._targets[row.target]
        what = f"{row.action.value} of {row.fingerprint} (episode {row.episode}) to {target.name}"
        try:
            body, headers = _request(target, row, now)
        except Exception as exc:  # a row that cannot be rendered never will be: do not retry it
            log.exception("cannot build the %s", what)
            answer = _Answer("failed", f"cannot build the request: {type(exc).__name__}: {exc}")
        else:
            answer = _post(self._client, target.url, body, headers, target.timeout_seconds, now)
        attempts = row.attempts + 1
        if answer.result == "sent":
            self._store.notification_sent(row.key, now)
        elif answer.result == "retried" and attempts < target.max_attempts:
            delay = answer.retry_after
            if delay is None:
                delay = _backoff(self._backoff_base, self._backoff_max, attempts, self._rng)
            due = now + timedelta(seconds=delay)
            log.warning(
                "%s failed (attempt %d of %d), retrying at %s: %s",
                what,
                attempts,
                target.max_attempts,
                _rfc3339(due),
                answer.error,
            )
            self._store.notification_retry(row.key, due, answer.error)
        else:
            error = answer.error or "unknown error"
            if answer.result == "retried":
                error = f"gave up after {attempts} attempts: {error}"
            log.warning("%s failed for good: %s", what, error)
            self._store.notification_failed(row.key, error)
            answer = _Answer("failed", error)
        self._results.labels(target.name, answer.result).inc()
        return answer.result


# --- the daily digest -------------------------------------------------------------------------


def send_digest(
    client: httpx.Client,
    url: str,
    alerts: list[dict[str, Any]],
    now: datetime,
    *,
    attempts: int = 4,
    backoff_base: float = 1.0,
    backoff_max: float = 30.0,
    timeout_seconds: float = 10.0,
    sleep: Callable[[float], None] = time.sleep,
    rng: random.Random | None = None,
) -> bool:
    """POST ``{"kind": "digest", "generated_at", "alerts"}`` (the warn alerts of the day) once; True on a 2xx.

    Retried within the call on 429, 5xx, timeouts and connection errors (Retry-After
    honoured, otherwise exponential backoff with jitter), at most ``attempts`` times.
    Never raises for a delivery problem: it logs and returns False. The header
    ``Idempotency-Key: digest:<date>`` lets a receiver drop a repeat of the same day.
    """
    now = _utc(now)
    body = orjson.dumps({"kind": "digest", "generated_at": _rfc3339(now), "alerts": alerts}, default=str)
    headers = {"Content-Type": "application/json", "Idempotency-Key": f"digest:{now.date().isoformat()}"}
    rng = rng or random.Random()
    answer = _Answer("failed", "no attempt made")
    for attempt in range(1, max(1, attempts) + 1):
        answer = _post(client, url, body, headers, timeout_seconds, now)
        if answer.result != "retried":
            break
        if attempt < attempts:
            delay = answer.retry_after
            sleep(delay if delay is not None else _backoff(backoff_base, backoff_max, attempt, rng))
    if answer.result == "sent":
        return True
    log.warning("the daily digest to %s was not delivered: %s", url, answer.error)
    return False
