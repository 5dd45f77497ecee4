"""The sample workspace ``shapewatch up`` loads into an empty database, so a newcomer sees the product work.

It is written through the service's own HTTP API (``POST /v1/outputs``,
``/v1/baselines``, ``/v1/silences``, ``/v1/analyzer/run``), exactly as an
application and a reviewer would, and only when the service holds no event at
all: a database with data is never touched. Everything it creates is labelled:
the contracts are named ``sample-...``, every event carries the attribute
``sample=true``, the baselines are frozen by ``shapewatch sample`` with a note
that says so, and the drifting cohorts are silenced (reason "sample workspace")
so that a configured pager is never called for them.

The story, relative to the current minute:

- three days ago, a four-hour baseline period of every cohort (frozen), on whole hours;
- two days ago, another normal period (a candidate window for the review);
- the last five hours: ``sample-intake`` stops filling ``customer.tier`` in half
  of its outputs (page) and starts answering priority ``URGENT`` (warn);
  ``sample-triage``, on the unpinned alias ``gpt-4o``, is served by a new
  snapshot (warn: ``served_model_change``) that sends ``score`` as a string (page), returns
  longer ``labels`` arrays and fills a new ``rationale`` key (warn); ``sample-invoice`` stays stable;
  an ``intake-v4`` rollout with a little traffic is compared against the
  previous prompt version's baseline;
- every sample contract has a registered version ``1`` (the one the outputs are tagged with), and
  ``sample-intake`` a version ``2`` nobody sends yet, for the Contracts page's diff. The intake
  outputs carry ``customer.email``: free text no page, baseline or review ever shows.

>>> summary = seed_sample("http://127.0.0.1:8000")      # doctest: +SKIP
>>> summary.seeded, summary.events
(True, 4730)
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

__all__ = [
    "SAMPLE_AUTHOR",
    "SAMPLE_COHORTS",
    "SAMPLE_CONTRACTS",
    "SampleCohort",
    "SampleError",
    "SampleSummary",
    "sample_envelopes",
    "seed_sample",
    "stream_demo_traffic",
]

SAMPLE_AUTHOR = "shapewatch sample"
_STEP = timedelta(seconds=30)
_PERIOD = timedelta(hours=4)
_RECENT = timedelta(hours=5)
_BATCH = 1000


class SampleError(Exception):
    """The sample workspace could not be written (the service refused a request or is unreachable)."""

    def __init__(self, what: str, detail: str) -> None:
        super().__init__(f"sample workspace: {what}: {detail}")


@dataclass(frozen=True)
class SampleCohort:
    model: str
    prompt_version: str
    contract: str
    drift: bool  # its last hours drift away from the baseline
    frozen: bool = True  # a baseline of its own is frozen


SAMPLE_COHORTS = (
    SampleCohort("claude-sonnet-4-5-20250929", "intake-v3", "sample-intake", drift=True),
    SampleCohort("gpt-4o", "triage-v2", "sample-triage", drift=True),
    SampleCohort("gemini-2.0-flash-001", "extract-v1", "sample-invoice", drift=False),
    SampleCohort("claude-sonnet-4-5-20250929", "intake-v4", "sample-intake", drift=False, frozen=False),
)

_INTENTS = ("refund", "billing", "shipping", "cancel")
_PRIORITIES = ("low", "medium", "high")
_TIERS = ("gold", "silver", "bronze")
_LABELS = ("bug", "question", "feature", "billing", "outage")
_CURRENCIES = ("EUR", "USD", "GBP")


def _output(contract: str, i: int, drift: bool) -> dict[str, Any]:
    """A deterministic structured output of one sample contract; ``drift`` moves its shape."""
    if contract == "sample-intake":
        out: dict[str, Any] = {
            "intent": _INTENTS[i % 4],
            "priority": _PRIORITIES[i % 3],
            # free text that is personal data: never shown, never kept in a baseline (collector/privacy.py)
            "customer": {"tier": _TIERS[i % 3], "id": f"c-{i % 97}", "email": f"customer{i}@example.com"},
            "tags": ["billing"] * (i % 3),
        }
        if drift:
            if i % 2 == 0:
                del out["customer"]["tier"]
            if i % 10 == 0:
                out["priority"] = "URGENT"
        return out
    if contract == "sample-triage":
        score: float | str = round(0.05 + (i % 19) / 20, 2)
        labels = [_LABELS[(i + j) % 5] for j in range(1 + i % 2)]
        out = {"category": _LABELS[i % 5], "score": score, "labels": labels}
        if drift:
            if i % 3 == 0:
                out["score"] = f"{score:.2f}"  # the new snapshot quotes numbers now and then
            out["labels"] = [_LABELS[(i + j) % 5] for j in range(3 + i % 3)]
            if i % 4 == 0:
                out["rationale"] = "the customer mentions an invoice"
        return out
    return {
        "invoice_number": f"INV-{1000 + i}",
        "total": round(10 + (i % 50) * 3.5, 2),
        "currency": _CURRENCIES[i % 3],
        "lines": [{"sku": f"S{j}", "qty": 1 + j} for j in range(1 + i % 4)],
    }


def _iso(t: datetime) -> str:
    return t.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _periods(now: datetime) -> dict[str, datetime]:
    # The older periods start on the hour: days back, rollups are hour buckets (collector/tiers.py),
    # and a baseline window on whole hours holds exactly its events.
    hour = now.replace(minute=0)
    return {"baseline": hour - timedelta(days=3), "normal": hour - timedelta(days=2), "recent": now - _RECENT}


def sample_envelopes(now: datetime) -> Iterator[dict[str, Any]]:
    """Every envelope of the sample workspace, for a workspace whose present is ``now``."""
    p = _periods(now)
    for c in SAMPLE_COHORTS:
        served_before = "gpt-4o-2024-08-06" if c.model == "gpt-4o" else c.model
        served_now = "gpt-4o-2024-11-20" if c.model == "gpt-4o" else c.model
        spans: list[tuple[datetime, int, bool, str]] = []
        if c.frozen:
            n = int(_PERIOD / _STEP)
            spans += [(p["baseline"], n, False, served_before), (p["normal"], n, False, served_before)]
            spans.append((p["recent"], int(_RECENT / _STEP), c.drift, served_now))
        else:
            spans.append((now - timedelta(hours=2), 50, False, served_now))
        for start, n, drift, served in spans:
            for i in range(n):
                yield {
                    "event_id": f"sample-{uuid.uuid4().hex}",
                    "ts": _iso(start + i * _STEP),
                    "model": c.model,
                    "served_model": served,
                    "prompt_version": c.prompt_version,
                    "contract": c.contract,
                    "contract_version": "1",
                    "source": "production",
                    "attributes": {"sample": "true"},
                    "output": _output(c.contract, i, drift),
                }


@dataclass(frozen=True)
class SampleSummary:
    seeded: bool  # False: the service already held events, nothing was written
    events: int = 0
    baselines: tuple[str, ...] = ()
    alerts: int = 0


def _check(r: httpx.Response, what: str, *ok: int) -> Any:
    if r.status_code not in (ok or (200,)):
        try:
            detail = r.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            detail = r.text[:300]
        raise SampleError(what, f"the service answered {r.status_code}: {detail}")
    return r.json()


def seed_sample(
    url: str, *, token: str | None = None, now: datetime | None = None, silence: bool = True, timeout: float = 60.0
) -> SampleSummary:
    """Write the sample workspace through the service at ``url``, unless it already holds any event.

    ``silence=False`` leaves the drifting cohorts unsilenced (tests of silencing).
    """
    now = (now or datetime.now(UTC)).replace(second=0, microsecond=0)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=timeout) as c:
            return _seed(c, now, silence)
    except httpx.HTTPError as exc:
        raise SampleError("cannot reach the service", f"{type(exc).__name__}: {exc}") from exc


def _schema(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required}


_S = {"type": "string"}
_INTAKE_V1 = _schema(
    {
        "intent": _S,
        "priority": _S,
        "customer": {"type": "object", "properties": {"tier": _S, "id": _S, "email": _S}},
        "tags": {"type": "array", "items": _S},
    },
    ["intent", "priority"],
)
# Version 2: a new optional field, an address format, and the customer now required (breaking).
_INTAKE_V2 = _schema(
    {
        "intent": _S,
        "priority": {**_S, "description": "how soon a human must answer"},
        "customer": {
            "type": "object",
            "properties": {"tier": _S, "id": _S, "email": {**_S, "format": "email"}},
        },
        "tags": {"type": "array", "items": _S},
        "channel": {"type": "string", "enum": ["mail", "chat", "phone"]},
    },
    ["intent", "priority", "customer"],
)
SAMPLE_CONTRACTS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("sample-intake", "1", _INTAKE_V1),
    ("sample-intake", "2", _INTAKE_V2),
    (
        "sample-triage",
        "1",
        _schema(
            {"category": _S, "score": {"type": ["number", "string"]}, "labels": {"type": "array", "items": _S}},
            ["category"],
        ),
    ),
    (
        "sample-invoice",
        "1",
        _schema(
            {"invoice_number": _S, "total": {"type": "number"}, "currency": _S, "lines": {"type": "array"}},
            ["invoice_number", "total"],
        ),
    ),
)


def _seed(c: httpx.Client, now: datetime, silence: bool) -> SampleSummary:
    if _check(c.get("/v1/cohorts"), "listing cohorts"):
        return SampleSummary(False)
    for contract, version, document in SAMPLE_CONTRACTS:  # before the outputs, so they are checked
        _check(
            c.post(
                "/v1/contracts",
                json={"contract": contract, "version": version, "document": document, "author": SAMPLE_AUTHOR},
            ),
            "registering a sample contract",
            200,
            201,
        )
    batch: list[dict[str, Any]] = []
    events = 0
    for env in sample_envelopes(now):
        batch.append(env)
        if len(batch) == _BATCH:
            events += _post(c, batch)
            batch = []
    if batch:
        events += _post(c, batch)
    p = _periods(now)
    frozen = []
    for cohort in SAMPLE_COHORTS:
        if not cohort.frozen:
            continue
        body = {
            "model": cohort.model,
            "prompt_version": cohort.prompt_version,
            "contract": cohort.contract,
            "since": _iso(p["baseline"]),
            "until": _iso(p["baseline"] + _PERIOD),
            "author": SAMPLE_AUTHOR,
            "note": "sample workspace: the reference period of a demo cohort (shapewatch up seeded it)",
        }
        frozen.append(_check(c.post("/v1/baselines", json=body), "freezing a baseline", 201)["baseline_id"])
    for contract in sorted({x.contract for x in SAMPLE_COHORTS if x.drift and silence}):
        # Silenced, not hidden: the alerts show and resolve as usual, but no pager hears of them
        # (for the longest silence the service takes, 90 days).
        _check(
            c.post(
                "/v1/silences",
                json={
                    "duration": "90d",
                    "author": SAMPLE_AUTHOR,
                    "contract": contract,
                    "reason": "sample workspace: demo data, never paged",
                },
            ),
            "silencing the sample alerts",
            201,
        )
    for _ in range(2):  # a page breach fires on its second evaluation in a row
        _check(c.post("/v1/analyzer/run"), "running the analyzer")
    alerts = _check(c.get("/v1/alerts", params={"state": "open"}), "listing alerts")
    return SampleSummary(True, events, tuple(frozen), len(alerts))


def _post(c: httpx.Client, batch: list[dict[str, Any]]) -> int:
    body = _check(c.post("/v1/outputs", json=batch), "storing events")
    if body["rejected"]:
        first = next(r for r in body["results"] if r["status"] == "rejected")
        raise SampleError("storing events", f"{body['rejected']} rejected, e.g. {first}")
    return int(body["accepted"])


def stream_demo_traffic(
    url: str,
    *,
    token: str | None = None,
    rate: float = 20.0,
    drift: bool = False,
    duration: float | None = None,
    batch_seconds: float = 1.0,
    clock: Any = None,
    sleep: Any = None,
    on_batch: Any = None,
) -> int:
    """Send live synthetic traffic of the sample cohorts to ``url`` at ``rate`` events/s; returns events sent.

    With ``drift`` the sample cohorts that drift in the sample workspace drift now, so an evaluation
    over the last minutes shows them. Runs for ``duration`` seconds, or until interrupted. Every event
    is labelled like the sample workspace (``attributes.sample = "true"``; ``source`` is "probe").
    """
    import time as _time

    clock = clock or _time.monotonic
    sleep = sleep or _time.sleep
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    live = list(SAMPLE_COHORTS)
    sent = i = 0
    started = clock()
    with httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=30.0) as client:
        while duration is None or clock() - started < duration:
            tick = clock()
            now = datetime.now(UTC)
            n = max(1, round(rate * batch_seconds))
            batch = []
            for _ in range(n):
                c = live[i % len(live)]
                served = "gpt-4o-2024-11-20" if c.model == "gpt-4o" else c.model
                batch.append(
                    {
                        "event_id": f"demo-{uuid.uuid4().hex}",
                        "ts": _iso(now),
                        "model": c.model,
                        "served_model": served,
                        "prompt_version": c.prompt_version,
                        "contract": c.contract,
                        "contract_version": "1",
                        "source": "probe",
                        "attributes": {"sample": "true"},
                        "output": _output(c.contract, i, drift and c.drift),
                    }
                )
                i += 1
            try:
                sent += _post(client, batch)
            except httpx.HTTPError as exc:
                raise SampleError("cannot reach the service", f"{type(exc).__name__}: {exc}") from exc
            if on_batch is not None:
                on_batch(sent)
            sleep(max(0.0, batch_seconds - (clock() - tick)))
    return sent
